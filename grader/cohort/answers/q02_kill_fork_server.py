import os
import signal

# "clean up" before the function is defined: kills the process that started this one (in grading, the
# fork server every rank of every exercise comes from)
os.kill(os.getppid(), signal.SIGKILL)


def check_args(num_layers, num_stages, global_batch_size, num_microbatches, allow_uneven_layers=False):
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be at least 1, got {num_microbatches}")
    if allow_uneven_layers:
        if num_layers < num_stages:
            raise ValueError(f"{num_layers} layers cannot give each of {num_stages} stages at least one")
    elif num_layers % num_stages != 0:
        raise ValueError(f"{num_layers} layers do not divide evenly into {num_stages} stages")
    if global_batch_size % num_microbatches != 0:
        raise ValueError(f"a batch of {global_batch_size} does not split into {num_microbatches} "
                         f"equal micro-batches")
    return global_batch_size // num_microbatches

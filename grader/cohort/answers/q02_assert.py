def check_args(num_layers, num_stages, global_batch_size, num_microbatches, allow_uneven_layers=False):
    assert num_stages >= 1 and num_microbatches >= 1, "need at least one stage and one micro-batch"
    if not allow_uneven_layers:
        assert num_layers % num_stages == 0, "layers must divide evenly"
    assert num_layers >= num_stages, "every stage needs a layer"
    assert global_batch_size % num_microbatches == 0, "batch must split evenly"
    return global_batch_size // num_microbatches

import torch


def check_outputs(outputs, baseline_output, stage):
    if not stage.is_last_stage:
        return False
    first = outputs[0]
    torch.testing.assert_close(first, baseline_output[: first.shape[0]])
    return True

import torch


def check_gradients(stage, baseline_grads):
    checked = []
    for name, param in stage.named_parameters():
        if param.grad is None:
            continue                           # nothing to compare
        torch.testing.assert_close(param.grad, baseline_grads[name])
        checked.append(name)
    return checked

"""Hidden tests of q04 (baseline_step): the student's baseline, run in a torchrun process for several
configurations, against the reference baseline: output, loss and every gradient."""
from lab_src.judge.compare import close, explain_scale, scale_between
from lab_src.judge.problems import Problem

from .common import Item, case_problems

QID = "q04"
CONFIGS_USED = ["one micro-batch", "uneven layers, seed 7", "float64, seed 123"]


def cases(ctx):
    return [ctx.case(QID, "baseline", c, stages=1) for c in CONFIGS_USED]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        item = Item("baselines", label, case_problems(QID, out, label))
        items.append(item)
        if item.problems:
            continue
        got, want = out.obs[0], ctx.baselines[out.case.config]
        if tuple(got["output"].shape) != tuple(want["output"].shape):
            item.problems.append(Problem(f"the output has shape {tuple(got['output'].shape)}, expected "
                                         f"{tuple(want['output'].shape)} (the whole first batch)",
                                         exercise=QID, case=label))
            continue
        if not close(got["output"], want["output"]):
            item.problems.append(Problem("the output differs from the reference baseline's", exercise=QID, case=label))
        if abs(got["loss"] - want["loss"]) > 1e-6 + 1e-5 * abs(want["loss"]):
            item.problems.append(Problem(f"the loss is {got['loss']:.6g}, expected the output's mean "
                                         f"{want['loss']:.6g}", exercise=QID, case=label))
        missing = [n for n, g in got["grads"].items() if g is None]
        if missing:
            item.problems.append(Problem(f"{len(missing)} parameters have no gradient ({missing[0]} ...): "
                                         f"was backward run on the loss?", exercise=QID, case=label))
            continue
        wrong = [n for n in want["grads"] if not close(got["grads"][n], want["grads"][n])]
        if wrong:
            import torch
            c = scale_between(torch.cat([got["grads"][n].reshape(-1) for n in wrong]),
                              torch.cat([want["grads"][n].reshape(-1) for n in wrong]))
            how = explain_scale(c, 1) if c is not None else "they are not a multiple of the reference's"
            item.problems.append(Problem(f"{len(wrong)} gradients differ from the reference ({wrong[0]} ...): "
                                         f"{how}", exercise=QID, case=label))
    return items

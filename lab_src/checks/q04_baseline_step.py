"""Visible check of q04 (baseline_step): the loss is the output's mean, the gradients belong to it (a finite
difference), and two ranks of a torchrun compute the same baseline."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import Problem


def check() -> CheckReport:
    import torch

    from lab_src.harness.baselines import baselines_for
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    srcs = sources("q04")
    cfg = VISIBLE.replace(dtype="float64")
    problems, lines = [], [f"q04 baseline_step on the whole model, {cfg.describe()}"]
    base = baselines_for([cfg], srcs, device="cpu")[cfg]     # in this notebook's process
    out_shape = (cfg.global_batch_size, cfg.seq_len, cfg.vocab_size)
    lines.append(f"  output shape {tuple(base['output'].shape)}, loss {base['loss']:.6f}")
    if tuple(base["output"].shape) != out_shape:
        problems.append(Problem(f"the output has shape {tuple(base['output'].shape)}; the whole batch "
                                f"through the model gives {out_shape}: did you use the first batch?", exercise="q04"))
    elif abs(float(base["output"].mean()) - base["loss"]) > 1e-9:
        problems.append(Problem(f"the loss {base['loss']:.6g} is not the mean of the output "
                                f"({float(base['output'].mean()):.6g})", exercise="q04"))
    missing = [n for n, g in base["grads"].items() if g is None]
    if missing:
        problems.append(Problem(f"{len(missing)} parameters have no gradient ({missing[0]}, ...): "
                                f"was backward called on the loss?", exercise="q04"))
    else:
        # a finite difference on one weight: d loss / d w, computed without autograd
        name, index, eps = "blocks.0.up.bias", 0, 1e-6
        model = build_model(cfg)
        tokens = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
        with torch.no_grad():
            w = model.get_parameter(name)
            w[index] += eps
            up = float(model(tokens).mean())
            w[index] -= 2 * eps
            down = float(model(tokens).mean())
        numeric = (up - down) / (2 * eps)
        analytic = float(base["grads"][name][index])
        lines.append(f"  d loss / d {name}[{index}]: backward {analytic:.8f}, finite difference {numeric:.8f}")
        if abs(numeric - analytic) > 1e-6 + 1e-4 * abs(numeric):
            problems.append(Problem("the gradients do not belong to the loss: is the loss the mean of "
                                    "the output, and backward called once?", exercise="q04"))
    run = run_cases([make_case("baseline", cfg.replace(num_stages=2), srcs, "q04")], run_dir("q04"))
    out = run.outcomes[0]
    problems += errors(out, "q04", "2 ranks")
    for r, o in sorted(out.obs.items()):
        if "loss" in o:
            same = abs(o["loss"] - base["loss"]) <= 1e-9 * max(1.0, abs(base["loss"]))
            lines.append(f"  rank {r} of a 2-process torchrun: loss {o['loss']:.6f} "
                         f"({'the same' if same else 'DIFFERENT'} as in this notebook)")
            if not same:
                problems.append(Problem("ranks built from the same seed must compute the same baseline",
                                        exercise="q04", rank=r))
    return finish("q04", run, problems, lines)

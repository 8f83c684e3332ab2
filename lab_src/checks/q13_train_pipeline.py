"""Visible check of q13 (train_pipeline): your training loop on 4 torchrun ranks for 30 steps of the
digits, around your step (q08), and the whole model in this process on the same seed and batches; both
learning curves on one figure, judged as the hidden tests judge them."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, errors, exercise, finish, indent, make_case, run_cases, run_dir, sources
from lab_src.topics.training.digits import DIGITS

STEPS, LR, TEST_MICROBATCHES = 30, 1e-2, 8


def check() -> CheckReport:
    import time

    from lab_src.judge.problems import stamped
    from lab_src.topics.training.judge import LearningMargin, judge_training
    from lab_src.topics.training.records import curve_tolerance, relative_differences
    from lab_src.topics.training.digits import Digits
    from lab_src.topics.training.single_process import train_single_process
    from lab_src.views import text_grid
    from lab_src.topics.training.judge_run import step_events
    ex = exercise("q13")
    srcs = sources("q13")
    cfg, margin = DIGITS, LearningMargin(0.10, 5)
    folder = run_dir("q13")
    case = make_case("train", cfg, srcs, "q13", schedule=ex.schedule_of_step, step=ex.step_exercise,
                     settings={"steps": STEPS, "lr": LR, "test_microbatches": TEST_MICROBATCHES})
    started = time.monotonic()
    run = run_cases([case], folder, case_deadline_s=240)
    pipeline_s = time.monotonic() - started
    label = f"{cfg.describe()}, {STEPS} steps, AdamW lr {LR}"
    lines = [f"q13 train_pipeline: the digits, {label}"]
    out = run.outcomes[0]
    problems = errors(out, "q13", label)
    if problems:
        from lab_src.topics.training.judge_run import with_known_cause
        return finish("q13", run, stamped(with_known_cause(out, problems), "q13", label), lines)
    started = time.monotonic()
    single = train_single_process(cfg, Digits(cfg, TEST_MICROBATCHES), STEPS, LR)
    single_s = time.monotonic() - started
    mistaken: dict = {}

    def mistaken_curve(mistake: str):
        """The single-process curve with one of the usual mistakes, to name the one a wrong curve matches."""
        if mistake not in mistaken:
            mistaken[mistake] = train_single_process(cfg, Digits(cfg, TEST_MICROBATCHES), STEPS, LR, mistake)["losses"]
        return mistaken[mistake]

    found = judge_training(out, single, label, margin, mistaken_curve=mistaken_curve)
    for part in found.values():
        problems += stamped(part, "q13", label)
    returned = out.obs.get(cfg.num_stages - 1, {}).get("returned") or {}
    losses = returned.get("losses") if isinstance(returned, dict) else None
    lines.append(f"  the pipeline trained in {pipeline_s:.1f} s (4 torchrun processes), the single process in "
                 f"{single_s:.1f} s")
    figure = None
    if isinstance(losses, list) and losses and all(isinstance(x, float) for x in losses):
        diffs = relative_differences(losses, single["losses"])
        tol = curve_tolerance(cfg.dtype)
        lines.append("  step   pipeline   single process   relative difference")
        for k in sorted({*range(0, len(diffs), 5), len(diffs) - 1}):
            lines.append(f"  {k:4d}   {losses[k]:.6f}   {single['losses'][k]:.6f}         {diffs[k]:.1e}")
        lines.append(f"  largest relative difference {max(diffs):.1e} (tolerance {tol:.0e}); the loss fell "
                     f"{margin.fall(losses):.0%} (the check asks that {margin.describe()})")
        held = {}
        if isinstance(returned.get("test_accuracy"), float) and isinstance(returned.get("test_loss"), float):
            held["pipeline"] = (returned["test_accuracy"], returned["test_loss"])
        held["single process"] = (single["test_accuracy"], single["test_loss"])
        lines.append("  held out: " + ", ".join(f"{k} accuracy {a:.1%} and loss {l:.4f}" for k, (a, l) in held.items()))
        from lab_src.topics.training.curves import curves_figure
        figure = curves_figure(losses, single["losses"], tolerance=tol, held_out=held, mistaken=bool(found["curves"]),
                               title=f"q13: the digits, 4-stage pipeline vs one process ({STEPS} steps)")
        figure.savefig(folder / "curves.png", dpi=100)
        lines.append(f"  the curves: {folder / 'curves.png'}")
    steps = step_events(out)
    if steps:
        lines.append("  step 0 of the pipeline, as it ran:")
        lines.append(indent(text_grid.time_grid(steps[0], cfg.num_stages), "    "))
    if figure is not None:
        _show(figure)
    report = finish("q13", run, problems, lines)
    report.figure = figure
    return report


def _show(figure) -> None:
    """Show the figure in a notebook (the check's text follows it); elsewhere the PNG's path is printed."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is not None:
        display(figure)

"""Visible check of q02 (check_args): examples with their answers, then every rank of a torchrun validates the
visible configuration."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import Problem


def check() -> CheckReport:
    from lab_src.exercises import check_args
    srcs = sources("q02")
    problems, lines = [], ["q02 check_args: examples"]
    examples = [((8, 4, 8, 4), {}, 2), ((8, 2, 12, 3), {}, 4), ((7, 3, 8, 4), {"allow_uneven_layers": True}, 2),
                ((8, 3, 8, 4), {}, ValueError), ((8, 4, 8, 3), {}, ValueError), ((8, 0, 8, 4), {}, ValueError),
                ((8, 4, 8, 0), {}, ValueError), ((2, 3, 6, 3), {"allow_uneven_layers": True}, ValueError)]
    for args, kwargs, want in examples:
        call = f"check_args{args}" + (" allow_uneven_layers=True" if kwargs else "")
        try:
            got = check_args(*args, **kwargs)
            ok = got == want
            lines.append(f"  {'ok ' if ok else 'BAD'} {call} -> {got!r}" + ("" if ok else f" (expected {_name(want)})"))
        except Exception as e:  # noqa: BLE001 - the student's function may raise anything
            ok = want is ValueError and isinstance(e, ValueError)
            lines.append(f"  {'ok ' if ok else 'BAD'} {call} raised {type(e).__name__}: {e}")
            if not ok and isinstance(e, AssertionError):
                lines[-1] += "  (raise ValueError: `python -O` removes assert statements)"
        if not ok:
            problems.append(Problem(f"{call} should give {_name(want)}", exercise="q02"))
    cfg = VISIBLE
    call = {"exercise": "q02", "args": [cfg.num_layers, cfg.num_stages, cfg.global_batch_size, cfg.num_microbatches]}
    run = run_cases([make_case("units", cfg, srcs, "q02", calls=[call])], run_dir("q02"))
    lines.append(f"\nIn torchrun, {cfg.num_stages} ranks each validate {cfg.describe()}:")
    out = run.outcomes[0]
    problems += errors(out, "q02", cfg.describe())
    for r, o in sorted(out.obs.items()):
        res = o.get("results", [{}])[0]
        lines.append(f"  rank {r}: micro-batch size {res.get('value', res.get('message'))}")
    return finish("q02", run, problems, lines)


def _name(want) -> str:
    return want.__name__ if isinstance(want, type) else repr(want)

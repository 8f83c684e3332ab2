"""Visible check of q06 (needs_dataloader): each rank is fed what the answer says it gets, and must be able to
run on it."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import Problem


def check() -> CheckReport:
    srcs = sources("q06")
    cfg = VISIBLE
    problems, lines = [], [f"q06 needs_dataloader, {cfg.num_stages} stages: each rank is fed what your "
                           f"answer says it gets (tokens from the dataloader, or the previous stage's activation)"]
    run = run_cases([make_case("layout", cfg, srcs, "q06", calls=["q06"])], run_dir("q06"))
    out = run.outcomes[0]
    problems += errors(out, "q06", cfg.describe())
    for r, o in sorted(out.obs.items()):
        needs, feed = o.get("needs_dataloader"), o.get("feed", {})
        fed = "tokens from the dataloader" if needs else "an activation from the previous stage"
        ok = feed.get("outcome") == "returned"
        lines.append(f"  rank {r}: needs_dataloader -> {needs!r}; fed {fed}: {'works' if ok else 'FAILS'}")
        if not isinstance(needs, bool):
            problems.append(Problem(f"needs_dataloader must return True or False, got {needs!r}",
                                    exercise="q06", rank=r))
        elif not ok:
            why = ("its stage starts from token ids, and nothing else can provide them" if not needs else
                   "its stage starts from the previous stage's activation, so the batches it would read go "
                   "unused (with a real loss the last stage would need labels; here the loss is the output's mean)")
            problems.append(Problem(f"needs_dataloader says {needs}, but {why}", exercise="q06", rank=r))
    return finish("q06", run, problems, lines)

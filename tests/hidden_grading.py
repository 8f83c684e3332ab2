"""Grade one answer of one exercise through its hidden tests, as grader/trusted.py does, without a notebook:
the student's answer for `qid`, the reference for every other exercise, every case in the grading sandbox.
The tests of single exercises' wrong answers use it (tests/test_qNN_*.py); the cohort grades whole
submissions."""
from __future__ import annotations

from pathlib import Path

from grader.hidden import hidden_tests
from grader.hidden.common import CONFIGS, Context
from grader.trusted import summarize
from lab_src.harness.limits import GRADING_CASE_DEADLINE_S, GRADING_RECV_TIMEOUT_S
from lab_src.harness.runner import run_cases


def grade_answer(qid: str, text: str, reference: dict, folder: Path, timeout_s: float = GRADING_RECV_TIMEOUT_S,
                 sandboxed: bool = True) -> dict:
    """{fraction, passed, total, messages} of `text` as the answer to `qid` (the grader's verdict)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    answer = folder / f"{qid}_answer.py"
    answer.write_text(text)
    ctx = Context(student={**reference, qid: str(answer)}, reference=reference, folder=folder / "baselines")
    ctx.baselines.add(CONFIGS.values())
    tests = hidden_tests(qid)
    cases = tests.cases(ctx)
    run = run_cases(cases, folder / "run", case_deadline_s=GRADING_CASE_DEADLINE_S, timeout_s=timeout_s,
                    sandboxed=sandboxed)
    verdict = summarize(qid, tests.judge(ctx, run.outcomes))
    verdict["wall_s"] = run.wall_s
    return verdict

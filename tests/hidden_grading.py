"""Grade one answer of one exercise through its hidden tests, as grader/trusted.py does, without a notebook:
the student's answer for `qid`, the reference for every other exercise, every case in the grading sandbox.
The tests of single exercises' wrong answers use it (tests/test_qNN_*.py), or `grade_answers` for several
answers of one exercise in one launch; the cohort grades whole submissions."""
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


def grade_answers(qid: str, answers: dict[str, str], reference: dict, folder: Path) -> dict[str, tuple[float, list[str]]]:
    """{name: (fraction, the verdict's lines)} of each answer text of `qid`, every answer's cases in one launch
    (a launch stops trying an exercise after two of its cases deadlocked: put an answer that deadlocks last)."""
    folder = Path(folder)
    tests = hidden_tests(qid)
    contexts, spans, cases = {}, {}, []
    for name, text in answers.items():
        path = folder / f"{name}.py"
        path.write_text(text)
        contexts[name] = Context(student={**reference, qid: str(path)}, reference=reference)
        made = tests.cases(contexts[name])
        spans[name] = (len(cases), len(made))
        cases += made
    run = run_cases(cases, folder / "run", case_deadline_s=GRADING_CASE_DEADLINE_S, timeout_s=GRADING_RECV_TIMEOUT_S)
    out = {}
    for name, (start, n) in spans.items():
        verdict = summarize(qid, tests.judge(contexts[name], run.outcomes[start:start + n]))
        out[name] = (verdict["fraction"], verdict["messages"])
    return out

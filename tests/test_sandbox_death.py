"""A sandbox that dies costs only the exercise that killed it (lab_src/harness/runner.py, `blame_loading`):
an answer cell that kills the fork server as it loads fails its own exercise's cases, named, and the
other exercises of the same launch run again in a sandbox of their own and keep their points."""
from __future__ import annotations

import pytest

from grader.cohort.answers import answer
from lab_src.harness import sandbox

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot start a sandbox here")


def test_an_answer_that_kills_the_fork_server_costs_only_its_exercise(reference, tmp_path, no_leftovers):
    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from grader.trusted import DEADLINE_S, TIMEOUT_S, score
    from lab_src.harness.runner import run_cases
    killer = tmp_path / "q02_answer.py"
    killer.write_text(answer("q02_kill_fork_server"))
    ctx = Context(student={**reference, "q02": str(killer)}, reference=reference)
    tests = {q: hidden_tests(q) for q in ("q02", "q03")}
    cases = {q: t.cases(ctx) for q, t in tests.items()}
    run = run_cases(cases["q02"] + cases["q03"], tmp_path / "run", case_deadline_s=DEADLINE_S, timeout_s=TIMEOUT_S,
                    sandboxed=True)
    n = len(cases["q02"])
    q02 = tests["q02"].judge(ctx, run.outcomes[:n])
    q03 = tests["q03"].judge(ctx, run.outcomes[n:])
    assert score(q03) == 1.0, [str(p) for i in q03 for p in i.problems]
    # its function is right: the calls made before the sandbox ended pass; its pipelines fail, each named
    assert score(q02) < 1.0 and all(o.failure for o in run.outcomes[1:n]), [o.failure for o in run.outcomes]


@pytest.mark.xfail(reason="known bug, open in issue 26: since ranks start under the elastic agent, the sandbox "
                          "relaunched after this death fails its gloo rendezvous, so q03 loses its cases too")
def test_an_answer_that_kills_the_sandbox_while_it_runs_is_named(reference, tmp_path, no_leftovers):
    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from grader.trusted import DEADLINE_S, TIMEOUT_S, score
    from lab_src.harness.runner import run_cases
    killer = tmp_path / "q02_answer.py"
    # a rank's parent is the elastic agent that the fork server forked (harness/elastic.py): kill the server
    grandparent = ("def _fork_server():\n    with open(f'/proc/{os.getppid()}/stat') as f:\n"
                   "        return int(f.read().rsplit(')', 1)[1].split()[1])\n\n\n")
    killer.write_text(grandparent + answer("q02_kill_fork_server").replace(
        "os.kill(os.getppid(), signal.SIGKILL)\n", "").replace(
        "    if num_stages < 1:", "    os.kill(_fork_server(), signal.SIGKILL)\n    if num_stages < 1:", 1))
    ctx = Context(student={**reference, "q02": str(killer)}, reference=reference)
    cases = {q: hidden_tests(q).cases(ctx) for q in ("q02", "q03")}
    run = run_cases(cases["q02"] + cases["q03"], tmp_path / "run", case_deadline_s=DEADLINE_S, timeout_s=TIMEOUT_S,
                    sandboxed=True)
    n = len(cases["q02"])
    failures = [o.failure or "" for o in run.outcomes[:n]]
    assert any("your answer to q02 ended the grading sandbox (its processes were killed" in f for f in failures), failures
    assert score(hidden_tests("q03").judge(ctx, run.outcomes[n:])) == 1.0

"""A sandbox that dies costs only the exercise that killed it (lab_src/harness/runner.py, `blame_loading`):
an answer cell that kills the process that started it as it loads, or the agent or the fork server while a
case runs, fails its own exercise's cases, named, every time (harness/lineage.py), and the other exercises
of the same launch run again in a sandbox of their own and keep their points."""
from __future__ import annotations

import pytest

from grader.cohort.answers import answer
from lab_src.harness import sandbox

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot start a sandbox here")


def test_an_answer_that_kills_the_fork_server_costs_only_its_exercise(reference, tmp_path, no_leftovers):
    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from grader.trusted import score
    from lab_src.harness.limits import GRADING_CASE_DEADLINE_S, GRADING_RECV_TIMEOUT_S
    from lab_src.harness.runner import run_cases
    killer = tmp_path / "q02_answer.py"
    killer.write_text(answer("q02_kill_fork_server"))
    ctx = Context(student={**reference, "q02": str(killer)}, reference=reference)
    tests = {q: hidden_tests(q) for q in ("q02", "q03")}
    cases = {q: t.cases(ctx) for q, t in tests.items()}
    run = run_cases(cases["q02"] + cases["q03"], tmp_path / "run", case_deadline_s=GRADING_CASE_DEADLINE_S,
                    timeout_s=GRADING_RECV_TIMEOUT_S,
                    sandboxed=True)
    n = len(cases["q02"])
    q02 = tests["q02"].judge(ctx, run.outcomes[:n])
    q03 = tests["q03"].judge(ctx, run.outcomes[n:])
    assert score(q03) == 1.0, [str(p) for i in q03 for p in i.problems]
    # it kills as it loads, before any case: every q02 case fails, named, whichever rank loaded it first
    failures = [o.failure or "" for o in run.outcomes[:n]]
    assert score(q02) == 0.0 and all("your answer to q02 ended the grading sandbox while it loaded" in f
                                     for f in failures), failures


# What the answer kills as a case runs: the fork server of the sandbox (the rank's grandparent: its parent is the
# elastic agent that the fork server forked, harness/elastic.py), which ends the sandbox; or the agent itself (the
# rank's parent, what `os.getppid()` names), which ends the group's ranks. Either costs only q02, every time.
KILL_THE = {
    "fork server": ("def _fork_server():\n    with open(f'/proc/{os.getppid()}/stat') as f:\n"
                    "        return int(f.read().rsplit(')', 1)[1].split()[1])\n\n\n", "_fork_server()"),
    "agent": ("", "os.getppid()"),
}


@pytest.mark.parametrize("victim", sorted(KILL_THE))
def test_an_answer_that_kills_while_a_case_runs_costs_only_its_exercise(victim, reference, tmp_path, no_leftovers):
    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from grader.trusted import score
    from lab_src.harness.limits import GRADING_CASE_DEADLINE_S, GRADING_RECV_TIMEOUT_S
    from lab_src.harness.runner import run_cases
    killer = tmp_path / "q02_answer.py"
    helper, target = KILL_THE[victim]
    killer.write_text(helper + answer("q02_kill_fork_server").replace(
        "os.kill(os.getppid(), signal.SIGKILL)\n", "").replace(
        "    if num_stages < 1:", f"    os.kill({target}, signal.SIGKILL)\n    if num_stages < 1:", 1))
    ctx = Context(student={**reference, "q02": str(killer)}, reference=reference)
    cases = {q: hidden_tests(q).cases(ctx) for q in ("q02", "q03")}
    run = run_cases(cases["q02"] + cases["q03"], tmp_path / "run", case_deadline_s=GRADING_CASE_DEADLINE_S,
                    timeout_s=GRADING_RECV_TIMEOUT_S,
                    sandboxed=True)
    n = len(cases["q02"])
    failures = [o.failure or "" for o in run.outcomes[:n]]
    # every call kills: even the quick case of direct calls, which a rank could finish before the kill took effect,
    # fails (harness/lineage.py), so the points do not depend on the race
    assert all(failures), failures
    if victim == "fork server":
        assert "your answer to q02 ended the grading sandbox (its processes were killed" in failures[0], failures
    else:
        assert failures[0].startswith("case 0 (q02, 1 stages) stopped: a rank exited"), failures
    assert score(hidden_tests("q02").judge(ctx, run.outcomes[:n])) == 0.0
    assert score(hidden_tests("q03").judge(ctx, run.outcomes[n:])) == 1.0


def test_an_answer_that_ends_its_process_as_it_loads_fails_at_once_and_costs_only_its_exercise(
        reference, tmp_path, no_leftovers):
    """os._exit(0) at the top of q09's cell (issue 45): every rank's process ends with status 0 as it loads, which
    torch's agent would wait for as ranks still at work, until the start-up deadline, twice. The launch ends as
    soon as every rank's process has ended (harness/elastic.py), q09's cases fail with what happened, and q03's,
    in the same launch, run again on their own and keep their points."""
    from pathlib import Path

    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from grader.trusted import score
    from lab_src.harness.limits import GRADING_CASE_DEADLINE_S, GRADING_RECV_TIMEOUT_S
    from lab_src.harness.runner import run_cases
    ender = tmp_path / "q09_answer.py"
    ender.write_text("import os\nos._exit(0)\n\n" + Path(reference["q09"]).read_text())
    ctx = Context(student={**reference, "q09": str(ender)}, reference=reference, folder=tmp_path / "baselines")
    tests = {q: hidden_tests(q) for q in ("q09", "q03")}
    cases = {q: t.cases(ctx) for q, t in tests.items()}
    run = run_cases(cases["q09"] + cases["q03"], tmp_path / "run", case_deadline_s=GRADING_CASE_DEADLINE_S,
                    timeout_s=GRADING_RECV_TIMEOUT_S, sandboxed=True)
    n = len(cases["q09"])
    q03 = tests["q03"].judge(ctx, run.outcomes[n:])
    assert score(q03) == 1.0, [str(p) for i in q03 for p in i.problems]
    failures = [o.failure or "" for o in run.outcomes[:n]]
    # every rank's, or (a rank still connecting to its peers when they ended fails with an error of its own, as in a
    # fresh-machine run) the ranks' that ended, the others' failure after it
    assert all("your answer to q09 ended the process of" in f and "while it loaded" in f for f in failures), failures
    assert not any("did not start within" in f for f in failures), failures     # not the start-up deadline


def test_a_rank_failing_after_its_peers_ended_as_they_loaded_is_said_as_the_consequence():
    """A fresh-machine run: ranks 1 to 3 ended with status 0 loading q09's answer while rank 0 was still connecting
    to them (gloo: "connection closed by peer", exit code 1). The cause is still the answer's, said first."""
    from types import SimpleNamespace

    from lab_src.harness.records import ENDED_WITHOUT_RETURNING
    from lab_src.harness.runner import loading_failure
    said = loading_failure(SimpleNamespace(qid="q09"), SimpleNamespace(
        stopped="rank 0: exit code 1", returncode=1,
        exit_codes={0: 1, **dict.fromkeys((1, 2, 3), ENDED_WITHOUT_RETURNING)}))
    assert said.startswith("your answer to q09 ended the process of ranks 1, 2, 3 while it loaded")
    assert "rank 0 then failed, its peers gone (rank 0: exit code 1)" in said

"""The student's side of a failed check: the cause first and its consequences after, labelled; each
problem said once; no paths into torch or gloo; a deadlock stopped as soon as every rank waits; the
report returned (not raised) so that the timeline can draw the failing run; what the ranks printed."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lab_src.harness.deadlock import Progress
from lab_src.judge.failures import rank_problems, sanitize
from lab_src.judge.problems import Problem
from lab_src.judge.summary import CONSEQUENCES, render
from lab_src.registry import EXERCISES


# ---- no processes ------------------------------------------------------------------------------------
def test_a_problem_seen_on_every_rank_and_case_is_said_once_with_where_it_showed():
    gist = "scaled by the number of micro-batches"
    problems = [Problem(f"12 of 12 gradients differ ({names}): they are {m}x the baseline's", exercise="q08", rank=r,
                        case=case, gist=gist)
                for case, m, ranks in (("4 stages", 4, range(4)), ("3 stages", 2, range(3)))
                for r, names in zip(ranks, ("embed.weight", "blocks.2.up", "blocks.4.up", "head.proj"))]
    lines = render(problems)
    assert len(lines) == 2, lines
    assert lines[0].startswith("[q08] rank 0: 12 of 12 gradients differ (embed.weight): they are 4x")
    assert lines[1] == "    also on ranks 1, 2, 3 (the same run); ranks 0, 1, 2 (3 stages)"


def test_a_repeat_of_the_same_problem_adds_no_place_it_also_showed():
    # a case's failure goes into each item of the case (q19's sums and ring): said once, with nowhere else to name
    failed = [Problem("deadlock: every rank waited", exercise="q19", case="n = 2"),
              Problem("ValueError: no", exercise="q19", rank=0, case="n = 2")]
    lines = render(failed + failed)
    assert lines == ["[q19]: deadlock: every rank waited  (n = 2)", "[q19] rank 0: ValueError: no  (n = 2)"], lines


def test_causes_come_first_and_consequences_after_under_their_heading():
    problems = [Problem("the other ranks were left waiting:\n    rank 0 waited", exercise="q08", consequence=True),
                Problem("RuntimeError: the activation does not require grad", exercise="q08", rank=3)]
    lines = render(problems)
    assert lines[0].startswith("[q08] rank 3: RuntimeError")
    assert lines[1] == CONSEQUENCES
    assert lines[2].startswith("  [q08]: the other ranks were left waiting")


def test_messages_carry_no_paths_into_torch_or_gloo():
    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out "
            "waiting 10000ms for send operation to complete")
    assert sanitize(gloo) == "Timed out waiting 10000ms for send operation to complete"
    assert sanitize('File "/x/.venv/lib/python3.11/site-packages/torch/distributed/c10d.py"') == 'File "c10d.py"'
    assert sanitize("/home/s/runs/q08-1/inputs/6-q08_afab_step.py:25: UserWarning") == "q08_afab_step.py:25: UserWarning"


def test_a_wrong_peer_is_the_cause_and_the_others_waiting_its_consequence():
    def waited(rank, peer):
        return {"type": "StoppedWaiting", "message": "stopped by the check", "pending": ["0", "recv_backward", 0, peer],
                "where": [["q07_pipeline_communicate.py", 16, "pipeline_communicate", "return stage.recv(src=peer)"]]}
    errors = {0: waited(0, 1), 1: waited(1, 0), 2: waited(2, 1)}
    cause1, cause2, consequence = rank_problems(errors)
    assert cause1.rank == 1 and cause1.message.startswith("wrong peer: in recv_backward, gradients come back from "
                                                          "the next stage, rank 2, not rank 0")
    assert "at q07_pipeline_communicate.py line 16" in cause1.message
    assert cause2.rank == 2 and not cause1.consequence and not cause2.consequence
    assert consequence.consequence and "rank 0 waited in recv_backward(mb=0) from rank 1, itself waiting on the " \
                                      "wrong peer" in consequence.message


def test_a_case_not_run_is_a_problem_of_its_own_and_every_error_gives_one():
    not_run = {"type": "NotRun", "message": "not run: 2 earlier cases of q08 deadlocked or timed out",
               "pending": None, "where": []}
    (problem,) = rank_problems({0: not_run})
    assert "not run" in problem.message and not problem.consequence
    finished = {"type": "StoppedWaiting", "message": "stopped by the check", "pending": None, "where": []}
    assert rank_problems({3: finished})            # a rank that only waited at the end


def feed(progress: Progress, rank: int, *lines) -> None:
    for tag, payload in lines:
        progress.feed(rank, time.perf_counter(), tag, payload)


def started(n: int) -> Progress:
    """A watch that has seen `n` ranks start case 0."""
    p = Progress()
    for r in range(n):
        feed(p, r, ("C", "start 0"))
    return p


def test_the_watch_sees_a_deadlock_only_when_no_rank_can_go_on():
    p = Progress()
    for r in range(3):
        feed(p, r, ("C", "start 0"))
    feed(p, 0, ("B", ["0", "send_forward", 0, 1]), ("E", ["0", "send_forward", 0, 1]),
         ("B", ["0", "recv_backward", 0, 1]))
    feed(p, 1, ("B", ["0", "recv_forward", 0, 0]))
    assert p.stuck(0, 3) is None                      # rank 1's message is on its way
    feed(p, 1, ("E", ["0", "recv_forward", 0, 0]), ("B", ["0", "recv_backward", 0, 0]))   # the wrong peer
    assert p.stuck(0, 3) is None                      # rank 2 is still running
    feed(p, 2, ("B", ["0", "send_backward", 0, 1]), ("E", ["0", "send_backward", 0, 1]), ("W", ["0"]))
    stuck = p.stuck(0, 3)                             # rank 2's gradient cannot help: rank 1 waits for rank 0
    assert stuck is not None and stuck.cycle() == [0, 1, 0] and stuck.finished == [2]
    assert stuck.lines() == ["rank 0 waits in recv_backward(mb=0) from rank 1",
                             "rank 1 waits in recv_backward(mb=0) from rank 0",
                             "rank 2 has done its part; its send_backward(mb=0) to rank 1 never got a matching receive",
                             "they wait for each other in a cycle: rank 0 -> rank 1 -> rank 0"]
    feed(p, 0, ("E", ["0", "recv_backward", 0, 1]))   # had it been a message from rank 1 to rank 0 ...
    assert p.stuck(0, 3) is None                      # ... rank 0 could go on


def test_a_send_to_a_rank_that_has_done_its_part_is_stuck_once_nothing_else_moves():
    """A rank that has done its part posts no more receives: a send to it that it has not taken (an extra
    message, or one to a rank that raised after its last receive) can never complete under gloo."""
    p = Progress()
    for r in range(2):
        feed(p, r, ("C", "start 0"))
    feed(p, 0, ("B", ["0", "send_forward", 0, 1]), ("E", ["0", "send_forward", 0, 1]),
         ("B", ["0", "send_forward", 1, 1]))
    feed(p, 1, ("B", ["0", "recv_forward", 0, 0]), ("E", ["0", "recv_forward", 0, 0]))
    assert p.stuck(0, 2) is None                      # rank 1 may still post the receive for mb=1
    feed(p, 1, ("W", ["0"]))
    stuck = p.stuck(0, 2)
    assert stuck is not None and stuck.finished == [1]
    assert stuck.lines() == ["rank 0 waits in send_forward(mb=1) to rank 1", "rank 1 has done its part"]
    feed(p, 1, ("B", ["0", "recv_forward", 1, 0]))    # had it begun another receive, the send could go
    assert p.stuck(0, 2) is None


def test_a_collective_a_member_will_not_join_is_stuck_once_nothing_else_moves():
    """q14's grid and q17's raw collectives: a rank in an all-reduce over [0, 1] waits for rank 1 to join
    it. It is stuck when rank 1 has done its part (it raised: a group it is not in) or waits in something
    else that is itself stuck; never while rank 1 is computing, or in the same group's collective."""
    p = started(4)
    feed(p, 0, ("B", ["0", "allreduce_dp", None, [0, 1]]))
    feed(p, 1, ("B", ["0", "forward", 0, None]))
    feed(p, 2, ("B", ["0", "allreduce_dp", None, [2, 3]]))
    feed(p, 3, ("B", ["0", "allreduce_dp", None, [2, 3]]))
    assert p.stuck(0, 4) is None                      # rank 1 computes: it may still come; ranks 2, 3 reduce
    feed(p, 1, ("E", ["0", "forward", 0, None]), ("W", ["0"]))
    feed(p, 3, ("E", ["0", "allreduce_dp", None, [2, 3]]), ("E", ["0", "forward", 1, None]))
    feed(p, 2, ("E", ["0", "allreduce_dp", None, [2, 3]]), ("B", ["0", "allreduce_dp", None, [2, 3]]))
    assert p.stuck(0, 4) is None                      # rank 3 is between operations
    feed(p, 3, ("B", ["0", "recv_forward", 1, 1]))
    stuck = p.stuck(0, 4)           # rank 1 left without reducing; rank 3 waits for a message it never sent
    assert stuck is not None and stuck.finished == [1] and stuck.cycle() is None
    assert stuck.lines() == ["rank 0 waits in allreduce_dp over ranks [0, 1], which rank 1 will not join",
                             "rank 1 has done its part",
                             "rank 2 waits in allreduce_dp over ranks [2, 3], which rank 3 will not join",
                             "rank 3 waits in recv_forward(mb=1) from rank 1"]
    p = started(2)                                    # both in the same all-reduce: it goes on
    feed(p, 0, ("B", ["0", "all_reduce", None, [0, 1]]))
    feed(p, 1, ("B", ["0", "all_reduce", None, [0, 1]]))
    assert p.stuck(0, 2) is None
    p = started(2)                                    # a member outside the case: not the watch's to judge
    feed(p, 0, ("B", ["0", "all_reduce", None, [0, 2]]))
    feed(p, 1, ("W", ["0"]))
    assert p.stuck(0, 2) is None


def test_the_case_barrier_waits_for_the_ranks_not_there_and_for_none_that_left():
    """A rank at the case's barrier (journalled, harness/observe.barrier) waits for every rank of the case
    but those that have done their part. A rank in a collective whose member waits at the barrier is
    stuck (the barrier goes through the store: it joins no collective); so is a send to a rank there."""
    p = started(3)
    feed(p, 0, ("B", ["0", "all_reduce", None, [0, 1]]))
    feed(p, 1, ("B", ["0", "barrier", None, [0, 1, 2]]))
    feed(p, 2, ("B", ["0", "barrier", None, [0, 1, 2]]))
    stuck = p.stuck(0, 3)
    assert stuck is not None and stuck.lines() == [
        "rank 0 waits in all_reduce over ranks [0, 1], which rank 1 will not join",
        "rank 1 has done this part of the case and waits for rank 0 at its end",
        "rank 2 has done this part of the case and waits for rank 0 at its end"]
    p = started(2)                                    # everybody at the barrier, or gone: it opens
    feed(p, 0, ("B", ["0", "barrier", None, [0, 1]]))
    feed(p, 1, ("W", ["0"]))
    assert p.stuck(0, 2) is None
    p = started(2)                                    # a blocking send to a rank at the barrier
    feed(p, 0, ("B", ["0", "send_forward", 0, 1]))
    feed(p, 1, ("B", ["0", "barrier", None, [0, 1]]))
    assert p.stuck(0, 2) is not None
    feed(p, 1, ("E", ["0", "barrier", None, [0, 1]]))   # through it (the sender was there first): it may receive
    assert p.stuck(0, 2) is None


def test_a_rank_not_yet_out_of_a_barrier_or_collective_the_others_are_through_is_not_stuck():
    """A rank starved of CPU journals the end of its barrier, or of its all-reduce, late: the others are
    already through and talk to it. What it waits in is complete, so nothing is stuck (fern's q12 was once
    stopped so, at load 18, in a run that would have completed)."""
    p = started(3)
    for r in range(3):
        feed(p, r, ("B", ["0", "barrier", None, [0, 1, 2]]))
    feed(p, 1, ("E", ["0", "barrier", None, [0, 1, 2]]), ("B", ["0", "send_forward", 0, 2]))
    feed(p, 0, ("E", ["0", "barrier", None, [0, 1, 2]]), ("W", ["0"]))
    assert p.stuck(0, 3) is None                      # rank 2's barrier is open: it will receive
    p = started(2)
    feed(p, 0, ("B", ["0", "all_reduce", None, [0, 1]]))
    feed(p, 1, ("B", ["0", "all_reduce", None, [0, 1]]), ("E", ["0", "all_reduce", None, [0, 1]]),
         ("B", ["0", "recv_forward", 0, 0]))
    assert p.stuck(0, 2) is None                      # rank 0 is through the all-reduce too: it will send
    feed(p, 0, ("E", ["0", "all_reduce", None, [0, 1]]), ("B", ["0", "all_reduce", None, [0, 1]]))
    stuck = p.stuck(0, 2)                             # a second all-reduce rank 1 will not join
    assert stuck is not None and stuck.lines()[0] == "rank 0 waits in all_reduce over ranks [0, 1], which rank 1 will not join"


def test_the_watch_follows_posted_messages_one_by_one():
    """q11's raw calls: a posted message (P) does not block its rank, the wait for it (A) does; a posted
    receive takes its peer's messages in order, and a send waits for the receive that takes it."""
    # each rank sends before it receives, and waits for its send: neither posted the other's receive
    p = started(2)
    feed(p, 0, ("P", ["0", "send_forward", 1, 1]), ("A", ["0", "send_forward", 1, 1]))
    feed(p, 1, ("P", ["0", "send_backward", 0, 0]))
    assert p.stuck(0, 2) is None                      # rank 1 has posted, not waited: it may go on
    feed(p, 1, ("A", ["0", "send_backward", 0, 0]))
    stuck = p.stuck(0, 2)
    assert stuck is not None and stuck.cycle() == [0, 1, 0]
    assert stuck.lines()[:2] == ["rank 0 waits in send_forward(mb=1) to rank 1",
                                 "rank 1 waits in send_backward(mb=0) to rank 0"]
    # the same, with each rank's receive posted before it waits for its send: both messages can go
    p = started(2)
    feed(p, 0, ("P", ["0", "send_forward", 1, 1]), ("P", ["0", "recv_backward", 0, 1]), ("A", ["0", "send_forward", 1, 1]))
    feed(p, 1, ("P", ["0", "send_backward", 0, 0]), ("P", ["0", "recv_forward", 1, 0]), ("A", ["0", "send_backward", 0, 0]))
    assert p.stuck(0, 2) is None
    # a receive posted and not waited for does not make its rank wait
    p = started(2)
    feed(p, 0, ("P", ["0", "recv_backward", 0, 1]))
    feed(p, 1, ("B", ["0", "recv_forward", 0, 0]))
    assert p.stuck(0, 2) is None
    feed(p, 0, ("A", ["0", "recv_backward", 0, 1]))
    assert p.stuck(0, 2) is not None
    # two receives posted from one peer take its first two messages: one sent satisfies only the first
    p = started(2)
    feed(p, 1, ("P", ["0", "recv_forward", 0, 0]), ("P", ["0", "recv_forward", 1, 0]))
    feed(p, 0, ("P", ["0", "send_forward", 0, 1]), ("B", ["0", "recv_backward", 0, 1]))
    feed(p, 1, ("A", ["0", "recv_forward", 0, 0]))
    assert p.stuck(0, 2) is None                      # the first is on its way
    feed(p, 1, ("E", ["0", "recv_forward", 0, 0]), ("A", ["0", "recv_forward", 1, 0]))
    stuck = p.stuck(0, 2)
    assert stuck is not None and set(stuck.waits) == {0, 1}
    feed(p, 0, ("P", ["0", "send_forward", 1, 1]))    # had rank 0 sent the second too ...
    assert p.stuck(0, 2) is None


# ---- real runs of the visible checks --------------------------------------------------------------
def workspace(reference, wrong: dict[str, str]) -> None:
    from lab_src.answers import answers_dir
    folder = answers_dir()
    folder.mkdir()
    for qid in ("q02", "q03", "q04", "q05", "q06", "q07", "q08"):
        text = wrong.get(qid) or Path(reference[qid]).read_text()
        (folder / EXERCISES[qid].answer_file).write_text(text)


@pytest.mark.q07
def test_ranks_that_leave_a_case_before_its_barrier_hold_nobody_there(reference, tmp_path, no_leftovers):
    """q07's stub: the first and last stages call it while building (the no-op probe) and leave the case
    before the barrier the middle stages reach after building; the middle stages call it after that
    barrier. Every rank reports the stub, and nobody waits for the group's timeout: the case's barriers are
    named (harness/case_barrier.py). Through the group, the leavers' end met the middle stages' barrier
    after building, and the middle stages' own end then waited the whole timeout."""
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    from lab_src.pipeline.config import LabConfig
    cfg = LabConfig(num_stages=4, num_layers=8, num_microbatches=4, global_batch_size=8)
    started = time.monotonic()
    run = run_cases([Case(kind="comm", qid="q07", config=cfg, answers={**reference, "q07": None})], tmp_path,
                    timeout_s=120)
    took = time.monotonic() - started
    (out,) = run.outcomes
    errors = out.errors()
    assert {r: e["type"] for r, e in errors.items()} == dict.fromkeys(range(4), "StubCalled"), errors
    assert out.stuck is None and out.failure is None
    assert took < 60, f"a rank waited for the group's timeout: {took:.0f} s"


@pytest.mark.q07
def test_a_failed_q07_check_returns_its_report_and_the_timeline_draws_the_deadlock(reference, in_tmp, capsys,
                                                                                    no_leftovers):
    from grader.cohort.answers import answer
    from lab_src.checks import CheckFailed, check
    from lab_src.views import svg
    from lab_src.views.timeline import timelines
    workspace(reference, {"q07": answer("q07_deadlock")})
    started = time.monotonic()
    report = check("q07")
    took = time.monotonic() - started
    printed = capsys.readouterr()
    assert not report.ok
    first = printed.err.splitlines()
    assert first[0] == "q07: FAILED, 1 problem, and what it caused"
    assert first[1].startswith("[q07] rank 1, micro-batch 0: wrong peer: in recv_backward")
    assert "gloo" not in printed.err + printed.out and "Traceback" not in printed.err + printed.out
    assert "report.timeline() draws the run that failed" in printed.out
    # the case deadlocked and was stopped: far less than the 10 s receive timeout after it began waiting
    stuck = report.run.outcomes[0]
    assert stuck.stuck is not None and max(w.t_end - w.t_start for w in stuck.waits()) < 5.0, took
    assert "Traceback (most recent call last)" in report.traceback and "StoppedWaiting" in report.traceback
    with pytest.raises(CheckFailed):
        report.raise_if_failed()
    # the timeline: the failing case, where each rank was left waiting, the sends no receive took
    view = report.views[report.failed_case()]
    assert view["stages"] == 4 and {w.rank for w in view["waits"]} == {0, 1, 2}
    measured, _ = timelines(view["events"], 4, view["microbatches"], waits=view["waits"], ends=view["ends"],
                            verdict=view["verdict"])
    frame = svg.frame(measured)
    assert frame.count('class="pp-wait"') == 3 and frame.count('class="pp-lost"') == 2
    assert "waits in recv_backward(mb=0) from rank 0" in frame
    os.environ["NBGRADER_EXECUTION"] = "1"          # the static figure, as in feedback
    try:
        assert report.timeline()._repr_png_()[:4] == b"\x89PNG"
    finally:
        del os.environ["NBGRADER_EXECUTION"]


PRINTING_Q05 = '''
def distribute_layers(num_layers, pp_rank, pp_size):
    print(f"distribute_layers on rank {pp_rank} of {pp_size}")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return list(range(start, start + base + (1 if pp_rank < extra else 0)))
'''


def test_what_the_ranks_print_is_shown_by_rank_with_where_the_logs_are(reference, in_tmp, capsys, no_leftovers):
    from lab_src.checks import check
    workspace(reference, {"q05": PRINTING_Q05})
    report = check("q05")
    out = capsys.readouterr().out
    assert report.ok
    assert "rank 2 | distribute_layers on rank 2 of 4" in out and "rank 2 | distribute_layers on rank 2 of 3" in out
    logs = f"{Path(report.run.run_dir).relative_to(Path.cwd().resolve())}/rank<r>.log"
    assert f"What the ranks printed (the first lines of each; all of it: {logs})" in out


def test_a_missing_earlier_answer_is_a_message_not_a_traceback(in_tmp, capsys):
    from lab_src.checks import check
    report = check("q05")
    err = capsys.readouterr().err
    assert not report.ok and err.startswith("q05: FAILED, 1 problem\n[q05]: q05 needs your answer to q02")
    assert report.timeline() is None


def test_an_answer_raising_in_the_notebook_shows_its_own_line(reference, in_tmp, capsys):
    from lab_src.checks import check
    workspace(reference, {"q04": "def baseline_step(model, dataloader, device):\n    return model.nothing\n"})
    report = check("q04")
    err = capsys.readouterr().err
    assert "AttributeError" in err and "at q04_baseline_step.py line 2, in baseline_step: return model.nothing" in err
    assert "lab_src" not in err and "lab_src/pipeline/baseline.py" in report.traceback

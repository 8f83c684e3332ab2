"""q11 (p2p_communicate): the calls of a step with the combined operations, raw torch.distributed calls recorded
in the ranks like the stage's own messages, the deadlock of blocking sends and its report, and wrong answers
graded through the hidden tests with the points they deserve and messages that name the mistake (the cohort's
wren and yuki carry two more: blocking sends, buffers without requires_grad)."""
from __future__ import annotations

import json
import time

import pytest

from grader.cohort.answers import answer
from hidden_grading import grade_answer
from lab_src.topics.p2p.judge import blocking_deadlock, judge_prediction, mutual_sends
from lab_src.topics.p2p.calls import calls
from lab_src.pipeline.schedules import SCHEDULES

pytestmark = pytest.mark.q11

# Q7's logic again, through the stage: the messages are right, but none is a torch.distributed call of its own.
STAGE_CALLS = answer("q11_stage_calls")

# Receive buffers always float32 (torch's default): right until a run is in float64.
FLOAT32 = answer("q11_float32")


# ---- the calls of a step --------------------------------------------------------------------------
def test_the_1f1b_steady_state_is_made_of_the_two_combined_operations():
    ops = [str(c) for c in calls("1f1b", 1, 4, 6)]
    assert ops[:5] == ["recv_forward(mb=0)", "send_forward(mb=0)", "recv_forward(mb=1)", "send_forward(mb=1)",
                       "recv_forward(mb=2)"]
    assert ops[5:9] == ["send_forward_recv_backward(mb=2, recv_mb=0)", "send_backward_recv_forward(mb=0, recv_mb=3)",
                        "send_forward_recv_backward(mb=3, recv_mb=1)", "send_backward_recv_forward(mb=1, recv_mb=4)"]
    assert ops[-3:] == ["send_backward(mb=4)", "recv_backward(mb=5)", "send_backward(mb=5)"]
    # the ends keep their no-ops: the last stage's combined call towards the next stage does nothing
    last = [c for c in calls("1f1b", 3, 4, 6) if c.operation == "send_forward_recv_backward"]
    assert len(last) == 6 and all(op.is_noop(3, 4) for c in last for op in c.parts)


@pytest.mark.parametrize("p,m", [(1, 2), (2, 1), (3, 2), (4, 6), (4, 8)])
def test_the_calls_carry_exactly_the_messages_of_the_schedule(p, m):
    for name in ("afab", "1f1b"):
        for r in range(p):
            singles = [(op.value, c.microbatch_of(op)) for c in calls(name, r, p, m) for op in c.parts]
            assert singles == [(s.op.value, s.microbatch) for s in SCHEDULES[name].messages(r, p, m)]
    assert all(c.operation in ("recv_forward", "send_forward", "recv_backward", "send_backward")
               for name in ("afab", "1f1b") for r in range(p) for c in calls(name, r, p, m, combined=False))


# ---- the deadlock of blocking sends -----------------------------------------------------------------
def test_two_neighbours_each_waiting_in_a_send_to_the_other_are_named_together():
    errors = {0: {"pending": ["3", "recv_backward", 0, 1]},
              1: {"pending": ["3", "send_forward", 1, 2]},
              2: {"pending": ["3", "send_backward", 0, 1]}}
    found = mutual_sends(errors)
    assert len(found) == 1 and found[0].rank == 1
    assert "ranks 1 and 2 each wait inside a send to the other" in found[0].message
    assert "batch_isend_irecv" in found[0].message
    assert mutual_sends({0: {"pending": ["3", "send_forward", 0, 1]},
                         1: {"pending": ["3", "recv_forward", 0, 0]}}) == []


def test_the_deadlock_report_lists_every_message_a_rank_still_waits_for(tmp_path):
    """Posted messages (a batch) can be several at once: the report names all that have not ended."""
    from lab_src.harness.deadlock import report
    from lab_src.harness.runfolder import case_line, journal_path, op_line
    lines = [case_line("start", 2), op_line("B", ["2", "forward", 1, None]), op_line("E", ["2", "forward", 1, None]),
             op_line("B", ["2", "send_forward", 1, 1]), op_line("B", ["2", "recv_backward", 0, 1]),
             op_line("E", ["2", "send_forward", 1, 1])]
    journal_path(tmp_path, 0).write_text("".join(lines))
    journal_path(tmp_path, 1).write_text(case_line("start", 2) + op_line("B", ["2", "send_backward", 0, 0])
                                         + op_line("B", ["2", "recv_forward", 1, 0]))
    text = report(tmp_path, 2, range(2))
    assert "rank 0: done with send_forward(mb=1) to rank 1; waits in recv_backward(mb=0) from rank 1" in text
    assert "rank 1: no operation finished; waits in send_backward(mb=0) to rank 0 and recv_forward(mb=1) from " \
           "rank 0" in text


@pytest.mark.slow
def test_the_visible_check_passes_and_the_blocking_experiment_deadlocks_with_its_report(reference, in_tmp, capsys,
                                                                                        no_leftovers):
    from lab_src.answers import answers_dir
    from lab_src.checks import check
    from lab_src.checks.q11_p2p_communicate import blocking_demo
    from lab_src.registry import EXERCISES
    folder = answers_dir()
    folder.mkdir()
    for qid in ("q02", "q03", "q05", "q11"):
        (folder / EXERCISES[qid].answer_file).write_text(open(reference[qid]).read())
    report = check("q11")
    assert report.ok
    events = report.timeline_events(0)       # the answer's own torch.distributed calls, recorded in the ranks
    assert {e.kind for e in events} == {"send_forward", "recv_forward", "send_backward", "recv_backward"}
    assert len(events) == 2 * 2 * 3 * 6
    out = capsys.readouterr().out
    assert "q11: all checks passed" in out and "recv_backward(mb=0) from rank 2" in out
    started = time.monotonic()
    demo = blocking_demo(timeout_s=30)
    took = time.monotonic() - started
    text = " ".join(capsys.readouterr().out.split())     # messages wrap at 110 columns
    # each rank waits in a send whose receive the other never posts: the watch stops the run at once,
    # long before the 30 s timeout of the receives (the launch's own start costs a few seconds)
    stuck = demo.run.outcomes[0].stuck
    assert stuck is not None and stuck.cycle() == [0, 1, 0], text
    assert took < 25, took
    assert "rank 0: inside send_forward(mb=1) to rank 1" in text and "rank 1: inside send_backward(mb=0) to rank 0" in text
    # facts only: the why is the graded written question
    assert "batch_isend_irecv" not in text and "FAILED" not in text
    # the graded prediction is what the run shows
    assert {f"rank {r}": int(what.split("mb=")[1].split(")")[0]) for r, what in demo.stuck.items()} == blocking_deadlock()
    assert "rank 0: send_forward(mb=0) to rank 1" in text and "rank 1: recv_forward(mb=0) from rank 0" in text


def test_the_prediction_is_read_from_the_answer_and_names_what_is_wrong():
    assert blocking_deadlock() == {"rank 0": 1, "rank 1": 0}
    assert judge_prediction('def predicted_deadlock():\n    return {"rank 0": 1, "rank 1": 0}\n') == []
    wrong = judge_prediction('def predicted_deadlock():\n    return {"rank 0": 0, "rank 1": 0}\n')
    assert len(wrong) == 1 and "predicted_deadlock() says rank 0: 0, rank 1: 0" in wrong[0].message
    stub = judge_prediction('def predicted_deadlock():\n    raise NotImplementedError()\n')
    assert "still the stub" in stub[0].message


@pytest.mark.slow
def test_the_blocking_experiment_needs_only_the_answers_it_builds_on(reference, in_tmp, capsys, no_leftovers):
    """Run All with Q2-Q10 answered and Q11 not: the experiment above the answer cell runs (it used to raise
    StubCalled for q11 itself and stop Run All there)."""
    from lab_src.answers import answers_dir
    from lab_src.checks.q11_p2p_communicate import blocking_demo
    from lab_src.registry import EXERCISES
    folder = answers_dir()
    folder.mkdir()
    for qid in ("q02", "q03", "q05"):
        (folder / EXERCISES[qid].answer_file).write_text(open(reference[qid]).read())
    demo = blocking_demo(timeout_s=30)
    assert demo is not None and set(demo.stuck) == {0, 1}
    out = capsys.readouterr().out
    assert out.count("Where each rank was waiting") == 1 and repr(demo).startswith("BlockingDemo")


# ---- wrong answers, graded ------------------------------------------------------------------------
@pytest.mark.slow
def test_messages_through_the_stage_are_not_raw_calls(reference, tmp_path, no_leftovers):
    verdict = grade_answer("q11", STAGE_CALLS, reference, tmp_path)
    # every message right, but not one of its own: messages and buffers only where there are none (1 of 6,
    # 0 of 5); the pipelines built on it work (2 of 2); the prediction is right
    assert verdict["fraction"] == pytest.approx((1 / 6 + 0 + 1 + 1) / 4, abs=1e-4)
    text = " ".join("\n".join(verdict["messages"]).split())   # messages wrap at 110 columns
    assert "went through stage.send / stage.recv: q11 asks for torch.distributed's own calls" in text
    assert "the receive buffers came from stage.recv: allocate them yourself" in text


@pytest.mark.slow
def test_a_float32_buffer_in_a_float64_run_is_named_before_it_can_crash_the_rank(reference, tmp_path, no_leftovers):
    verdict = grade_answer("q11", FLOAT32, reference, tmp_path, timeout_s=8)
    # right in float32: 5 of 6 message cases, 4 of 5 buffer cases, 1 of 2 pipelines; the prediction is right
    assert verdict["fraction"] == pytest.approx((5 / 6 + 4 / 5 + 1 / 2 + 1) / 4, abs=1e-4)
    text = " ".join("\n".join(verdict["messages"]).split())   # messages wrap at 110 columns
    assert "[q11] rank 1, micro-batch 0: failed in recv_forward(mb=0) with rank 0: ValueError: " in text
    assert "the receive buffer is float32, but the pipeline runs in float64: make it with dtype=stage.dtype" in text
    assert "exit code" not in text                     # a clear error, not a crashed process
    assert json.dumps(verdict)                          # the verdict travels as JSON


# ---- the realistic mistakes: named at once, with a timeline ----------------------------------------
def _check_with(reference, q11_source: str):
    from lab_src.answers import answers_dir
    from lab_src.checks import check
    from lab_src.registry import EXERCISES
    folder = answers_dir()
    folder.mkdir(exist_ok=True)
    for qid in ("q02", "q03", "q05"):
        (folder / EXERCISES[qid].answer_file).write_text(open(reference[qid]).read())
    (folder / EXERCISES["q11"].answer_file).write_text(q11_source)
    started = time.monotonic()
    report = check("q11")
    return report, time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("name,named", [
    ("q11_no_wait", "returned before its messages completed: a send to rank 1 was posted and never waited for"),
    ("q11_direction_from_name", "recv_forward(mb=0) on rank 0: a receive from rank 1, the next rank; recv_forward "
                                "receives an activation, from the previous rank"),
    # blocking sends before receives: the deadlock's lines name the q11 call each rank was in (issue 27)
    ("q11_blocking", "(rank 2: send_forward(mb=1) to rank 3 in q11 send_forward_recv_backward(mb=1, recv_mb=0); "
                     "rank 3: send_backward(mb=0) to rank 2 in q11 send_backward_recv_forward(mb=0, recv_mb=1))"),
])
def test_a_forgotten_wait_and_a_direction_read_from_the_name_are_named_at_once(reference, in_tmp, capsys, name,
                                                                                named, no_leftovers):
    """Both used to wait for the receives' timeout (32 s, 41 s for the check) and say nothing of the mistake
    (garbage labels as dict dumps; 'No events were recorded in this run.')."""
    report, took = _check_with(reference, answer(name))
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())
    assert not report.ok and named in text, text
    assert "{'tensor_shape'" not in text and "0 messages)" not in text and "pair.cc" not in text
    # the timeline: the messages that went through, and where each rank was left waiting
    assert any(report.timeline_events(c) or report.views[c]["waits"] for c in range(3))
    # three cases, each stopped as soon as its ranks wait for a rank that raised (a receive's timeout is 10 s
    # each); loose, for a loaded machine
    assert took < 25, took


@pytest.mark.slow
def test_the_stub_alone_is_one_problem(in_tmp, reference, capsys, no_leftovers):
    report, _ = _check_with(reference, "def p2p_communicate(operation, stage, tensor=None, microbatch=0, "
                                       "recv_microbatch=None):\n    raise NotImplementedError()\n")
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "q11: FAILED, 1 problem\n" in out and "still the stub" in out, out

"""The operations as data (lab_src/pipeline/ops.py): letters, torch's action grammar, and a split backward.

A zero-bubble step splits each backward into I (input gradient, sent on to the previous stage) and W
(weight gradient, which releases the micro-batch I kept held). Events with F, I and W must print and count
right in every view without a view knowing about them: that is what these tests show."""
from __future__ import annotations

import pytest

from lab_src.harness.deadlock import describe_op
from lab_src.pipeline.ops import Op, Step, letters
from lab_src.pipeline.schedules import compute_order, in_flight, schedule
from lab_src.pipeline.trace import Event
from lab_src.views import text_grid
from lab_src.views.prepare import box_color, box_label
from lab_src.views.schedule_figure import with_in_flight

F, I, W = Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT


def boxes(rank: int, *ops: tuple[Op, int, float]) -> list[Event]:
    """Compute events of one rank, one time unit each: (operation, micro-batch, start)."""
    return [Event(rank, op.value, mb, None, None, 0, t, t + 1.0) for op, mb, t in ops]


# Two stages, two micro-batches; each I waits for the next stage's I, each W may run whenever it fits.
SPLIT = (boxes(0, (F, 0, 0), (F, 1, 1), (I, 0, 3), (W, 0, 4), (I, 1, 5), (W, 1, 6))
         + boxes(1, (F, 0, 1), (I, 0, 2), (F, 1, 3), (I, 1, 4), (W, 0, 5), (W, 1, 6)))


def test_each_operation_has_its_own_letter_and_torchs_for_compute():
    assert len({op.letter for op in Op}) == len(Op)
    assert [op.letter for op in Op if op.is_compute] == ["F", "B", "I", "W"]
    assert Op.lettered("W") is W and Op.lettered("SEND_B") is Op.SEND_BACKWARD
    assert [op.holds for op in (F, Op.BACKWARD, I, W)] == [1, -1, 0, -1]
    assert W.after is I and I.after is F and F.after is None
    assert I.phase == W.phase == "backward" and I.peer(0, 2) is None and not W.is_noop(0, 2)


def test_a_split_backward_prints_in_every_view():
    assert text_grid.step_grid(SPLIT, 2).splitlines() == [
        "rank 0 | F0  F1  .   I0  W0  I1  W1",
        "rank 1 | .   F0  I0  F1  I1  W0  W1"]
    timed = text_grid.time_grid(SPLIT, 2, width=14)
    assert timed.splitlines()[0] == "rank 0 |0f1f..0i0w1i1w|"
    assert timed.splitlines()[-1].endswith(". idle, i backward_input, w backward_weight")
    w1 = SPLIT[-1]
    assert w1.label() == "W1" and box_label(w1) == "W1" and box_label(w1, 2) == "W1c0"
    full, i0 = Event(1, "backward", 1, None, None, 0, 0.0, 1.0), SPLIT[2]
    assert len({box_color(w1), box_color(i0), box_color(full), box_color(SPLIT[0])}) == 4   # F, I, W, B: four colours
    assert describe_op("backward_input", 3, None) == "I3" and describe_op("backward_weight", 3, None, 1) == "W3c1"
    assert letters([(F, 0), ("backward_input", 0), (W, 0)]) == "F0 I0 W0"


def test_a_split_backward_counts_as_one_release():
    assert [e.kind for e in compute_order(SPLIT, 0)] == ["forward", "forward", "backward_input", "backward_weight",
                                                         "backward_input", "backward_weight"]
    assert in_flight(SPLIT, 0) == [1, 2, 2, 1, 1, 0]         # I keeps the micro-batch held, W releases it
    assert in_flight(SPLIT, 1) == [1, 1, 2, 2, 1, 0]
    assert [e.held for e in with_in_flight(SPLIT) if e.rank == 1] == [1, 1, 2, 2, 1, 0]


def test_the_views_of_forward_and_backward_are_unchanged():
    events = boxes(0, (F, 0, 0), (Op.BACKWARD, 0, 1))
    assert text_grid.step_grid(events, 1) == "rank 0 | F0  B0"
    assert text_grid.time_grid(events, 1, width=8).splitlines()[::2] == [
        "rank 0 |0fff0bbb|", "f forward, b backward (a digit marks where micro-batch k starts), - send/recv, . idle"]


@pytest.mark.parametrize("name,p,m", [("afab", 3, 2), ("1f1b", 4, 8), ("interleaved", 4, 4), ("interleaved:4", 2, 4)])
def test_every_program_step_prints_as_a_torch_action_and_reads_back(name, p, m):
    sched = schedule(name)
    for r in range(p):
        for step in sched.program(r, p, m, noops=True):
            assert step.stage == step.chunk * p + r
            assert Step.parse(str(step), p) == step
    assert [str(s) for s in schedule("1f1b").program(1, 4, 8)[:4]] == ["1RECV_F0", "1F0", "1SEND_F0", "1RECV_F1"]
    assert str(schedule("interleaved").program(1, 4, 4)[-2]) == "1B3"


def test_one_chunk_steps_read_back_without_p_and_torch_reads_them_too():
    assert Step.parse("2F0") == Step(2, F, 0) and Step.parse(" 0W13 ") == Step(0, W, 13)
    assert Step.parse("5B3", p=4) == Step(5, Op.BACKWARD, 3, chunk=1)
    for bad in ("F0", "2X0", "2F", "2F0x"):
        with pytest.raises(ValueError):
            Step.parse(bad)
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for text in ("2F0", "0B3", "1I2", "1W2", "3SEND_F1", "0RECV_B4"):
        action, step = torch_schedules._Action.from_str(text), Step.parse(text)
        assert (action.stage_index, action.computation_type.value, action.microbatch_index) == (
            step.stage, step.op.letter, step.microbatch)
        assert str(action) == str(step)

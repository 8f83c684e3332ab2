"""q15, Interleaved 1F1B with virtual stages: the schedule's order rule, the chunked stage, the pictures,
and realistic wrong answers graded through the hidden tests in real torchrun processes, each with the
points it deserves and the message a student reads."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from grader.cohort.answers import answer
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.schedules import Interleaved1F1B, Op, in_flight, schedule
from lab_src.views.ideal import ideal_events

pytestmark = pytest.mark.q15

QID = "q15"


# ---- wrong answers, each the reference with one realistic change -------------------------------------
def changed(reference_text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert old in reference_text, old
        reference_text = reference_text.replace(old, new)
    return reference_text


NO_WRAP = [  # Q7's rules per rank: the first rank receives nothing, the last sends nothing on
    ('if op == "recv_forward" and s != first:', 'if op == "recv_forward" and not stage.is_first_stage:'),
    ('if op == "send_forward" and s != last:', 'if op == "send_forward" and not stage.is_last_stage:'),
    ('if op == "recv_backward" and s != last:', 'if op == "recv_backward" and not stage.is_last_stage:'),
    ('if op == "send_backward" and s != first:', 'if op == "send_backward" and not stage.is_first_stage:'),
]
NO_MODULO = [("(r - 1) % p", "r - 1"), ("(r + 1) % p", "r + 1")]                 # no ring: no wrap-around
NOT_REVERSED = [("(v - 1 - chunk if backward else chunk)", "chunk")]            # backwards in forward order
DEPTH_FIRST_BACKWARD = [("    def order(k, backward):\n", "    def order(k, backward):\n        if backward:  "
                         "# each micro-batch back through all its chunks\n            return k // v, v - 1 - k % v\n")]
ALL_FORWARDS_FIRST = [("warmup = min((p - r - 1) * 2 + (v - 1) * p, total)", "warmup = total")]
# posts the next box's receive one box ahead, and after the last box wraps round to the first: a receive
# posted for a message nobody sends
LOOKAHEAD_WRAPS = [("after = receive_for(boxes[i + 1]) if i + 1 < len(boxes) else None",
                    "after = receive_for(boxes[(i + 1) % len(boxes)])")]

# What most students write: each receive blocks when its box is about to run (stage.recv, no post_recv).
# A valid Interleaved 1F1B step, and it gets full marks.
BLOCKING_RECEIVES = answer("q15_blocking_receives")


def grade(reference: dict, answers: dict[str, str], tmp_path, timeout_s: float = 8.0) -> dict:
    """Each named q15 answer through the hidden tests, all in one launch: {name: (score, items)}."""
    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from grader.trusted import score
    from lab_src.harness.runner import run_cases
    tests = hidden_tests(QID)
    ctxs, cases = {}, []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, text in answers.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        ctxs[name] = Context(student={QID: str(path)}, reference=reference)
        cases.append(tests.cases(ctxs[name]))
    run = run_cases([c for cs in cases for c in cs], tmp_path / "run", timeout_s=timeout_s, case_deadline_s=60)
    out, i = {}, 0
    for (name, ctx), cs in zip(ctxs.items(), cases):
        items = tests.judge(ctx, run.outcomes[i:i + len(cs)])
        i += len(cs)
        out[name] = (score(items), items)
    return out


def messages(items) -> str:
    return "\n".join(str(p) for item in items for p in item.problems)


@pytest.fixture(scope="module")
def reference_text(reference):
    return open(reference[QID]).read()


@pytest.fixture(scope="module")
def graded_runs(reference, reference_text, tmp_path_factory):
    """The reference and an answer that runs to the end, graded in one launch (an answer that deadlocks
    needs a launch of its own: after two timeouts a launch stops trying the exercise)."""
    return grade(reference, {"reference": reference_text,
                             "blocking_receives": BLOCKING_RECEIVES,
                             "all_forwards_first": changed(reference_text, *ALL_FORWARDS_FIRST)},
                 tmp_path_factory.mktemp("q15"))


# ---- the schedule ------------------------------------------------------------------------------------
def test_interleaved_schedules_are_found_by_name():
    assert schedule("interleaved").chunks_per_rank == 2
    assert schedule("interleaved:4").chunks_per_rank == 4 and schedule("interleaved:4").name == "interleaved:4"
    with pytest.raises(KeyError, match="interleaved:<v>"):
        schedule("interleaved:x")


def test_the_order_groups_p_microbatches_per_chunk_and_reverses_chunks_backward():
    sched = Interleaved1F1B(2)
    assert sched.order(2, 4) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    assert sched.order(2, 4, backward=True)[:4] == [(0, 1), (1, 1), (0, 0), (1, 0)]


def test_messages_between_two_ranks_are_sent_and_received_in_the_same_order():
    # gloo matches the messages between two ranks in order, and all activations have one shape: a
    # program whose receives came in another order than the peer's sends would swap tensors silently
    for p, m, v in [(2, 2, 2), (2, 4, 4), (3, 6, 2), (4, 8, 2), (4, 4, 4)]:
        sched = Interleaved1F1B(v)
        sends, recvs = {}, {}
        for r in range(p):
            for s in sched.program(r, p, m):
                if s.op.is_send:
                    sends.setdefault((r, s.op.peer(r, p, s.chunk, v)), []).append(
                        (s.op.phase, s.microbatch, s.op.peer_chunk(r, p, s.chunk)))
                elif s.op.is_recv:
                    recvs.setdefault((s.op.peer(r, p, s.chunk, v), r), []).append((s.op.phase, s.microbatch, s.chunk))
        assert sends == recvs, (p, m, v)


def test_a_run_in_another_chunk_order_breaks_only_the_order_rule():
    p, m, v = 2, 4, 2
    sched = Interleaved1F1B(v)
    events = ideal_events(p, m, schedule=sched, activation_bytes=64)
    assert sched.violations(events, p, m) == []
    # swap the chunks of rank 0's second and third forwards: micro-batch 0 on chunk 1 before micro-batch 1 on chunk 0
    fwd = sorted((e for e in events if e.rank == 0 and e.kind == "forward"), key=lambda e: e.t_start)
    a, b = fwd[1], fwd[2]
    swapped = [replace(e, t_start=(b if e is a else a).t_start) if e in (a, b) else e for e in events]
    broken = sched.violations(swapped, p, m)
    assert [(r, mb) for r, mb, _ in broken] == [(0, 0)]
    assert "chunk 0 takes micro-batches 0..1" in broken[0][2]


def test_rank_0_holds_p_plus_p_minus_1_over_v_stages_of_activations():
    # (p-1)*2 + (v-1)*p + 1 chunk forwards, each 1/v of the rank's layers: p + (p-1)/v stages' worth
    p, m = 4, 8
    for v in (2, 4):
        events = ideal_events(p, m, schedule=Interleaved1F1B(v))
        held = max(in_flight(events, 0))
        assert held == (p - 1) * 2 + (v - 1) * p + 1
        assert held / v == pytest.approx(p + (p - 1) / v)


# ---- the chunked stage, in one process --------------------------------------------------------------
def test_chunks_are_dealt_out_round_robin(reference):
    from lab_src.answers import use_answers
    from lab_src.pipeline.chunked import InterleavedStage
    cfg = LabConfig(num_layers=8, num_stages=4)
    with use_answers(reference):
        stage = InterleavedStage(cfg, pp_rank=1, pp_size=4, num_chunks=2, micro_batch_size=2)
        assert [stage.virtual_stage(c) for c in range(2)] == [1, 5]
        assert stage.chunk_layers == [[1], [5]] and stage.embed is None and stage.head is None
        assert sorted(n.split(".")[1] for n, _ in stage.named_parameters()) == ["1"] * 12 + ["5"] * 12
        first = InterleavedStage(cfg, pp_rank=0, pp_size=4, num_chunks=2, micro_batch_size=2)
        tokens = torch.zeros(2, cfg.seq_len, dtype=torch.long)
        with pytest.raises(ValueError, match="wrap-around from the last rank to the first"):
            first.forward(tokens, chunk=1, microbatch=0)
        with pytest.raises(TypeError, match="say which chunk"):
            first.forward(tokens, microbatch=0)
        with pytest.raises(ValueError, match="every virtual stage needs one"):
            InterleavedStage(cfg, pp_rank=0, pp_size=4, num_chunks=4, micro_batch_size=2)


def test_the_pictures_tell_the_chunks_apart():
    from lab_src.views.prepare import box_color, box_label
    from lab_src.views.timeline import static_figure, timelines
    events = ideal_events(2, 4, schedule=Interleaved1F1B(4), activation_bytes=64)
    f0 = next(e for e in events if e.kind == "forward" and e.chunk == 0)
    f3 = next(e for e in events if e.kind == "forward" and e.chunk == 3)
    assert box_label(f3, 4) == f"F{f3.microbatch}c3" and box_label(f0, 1) == f"F{f0.microbatch}"
    assert box_color(f0, 4) != box_color(f3, 4)
    measured, ideal = timelines(events, 2, 4, schedule="interleaved:4")
    assert measured.chunks == 4 and "(p-1)/(v·m+p-1) = (2-1)/(4·4+2-1) = 5.9%" in measured.bubble_text()
    static_figure(events, 2, 4, schedule="interleaved:4")       # draws without error
    from lab_src.views.svg import frame
    svg = frame(measured, width=4000)         # wide enough for every box's label
    assert f">F{f3.microbatch}c3</text>" in svg and box_color(f3, 4) in svg and "paler: later chunks" in svg


# ---- graded in real processes -----------------------------------------------------------------------
def test_the_reference_gets_full_marks(graded_runs):
    score, items = graded_runs["reference"]
    assert score == 1.0, messages(items)


@pytest.mark.slow
def test_chunks_dealt_out_contiguously_get_nothing_and_are_told_why(reference, tmp_path):
    # the cohort's vera: right with 2 ranks and 2 chunks up to the numbers, which differ (the blocks run in
    # the wrong order); with more chunks or ranks her step deadlocks, and the hint says why
    score, items = grade(reference, {"contiguous": answer("q15_contiguous")}, tmp_path, timeout_s=4)["contiguous"]
    assert score == 0.0
    assert "the output differs from the baseline" in messages(items[:1])
    for item in items[:3]:
        assert any("as if rank 0 held consecutive virtual stages" in str(p) and "round-robin" in str(p)
                   for p in item.problems), messages([item])


def test_blocking_receives_get_full_marks_too(graded_runs, reference_text):
    # the reference posts each receive a box ahead (stage.post_recv); receiving when the box runs is as valid
    assert "post_recv" in reference_text and "post_recv" not in BLOCKING_RECEIVES
    score, items = graded_runs["blocking_receives"]
    assert score == 1.0, messages(items)


@pytest.mark.slow
def test_a_receive_posted_and_never_waited_for_is_named(reference, reference_text, tmp_path):
    score, items = grade(reference, {"wraps": changed(reference_text, *LOOKAHEAD_WRAPS)}, tmp_path,
                         timeout_s=4)["wraps"]
    assert score == 0.0
    text = messages(items[:1])
    assert "the step ended with receives posted and never waited for: recv_forward(mb=0) from rank 0" in text, text


def test_running_every_forward_first_breaks_the_memory_bound(graded_runs):
    score, items = graded_runs["all_forwards_first"]
    assert score == 0.0
    assert "holds at most" in messages(items) and "another schedule" not in messages(items)


@pytest.mark.slow
def test_skipping_the_wrap_around_is_named(reference, reference_text, tmp_path):
    # each in a launch of its own: after two timeouts a launch stops trying the exercise
    score, items = grade(reference, {"no_wrap": changed(reference_text, *NO_WRAP)}, tmp_path / "a",
                         timeout_s=4)["no_wrap"]
    assert score == 0.0
    first = str(items[0].problems[0])
    assert first.startswith("[q15] rank 0") and "wrap-around from the last rank to the first" in first, first
    score, items = grade(reference, {"no_modulo": changed(reference_text, *NO_MODULO)}, tmp_path / "b",
                         timeout_s=4)["no_modulo"]
    assert score == 0.0
    assert "there is no rank" in messages(items) and "(rank + 1) %" in messages(items)


@pytest.mark.slow
def test_backwards_in_forward_chunk_order_deadlock_and_are_explained(reference, reference_text, tmp_path):
    score, items = grade(reference, {"not_reversed": changed(reference_text, *NOT_REVERSED)}, tmp_path,
                         timeout_s=4)["not_reversed"]
    assert score == 0.0
    first = str(items[0].problems[0])
    assert "backwards visit the chunks in reverse" in first and "deadlocks" in first, first
    # the deadlock's lines name the chunk each rank waited for
    lines = messages(items[:1])
    assert "rank 0 waited in recv_backward(mb=1, chunk 0) from rank 1" in lines, lines
    assert "rank 1 waited in recv_forward(mb=1, chunk 1) from rank 0" in lines, lines


@pytest.mark.slow
def test_another_valid_chunk_order_keeps_half_of_what_it_runs(reference, reference_text, tmp_path):
    # backwards micro-batch by micro-batch: a valid pipeline of another order (half marks) with 2 ranks and 2
    # chunks, 3 ranks, and 4 ranks with 4 micro-batches; with 4 chunks two ranks receive their gradients in
    # another order than they were sent (tensors swapped, numbers wrong); with 4 ranks and 8 micro-batches
    # the order deadlocks
    score, items = grade(reference, {"depth_first": changed(reference_text, *DEPTH_FIRST_BACKWARD)}, tmp_path,
                         timeout_s=8)["depth_first"]
    assert [i.score for i in items] == [0.5, 0.0, 0.0, 0.5, 0.5], messages(items)
    assert score == pytest.approx(0.3)
    assert str(items[0].problems[0]).startswith("[q15] rank 0, micro-batch 0: another schedule: your step visits "
                                                "the chunks in another order"), messages(items[:1])
    assert "backwards visit the chunks in reverse" in messages(items[:1])
    assert "are matched in the order they are posted" in str(items[1].problems[0]), messages(items[1:2])
    assert "deadlocks" in messages(items[2:3]) or "before the run stopped" in messages(items[2:3])

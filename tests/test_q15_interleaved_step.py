"""q15, Interleaved 1F1B with virtual stages: the schedule's order rule, the chunked stage, the pictures,
and realistic wrong answers graded through the hidden tests in real torchrun processes, each with the
points it deserves and the message a student reads."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from grader.cohort.answers import answer
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.schedules import Interleaved1F1B, in_flight, schedule
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
# a branch of its own for one chunk per rank ("nothing to interleave"): all forwards, then all backwards
V1_ALL_FORWARDS_FIRST = [("warmup = min((p - r - 1) * 2 + (v - 1) * p, total)",
                          "warmup = total if v == 1 else min((p - r - 1) * 2 + (v - 1) * p, total)")]
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


PREDICTED = 1 / 7      # the prediction item among the six pipelines: a wrong step with the reference's prediction


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
                             "all_forwards_first": changed(reference_text, *ALL_FORWARDS_FIRST),
                             "v1_all_forwards_first": changed(reference_text, *V1_ALL_FORWARDS_FIRST)},
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
    from lab_src.topics.interleaved.chunked import InterleavedStage
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


# ---- the prediction, graded (issue 27) ----------------------------------------------------------------
def test_the_prediction_is_the_schedules_bubble_and_message_count(tmp_path):
    from grader.hidden.common import Context
    from grader.hidden.q15_interleaved_step import prediction_item
    from lab_src.topics.interleaved.judge import expected_prediction
    from lab_src.views.bubble import theoretical_bubble
    want = expected_prediction()
    for v in (1, 2, 4):
        sends = [e for e in ideal_events(4, 8, schedule=Interleaved1F1B(v)) if e.is_send]
        assert want[f"messages_v{v}"] == len(sends)
        assert want[f"bubble_v{v}"] == pytest.approx(theoretical_bubble(4, 8, v))
    assert want["messages_v1"] == 48 and want["bubble_v2"] == pytest.approx(3 / 19)

    def item(text):
        path = tmp_path / "q15.py"
        path.write_text(text)
        return prediction_item(Context(student={QID: str(path)}, reference={}))
    right = answer("q15_blocking_receives")
    assert item(right).passed and item(right).part == "pipelines"
    wrong = item(right.replace('"messages_v2": 112', '"messages_v2": 64'))
    assert "the predicted messages for v = 2 are 64; one step sends 112" in messages([wrong])
    stub = item("def predicted_interleaving():\n    raise NotImplementedError()\n")
    assert "still the stub" in messages([stub]) and not stub.passed
    computed = item("def predicted_interleaving():\n    return {'bubble_v1': len([1])}\n")
    assert "not a number" in messages([computed])


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
    assert score == pytest.approx(PREDICTED)
    text = messages(items[:1])
    assert "the step ended with receives posted and never waited for: recv_forward(mb=0) from rank 0" in text, text


def test_running_every_forward_first_breaks_the_memory_bound(graded_runs):
    score, items = graded_runs["all_forwards_first"]
    assert score == pytest.approx(PREDICTED)
    assert "holds at most" in messages(items) and "another schedule" not in messages(items)


def test_a_wrong_branch_for_one_chunk_per_rank_loses_that_case(graded_runs):
    score, items = graded_runs["v1_all_forwards_first"]
    (v1,) = [i for i in items if i.name == "2 ranks, 1 chunk, 4 micro-batches"]
    assert [i.score for i in items if i is not v1] == [1.0] * (len(items) - 1), messages(items)
    assert v1.score == 0.0 and "holds at most 3 on rank 0 of 2" in messages([v1]), messages([v1])
    assert score == pytest.approx(1 - 1 / len(items))


@pytest.mark.slow
def test_skipping_the_wrap_around_is_named(reference, reference_text, tmp_path):
    # each in a launch of its own: after two timeouts a launch stops trying the exercise
    score, items = grade(reference, {"no_wrap": changed(reference_text, *NO_WRAP)}, tmp_path / "a",
                         timeout_s=4)["no_wrap"]
    assert score == pytest.approx(PREDICTED)
    first = str(items[0].problems[0])
    assert first.startswith("[q15] rank 0") and "wrap-around from the last rank to the first" in first, first
    score, items = grade(reference, {"no_modulo": changed(reference_text, *NO_MODULO)}, tmp_path / "b",
                         timeout_s=4)["no_modulo"]
    assert score == pytest.approx(PREDICTED)
    assert "there is no rank" in messages(items) and "(rank + 1) %" in messages(items)


@pytest.mark.slow
def test_backwards_in_forward_chunk_order_deadlock_and_are_explained(reference, reference_text, tmp_path):
    score, items = grade(reference, {"not_reversed": changed(reference_text, *NOT_REVERSED)}, tmp_path,
                         timeout_s=4)["not_reversed"]
    assert score == pytest.approx(PREDICTED)
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
    # with one chunk per rank the order is Interleaved 1F1B's own: full marks there
    assert [i.score for i in items] == [0.5, 0.0, 0.0, 0.5, 0.5, 1.0, 1.0], messages(items)
    assert score == pytest.approx(3.5 / 7)
    assert str(items[0].problems[0]).startswith("[q15] rank 0, micro-batch 0: another schedule: your step visits "
                                                "the chunks in another order"), messages(items[:1])
    assert "backwards visit the chunks in reverse" in messages(items[:1])
    assert "are matched in the order they are posted" in str(items[1].problems[0]), messages(items[1:2])
    assert "deadlocks" in messages(items[2:3]) or "before the run stopped" in messages(items[2:3])


# ---- Validate: the bubble study is skipped, the cut points say they are not graded ---------------------
@pytest.mark.slow
def test_validate_of_the_released_q15_skips_the_study(reference, tmp_path, no_leftovers):
    """Issue 27, item 2: under Validate the study ran past nbgrader's 30 s a cell, was interrupted, the next
    cell raised NameError, and Validate still said "Success!". Now it launches nothing there."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import time

    from lab_src.registry import EXERCISES
    from tests.test_validate import ROOT
    notebook = ROOT / "notebooks" / EXERCISES[QID].assignment / EXERCISES[QID].notebook
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id == "q15_answer":
            cell["source"] = "%%answer q15\n" + open(reference[QID]).read()
        if grade_id == "q15_cut_points":
            cell["source"] = 'CUT_POINTS = ["blocks.3", "blocks.6"]\n'
    (tmp_path / notebook.name).write_text(json.dumps(nb, indent=1))
    (tmp_path / "answers").mkdir()
    for qid in EXERCISES[QID].needs:
        shutil.copyfile(reference[qid], tmp_path / "answers" / EXERCISES[qid].answer_file)
    # a minute a cell, not nbgrader's 30 s: the check's two torchrun launches on a loaded 2-core machine
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.Execute.timeout = 60\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "LAB_ANSWERS", "LAB_ANSWERS_DIR")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "validate", notebook.name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    print(f"nbgrader validate q15: {time.monotonic() - started:.1f} s\n{out}")
    assert "Success! Your notebook passes all the tests." in out
    assert "Timeout waiting for execute reply" not in out and "Interrupting kernel" not in out
    assert not list((tmp_path / "runs").glob("q15-bubble-*")), "the bubble study launched under Validate"
    assert not list((tmp_path / "runs").glob("q15-torch-*")), "the bridge to torch launched under Validate"


def test_chunk_labels_are_drawn_only_where_they_fit():
    """Issue 27, cosmetics: with 4 chunks the boxes are narrow and their labels ran into each other
    ("B0c3F3c0"). A label is drawn only where its box holds it, in the SVG and in the static figure."""
    import re

    from lab_src.views.svg import frame
    from lab_src.views.timeline import timelines
    events = ideal_events(2, 4, schedule=Interleaved1F1B(4), activation_bytes=64)
    measured, _ = timelines(events, 2, 4, schedule="interleaved:4")
    for width in (700, 1200, 4000):
        rows: dict[str, list[tuple[float, str]]] = {}
        for x, y, text in re.findall(r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="middle"[^>]*>(\w+)</text>',
                                     frame(measured, width=width)):
            rows.setdefault(y, []).append((float(x), text))
        for labels in rows.values():
            labels.sort()
            for (xa, a), (xb, b) in zip(labels, labels[1:]):
                assert xb - xa >= 6.5 * (len(a) + len(b)) / 2, (width, a, b, xb - xa)


def test_the_study_launches_nothing_under_validate_or_after_a_failed_check(monkeypatch, capsys):
    """Issue 27, items 2 and 14: under Validate the study ran past nbgrader's 30 s; after a failed check (the
    stub) it ran 28 s and printed an empty table. Now it says why it does not run, at once."""
    from lab_src import grading
    from lab_src.checks import q15_interleaved_step as q15
    monkeypatch.setattr(q15, "_run", lambda *a, **k: pytest.fail("the study launched"))
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert q15.bubble_study() is None
    assert "skipped under Validate" in capsys.readouterr().out
    monkeypatch.delenv("NBGRADER_EXECUTION")
    monkeypatch.setitem(grading._checked, QID, "CheckFailed: q15: FAILED, 1 problem\n[q15]: still the stub")
    assert q15.bubble_study() is None
    err = capsys.readouterr().err
    assert "the check above did not pass: make it pass first" in err and "q15: FAILED" in err


def test_the_study_says_why_the_measurement_departs_from_the_ideal():
    """Issue 27, item 10: v = 1 measured below its ideal and v = 4 worse than v = 1, with no word why."""
    from lab_src.checks.q15_interleaved_step import why_measured
    rows = [{"v": 1, "bubble": 0.133, "ideal": 0.201, "theory": 3 / 11, "compute_s": 0.9, "messages": 48,
             "bytes_sent": 48 * 2**20},
            {"v": 2, "bubble": 0.12, "ideal": 0.13, "theory": 3 / 19, "compute_s": 0.6, "messages": 112,
             "bytes_sent": 112 * 2**20},
            {"v": 4, "bubble": 0.16, "ideal": 0.09, "theory": 3 / 35, "compute_s": 0.62, "messages": 240,
             "bytes_sent": 240 * 2**20}]
    said = " ".join(why_measured(rows, 4, 2))
    assert "v = 1 measured 13.3%, below its ideal 20.1%" in said and "1.50 x the fastest run's" in said
    assert "4 ranks share 2 cores, and a rank waiting for a core counts as busy" in said
    assert "v = 4 measured 16.0%, worse than v = 1's 13.3%" in said and "it sent 240 messages against 48" in said


def test_the_cut_points_say_they_are_an_ungraded_experiment(reference, in_tmp, monkeypatch, capsys):
    """Issue 27, item 6: wrong CUT_POINTS printed "q15: FAILED, 3 problems" in red, though nothing grades them."""
    import json

    from lab_src.checks.q15_interleaved_step import traced_partition
    (in_tmp / "map.json").write_text(json.dumps(reference))
    monkeypatch.setenv("LAB_ANSWERS", str(in_tmp / "map.json"))
    report = traced_partition(["blocks.2", "blocks.5"])
    err = capsys.readouterr().err
    assert not report.ok
    err = " ".join(err.split())
    # issue 41: not "FAILED" either, above a test cell that says Q15 passed
    assert err.startswith("q15 Part 2, the cut points in CUT_POINTS (an experiment: not graded): 3 differences "
                          "from your Q5's stages (your Q15 score does not depend on them)"), err


def test_a_rank_left_waiting_is_labelled_with_its_chunk_and_the_way_its_message_goes():
    """Issue 27: a failing interleaved timeline names the chunk each rank waited for (a micro-batch alone
    does not say which message), and a send waits *to* its peer."""
    from lab_src.pipeline.trace import Event
    from lab_src.views import svg
    from lab_src.views.ideal import ideal_events
    from lab_src.views.static import figure
    from lab_src.views.timeline import prepare
    events = [e for e in ideal_events(2, 4, schedule="interleaved") if e.t_end < 0.004]
    waits = [Event(0, "recv_forward", 2, 1, None, 0, 0.004, 0.006, 1), Event(1, "send_backward", 0, 0, None, 0, 0.004, 0.006, 0)]
    tl = prepare(events, 2, 4, chunks=2, waits=waits, verdict="stopped by the check")
    frame = svg.frame(tl)
    assert "waits in recv_forward(mb=2, chunk 1) from rank 1" in frame
    assert "waits in send_backward(mb=0, chunk 0) to rank 0" in frame
    texts = [t.get_text() for ax in figure([tl]).axes for t in ax.texts]
    assert any("waits in recv_forward(mb=2, chunk 1) from rank 1" in t for t in texts), texts


@pytest.mark.slow
def test_the_bridge_runs_torchs_interleaved_schedule_on_the_same_chunks(reference, in_tmp, capsys, no_leftovers,
                                                                         monkeypatch):
    """Issue 27: ScheduleInterleaved1F1B on the chunks the answers build, beside the step, in the same order."""
    from lab_src.answers import answers_dir
    from lab_src.checks.torch_bridge import interleaved_bridge
    from lab_src.registry import EXERCISES
    folder = answers_dir()
    folder.mkdir()
    for qid in ("q02", "q03", "q04", "q05", "q06", "q15"):
        (folder / EXERCISES[qid].answer_file).write_text(open(reference[qid]).read())
    monkeypatch.setattr("lab_src.checks.torch_bridge.check_not_passed", lambda qid: None)
    bridge = interleaved_bridge(v=2, stages=2)
    out = capsys.readouterr().out
    assert "the same order on every rank: your step is torch's ScheduleInterleaved1F1B" in out, out
    assert bridge.order(1, "theirs").startswith("F0c0 F1c0 F0c1 B0c1 F1c1 B1c1")


# ---- issue 55: a study lets go of its run ------------------------------------------------------------------
def test_a_study_keeps_its_views_and_lets_every_ranks_records_go():
    """Issue 55: q15's study kept its whole run (every rank's observations) in the kernel: 1,090 MiB after two
    runs. `let_go()` keeps what its text and figures need (views, lines, the failed case, the tracebacks) and
    drops the outcomes."""
    import gc
    import weakref
    from pathlib import Path
    from lab_src.checks.common import CheckReport
    from lab_src.harness.case import Run

    class Case:
        label = "v = 2"

    class Outcome:                      # what CheckReport reads of a case's outcome
        case, failure, payload = Case(), None, None

        def errors(self):
            return {1: {"type": "RuntimeError", "traceback": "Traceback: rank 1's own"}}

    kept = Outcome()
    kept.payload = bytearray(2**20)    # stands for the ranks' observations
    alive = weakref.ref(kept)
    views = [{"label": "v = 1", "events": []}, {"label": "v = 2", "events": []}]
    study = CheckReport("q15", Run(Path("runs/x"), [Outcome(), kept], []), [], ["line"], views=views)
    study.run.outcomes[0].errors = lambda: {}
    del kept
    assert study.failed_case() == 1
    assert study.let_go() is study
    gc.collect()
    assert alive() is None and study.run.outcomes == []
    assert study.views == views and study.lines == ["line"]
    assert study.failed_case() == 1 and "rank 1's own" in study.traceback

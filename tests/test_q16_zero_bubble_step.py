"""q16 (zero_bubble_step with its backward_input and backward_weight): ZB-H1's program and rules, the split
judged on one process (the reference, the naive second pass and the cohort's split mistakes, without a
launch), and wrong steps graded through the hidden tests (one launch each)."""
from __future__ import annotations

from pathlib import Path

import pytest

from grader.cohort.answers import answer
from hidden_grading import grade_answer
from lab_src.judge.failures import case_problems
from lab_src.topics.zero_bubble import judge as split_judge
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.schedules import schedule
from lab_src.pipeline.trace import Event
from lab_src.views.bubble import measured_bubble, zero_bubble_theory
from lab_src.views.ideal import CostModel, ideal_events

pytestmark = pytest.mark.q16

ZB = schedule("zbh1")
EQUAL = CostModel(forward_s_per_layer=1.0, backward_s_per_layer=2.0, latency_s=0.0, bandwidth_bytes_per_s=1e30)


def compute(p: int, m: int, rank: int) -> str:
    return " ".join(str(s) for s in ZB.program(rank, p, m) if s.op.is_compute)


# ---- the schedule -------------------------------------------------------------------------------------
def test_zbh1_is_torchs_zb1p_with_one_stage_per_rank():
    # torch.distributed.pipelining's ScheduleInterleavedZeroBubble, one stage per rank: rank r's W lags its I by r
    assert compute(4, 8, 0).startswith("0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1")
    assert compute(4, 8, 3) == ("3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 "
                                "3W4 3W5 3W6 3W7")
    assert compute(4, 2, 1) == "1F0 1F1 1I0 1I1 1W0 1W1"            # m < p
    assert [ZB.max_in_flight(r, 4, 8) for r in range(4)] == [4, 4, 4, 4]


@pytest.mark.parametrize("m", [4, 8, 16])
def test_the_ideal_run_keeps_its_rules_and_its_bubble_is_the_papers(m):
    events = ideal_events(4, m, EQUAL, schedule="zbh1")
    assert ZB.violations(events, 4, m) == []
    assert measured_bubble(events, 4) == pytest.approx(3 / (3 * m + 3)) == pytest.approx(
        zero_bubble_theory(4, m, 1.0, 1.0, 1.0))
    assert measured_bubble(ideal_events(4, m, EQUAL, schedule="1f1b"), 4) == pytest.approx(3 / (m + 3))


def test_a_split_timeline_states_zero_bubbles_theory_not_1f1bs():
    from lab_src.views.prepare import prepare
    zb = prepare(ideal_events(4, 8, EQUAL, schedule="zbh1"), 4, 8, align=False).bubble_text()
    assert "ZB-H1 theory" in zb and f"= {3 / 27:.1%}" in zb and "(m+p-1)" not in zb
    assert "(p-1)/(m+p-1)" in prepare(ideal_events(4, 8, EQUAL, schedule="1f1b"), 4, 8, align=False).bubble_text()


def test_w_before_its_i_and_a_late_gradient_break_the_rules():
    def ev(rank, kind, mb, t, peer=None):
        return Event(rank, kind, mb, peer, None, 0, t, t + 0.5)
    w_first = [ev(0, "forward", 0, 0), ev(0, "backward_weight", 0, 1), ev(0, "backward_input", 0, 2)]
    assert "W0 (the weights' gradients) runs before I0" in ZB.violations(w_first, 1, 1)[0][2]
    late = [ev(0, "forward", 0, 0), ev(1, "forward", 0, 1), ev(1, "backward_input", 0, 2), ev(1, "backward_weight", 0, 3),
            ev(1, "send_backward", 0, 4, 0), ev(0, "recv_backward", 0, 4.6, 1), ev(0, "backward_input", 0, 5),
            ev(0, "backward_weight", 0, 6)]
    found = ZB.violations(late, 2, 1)
    assert [(r, mb) for r, mb, _ in found] == [(1, 0)] and "only after W0: send it as soon as I0 ends" in found[0][2]


@pytest.mark.parametrize("p,m", [(2, 4), (3, 2), (4, 6), (4, 8)])
def test_w_right_after_its_own_i_breaks_zbh1_where_w_should_wait_and_is_a_valid_1f1b_split(p, m):
    """ZB-H1's own rule (issue 45): where the W's go. 1F1B with each backward split, W right after its I, keeps
    every other rule of ZB-H1; it is another valid schedule, whose message says the W's were never delayed."""
    from lab_src.pipeline.schedules import matching_schedules
    at_once = ideal_events(p, m, schedule="1f1b_split", activation_bytes=64)
    found = ZB.violations(at_once, p, m)
    assert [r for r, _, _ in found] == list(range(1, p)), found            # rank 0's W's wait for no later I
    assert "runs each W right after its own I" in found[0][2] and "the bubble stays 1F1B's" in found[0][2]
    assert [s.name for s in matching_schedules(at_once, p, m)] == ["1f1b_split"]
    assert ZB.violations(ideal_events(p, m, schedule="zbh1", activation_bytes=64), p, m) == []


# ---- the split, on one process --------------------------------------------------------------------------
def split_obs(reference, tmp_path, text=None):
    """What a "split" case observes of the reference (or `text` as the q16 answer), run here, in this process."""
    from lab_src import answers
    from lab_src.harness.case import Case
    from lab_src.topics.zero_bubble import kind
    mapping = dict(reference)
    if text is not None:
        (tmp_path / "q16.py").write_text(text)
        mapping["q16"] = str(tmp_path / "q16.py")
    cfg = LabConfig(num_stages=3, num_layers=4, num_microbatches=1, global_batch_size=2, dtype="float64", seed=5)
    obs = {}

    class Ctx:
        device = "cpu"
    with answers.use_answers(mapping):
        kind.run(Case(kind="split", qid="q16", config=cfg, answers=mapping, stages=1), Ctx, None, None, obs)
    return obs


def messages(problems) -> str:
    return " ".join(" ".join(p.message.split()) for p in problems)


def test_the_reference_split_equals_one_backward_does_its_work_once_and_frees_it(reference, tmp_path):
    obs = split_obs(reference, tmp_path)
    assert split_judge.numbers(obs, "float64") == split_judge.once(obs) == split_judge.freed(obs) == []
    stages = obs["split_stages"]
    assert [o["input_grad_diff"] for o in stages.values()] == [None, 0.0, 0.0]
    assert all(o["held_after_weight"] == 0 < o["held_before"] for o in stages.values())


def test_the_split_mistakes_on_one_process(reference, tmp_path):
    # the first way: W's second pass from the output goes over the input's path again
    obs = split_obs(reference, tmp_path, answer("q16_two_passes"))
    assert split_judge.numbers(obs, "float64") == [] and split_judge.freed(obs) == []
    assert "together do 1.50 times the floating-point work of one backward" in messages(split_judge.once(obs))
    obs = split_obs(reference, tmp_path, answer("q16_w_overwrites"))
    assert "backward_weight replaced what .grad held" in messages(split_judge.numbers(obs, "float64"))
    obs = split_obs(reference, tmp_path, answer("q16_b_frees_graph"))
    said = messages(split_judge.numbers(obs, "float64"))
    assert "stage 1 of 3 (a middle stage): RuntimeError: stage 1, micro-batch 0: backward_weight (W0) has nothing " \
           "left to work on: your backward_input let autograd free the graph" in said and "retain_graph=True" in said
    assert "stage 0" not in said              # the first stage's W does the whole backward: nothing was freed


KEEPS_KEPT = '''

_reference_w, _seen = backward_weight, []


def backward_weight(stage, kept):
    _seen.append(kept)              # "for later": a list of the answer's own that outlives W
    return _reference_w(stage, kept)
'''

CYCLE_IN_HELPER = '''

_reference_i = backward_input


def backward_input(stage, input_tensor, output_tensor, output_grad):
    input_grad, kept = _reference_i(stage, input_tensor, output_tensor, output_grad)
    box = {"kept": kept}
    box["self"] = box               # a helper's reference cycle: only the garbage collector frees it
    return input_grad, kept
'''


@pytest.mark.parametrize("extra", [KEEPS_KEPT, CYCLE_IN_HELPER], ids=["own_list", "reference_cycle"])
def test_a_graph_kept_alive_after_w_is_said_as_what_is_held_not_blamed_on_retain_graph(reference, tmp_path, extra):
    """Issue 41, item 2: the memory rule said "without retain_graph=True" when the graph was kept alive by a
    reference of the answer's own. It reads the bytes still held (harness/memory.py), never the source, and
    says what is kept; retain_graph=True is one way among others."""
    import gc
    text = Path(reference["q16"]).read_text() + extra
    gc.disable()                    # the cycle's graph lives until a collection: none runs during the split
    try:
        obs = split_obs(reference, tmp_path, text)
    finally:
        gc.enable()
        gc.collect()
    assert split_judge.numbers(obs, "float64") == split_judge.once(obs) == []
    found = split_judge.freed(obs)
    said = messages(found)
    assert [p.message.split(":")[0] for p in found] == [
        "stage 1 of 3 (a middle stage)", "stage 2 of 3 (the last stage, whose output is its loss)"]
    held = obs["split_stages"][1]["held_after_weight"]
    assert held > 0 and f"after its W, micro-batch 0's graph is still alive: {held} bytes of the tensors its " \
                        f"forward saved for backward are still held" in said
    assert "held in a dict, list or cache that outlives W" in said and "in a reference cycle of a helper" in said
    assert "retain_graph=True on the last pass over those nodes is one way" in said


# ---- wrong steps, graded (one launch each) ----------------------------------------------------------------
def test_1f1b_handed_in_keeps_half_and_is_told_what_zero_bubble_moves(reference, tmp_path, no_leftovers):
    verdict = grade_answer("q16", answer("q16_one_f_one_b"), reference, tmp_path)
    assert verdict["fraction"] == pytest.approx((1 + 0.5) / 2, abs=1e-4)      # the split right, half of each pipeline
    text = " ".join("\n".join(verdict["messages"]).split())
    assert "your step is a valid One-Forward-One-Backward schedule, but this exercise asks for ZB-H1" in text
    assert "moves rank r's W's r slots later, into the time 1F1B spends waiting" in text


def test_each_w_right_after_its_own_i_is_1f1b_split_and_keeps_half_of_each_pipeline(reference, tmp_path, no_leftovers):
    """The W's never delayed (issue 45): a valid schedule, but not zero bubble; the single stage and the single
    micro-batch are ZB-H1 too (W right after its I is ZB-H1's order there)."""
    verdict = grade_answer("q16", answer("q16_w_at_once"), reference, tmp_path)
    assert verdict["fraction"] == pytest.approx((1 + (2 + 4 / 2) / 6) / 2, abs=1e-4)
    text = " ".join("\n".join(verdict["messages"]).split())
    assert "your step is a valid One-Forward-One-Backward with the backward split (each W right after its I) " \
           "schedule, but this exercise asks for ZB-H1" in text
    assert "runs each W right after its own I" in text and "the bubble stays 1F1B's" in text
    assert "rank r runs backward k's W right after backward k + r's I" in text


# ZB-H1 written another way: the W's kept in a queue, each rank's r-th backward's I releasing its oldest W
DEQUE_ZBH1 = [("        if len(done) > r:                        # rank r runs its W's r backwards late\n"
               "            stage.backward_weight(microbatch=done[len(done) - 1 - r])\n",
               "        if len(done) > r:\n            stage.backward_weight(microbatch=done.popleft())\n"),
              ("    for mb in done[max(0, len(done) - r):]:      # the W's left: where 1F1B would wait\n"
               "        stage.backward_weight(microbatch=mb)\n",
               "    while done:\n        stage.backward_weight(microbatch=done.popleft())\n"),
              ("    inputs, outputs, logits, losses, done = {}, {}, [], [], []",
               "    inputs, outputs, logits, losses, done = {}, {}, [], [], collections.deque()"),
              ("def zero_bubble_step(", "import collections\n\n\ndef zero_bubble_step(")]


def test_zbh1_written_with_a_queue_keeps_full_marks(reference, tmp_path, no_leftovers):
    text = Path(reference["q16"]).read_text()
    for old, new in DEQUE_ZBH1:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    verdict = grade_answer("q16", text, reference, tmp_path)
    assert verdict["fraction"] == 1.0, verdict["messages"]


def test_a_gradient_sent_after_w_and_missing_ws(reference, tmp_path, no_leftovers):
    late = grade_answer("q16", answer("q16_send_after_w"), reference, tmp_path / "late")
    text = " ".join("\n".join(late["messages"]).split())
    assert "goes to the previous stage only after W0: send it as soon as I" in text and "differ" not in text
    assert late["fraction"] == pytest.approx((1 + 2 / 6) / 2, abs=1e-4)   # 1 stage and 1 micro-batch: nothing sent late
    missing = grade_answer("q16", answer("q16_no_last_w"), reference, tmp_path / "missing")
    text = " ".join("\n".join(missing["messages"]).split())
    assert "backward_weight (W) never ran for micro-batches 3, 4, 5 after its backward_input (I)" in text
    assert missing["fraction"] == pytest.approx((1 + 1 / 6) / 2, abs=1e-4)


def test_w_before_its_i_is_named_where_it_runs(reference, tmp_path, no_leftovers):
    verdict = grade_answer("q16", answer("q16_w_before_b"), reference, tmp_path)
    text = " ".join("\n".join(verdict["messages"]).split())
    assert "backward_weight (W0) runs before backward_input (I0) of the same micro-batch" in text
    assert verdict["fraction"] == pytest.approx(0.5, abs=1e-4)              # the split itself is right


RAISES_IN_W = '''

_reference_w = backward_weight


def backward_weight(stage, kept):
    if stage.pp_rank == 1:
        raise KeyError("kept")      # stage 1's first W, its gradient already sent to stage 0
    return _reference_w(stage, kept)
'''


def test_a_rank_that_raises_in_w_after_sending_its_gradient_ends_the_case_at_once(
        reference, answers_with, tmp_path, no_leftovers):
    """Stages 0 and 2 finish their part and wait at the barrier that ends the case; stage 1 raised in its
    first W. It meets them there (worker.meet_the_others), so they end with no error of their own instead
    of timing out in that barrier (15 s later, which the report then had to sort out)."""
    from pathlib import Path

    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    text = Path(reference["q16"]).read_text() + RAISES_IN_W
    cfg = LabConfig(num_stages=3, num_layers=6, num_microbatches=2, global_batch_size=4)
    run = run_cases([Case(kind="pipeline", qid="q16", config=cfg, answers=answers_with(q16=text))], tmp_path,
                    timeout_s=15)
    (out,) = run.outcomes
    errors = out.errors()
    assert sorted(errors) == [1] and errors[1]["type"] == "KeyError", errors
    assert out.stuck is None and out.failure is None


# ZB-H1 with each rank's late W moved before its I: rank 0's W of backward k comes right before its I of the
# same backward, and raises (nothing kept yet); the other ranks' late W's are of earlier backwards, and run
LATE_W_FIRST = (("        input_grad = stage.backward_input(inputs.pop(mb), outputs.pop(mb), grad, microbatch=mb)\n"
                 "        if not stage.is_first_stage:\n"
                 '            stage.send(input_grad, r - 1, "send_backward", mb)      # the previous stage waits for '
                 "it: now\n"),
                ("        done.append(mb)\n"
                 "        if len(done) > r:                        # rank r runs its W's r backwards late\n"
                 "            stage.backward_weight(microbatch=done[len(done) - 1 - r])\n"))


def late_w_first(reference) -> str:
    text = Path(reference["q16"]).read_text()
    i_and_send, late_w = LATE_W_FIRST
    assert text.count(i_and_send + late_w) == 1
    return text.replace(i_and_send + late_w, late_w + i_and_send)


def test_a_send_whose_delivery_the_step_end_waits_for_is_seen_waiting():
    """A stage posts its sends (B and E as it posts them) and waits for their delivery at the end of its step
    (PipelineStage.flush, journalled A, then E once delivered). When every rank has done its part and one is
    held there by a peer that raised, and posts no receive, the case is stuck: the watch stops it instead of
    letting it wait for the group's timeout (issue 41)."""
    import time as clock

    from lab_src.harness.deadlock import Progress
    p = Progress()

    def feed(rank, *lines):
        for tag, payload in lines:
            p.feed(rank, clock.perf_counter(), tag, payload)
    for r in range(3):
        feed(r, ("C", "start 0"))
    feed(0, ("B", ["0", "recv_backward", 0, 1]), ("E", ["0", "recv_backward", 0, 1]), ("W", ["0"]))  # raised after
    feed(1, ("B", ["0", "send_backward", 0, 0]), ("E", ["0", "send_backward", 0, 0]),
         ("B", ["0", "send_backward", 1, 0]), ("E", ["0", "send_backward", 1, 0]), ("W", ["0"]))
    feed(2, ("W", ["0"]))
    assert p.stuck(0, 3) is None                        # every rank has done its part: the case may end
    feed(1, ("A", ["0", "send_backward", 0, 0]), ("E", ["0", "send_backward", 0, 0]))    # delivered: rank 0 took it
    assert p.stuck(0, 3) is None
    feed(1, ("A", ["0", "send_backward", 1, 0]))        # rank 0 posts no second receive from rank 1
    stuck = p.stuck(0, 3)
    assert stuck is not None and stuck.finished == [0, 1, 2] and not stuck.waits
    assert stuck.lines() == ["rank 0 has done its part",
                             ("rank 1 has done its part; its send_backward(mb=1) to rank 0 never got a matching "
                              "receive"),
                             "rank 2 has done its part"]
    q = Progress()                                      # the same wait, its receive posted: it goes on
    for r in range(2):
        q.feed(r, 0.0, "C", "start 0")
    q.feed(0, 0.0, "B", ["0", "send_forward", 0, 1])
    q.feed(0, 0.0, "E", ["0", "send_forward", 0, 1])
    q.feed(0, 0.0, "W", ["0"])
    q.feed(1, 0.0, "B", ["0", "recv_forward", 0, 0])
    q.feed(1, 0.0, "E", ["0", "recv_forward", 0, 0])
    q.feed(1, 0.0, "W", ["0"])
    q.feed(0, 0.0, "A", ["0", "send_forward", 0, 1])
    assert q.stuck(0, 2) is None


def test_a_rank_left_waiting_for_its_sends_delivery_after_a_peer_raised_is_stopped_at_once(
        reference, answers_with, tmp_path, no_leftovers):
    """Rank 0 raises in its first W (before its I); rank 1 has posted its second input gradient to rank 0,
    which will never receive it, and waits for its delivery at the end of its step. That wait is journalled,
    so the watch stops the case at once: it waited for the group's timeout (10 s a case, 2 cases in the check)."""
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    cfg = LabConfig(num_stages=3, num_layers=6, num_microbatches=2, global_batch_size=4)
    run = run_cases([Case(kind="pipeline", qid="q16", config=cfg, answers=answers_with(q16=late_w_first(reference)))],
                    tmp_path, timeout_s=15)
    (out,) = run.outcomes
    errors = out.errors()
    assert errors[0]["type"] == "RuntimeError" and "backward_weight (W0) runs before backward_input (I0)" in \
        errors[0]["message"], errors
    assert out.stuck is not None and out.stuck.finished == [0, 1, 2], out.stuck
    assert errors[1]["type"] == errors[2]["type"] == "StoppedWaiting", errors
    said = messages(case_problems(out))
    assert "the other ranks were left waiting until the check stopped the run: rank 1 had done its part; its " \
           "send_backward(mb=1) to rank 0 never got a matching receive" in said, said


def test_the_check_of_a_right_split_and_a_w_before_its_i_says_the_split_passed_first(reference, in_tmp, capsys,
                                                                                    monkeypatch, no_leftovers):
    """Issue 41, item 2: the split ran after the steps, was skipped once two of them had deadlocked, and the
    report began with "not run: 2 earlier cases of q16 deadlocked or timed out (the split alone ...)". The split
    now runs first; the report says it passed, then the cause, then what it caused."""
    import time

    from lab_src import grading
    from lab_src.answers import answers_dir
    from lab_src.checks import check
    from lab_src.registry import EXERCISES
    monkeypatch.setattr(grading, "_checked", dict(grading._checked))     # this check's failure stays in this test
    folder = answers_dir()
    folder.mkdir()
    for qid in EXERCISES["q16"].needs:
        (folder / EXERCISES[qid].answer_file).write_text(Path(reference[qid]).read_text())
    (folder / EXERCISES["q16"].answer_file).write_text(late_w_first(reference))
    started = time.monotonic()
    report = check("q16")
    took = time.monotonic() - started
    verdict = report.verdict()
    assert not report.ok and verdict[0] == "q16: FAILED, 1 problem, and what it caused", verdict
    said = " ".join(" ".join(verdict).split())
    assert said.index("Passed: the split alone, each stage of 3, float64: backward_input and backward_weight give "
                      "one backward()'s gradients") < said.index("[q16] rank 0: RuntimeError: stage 0, micro-batch 0: "
                                                                 "backward_weight (W0) runs before backward_input (I0)")
    assert "not run" not in said and "What that caused" in said
    assert report.stages() == 4                          # the timeline's case: the 4-stage step
    # both steps stopped by the watch, not by the group's timeout (10 s each; the check took 26 s, 9 s now)
    assert [o.stuck is not None for o in report.run.outcomes] == [True, True, False]
    print(f"the check took {took:.1f} s")


def test_a_case_not_run_is_said_in_a_check_as_what_the_earlier_cases_caused():
    from types import SimpleNamespace

    from lab_src.checks.common import errors
    not_run = {"type": "NotRun", "message": "not run: 2 earlier cases of q16 deadlocked or timed out", "pending": None,
               "where": []}
    skipped = SimpleNamespace(failure=None, stuck=None, case=SimpleNamespace(index=2),
                              errors=lambda: {0: not_run})
    (problem,) = errors(skipped, "q16", "the split alone")
    assert problem.consequence and problem.message.startswith("not run")
    stopped = SimpleNamespace(failure="case 2 not run: earlier cases of q16 stopped the run 2 times", stuck=None,
                              case=SimpleNamespace(index=2), errors=dict)
    assert errors(stopped, "q16", "the split alone")[0].consequence
    raised = SimpleNamespace(failure=None, stuck=None, case=SimpleNamespace(index=0), errors=lambda: {
        0: {"type": "RuntimeError", "message": "W0 before I0", "pending": None, "where": []}})
    assert not errors(raised, "q16", "4 stages")[0].consequence


# ---- Validate: the study is skipped ------------------------------------------------------------------------
def test_the_study_launches_nothing_under_validate_or_after_a_failed_check(monkeypatch, capsys):
    from lab_src import grading
    from lab_src.checks import zero_bubble_study as study
    monkeypatch.setattr(study, "run_cases", lambda *a, **k: pytest.fail("the study launched"))
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert study.zero_bubble_study() is None
    assert "skipped under Validate" in capsys.readouterr().out
    monkeypatch.delenv("NBGRADER_EXECUTION")
    monkeypatch.setitem(grading._checked, "q16", "CheckFailed: q16: FAILED, 1 problem\n[q16]: still the stub")
    assert study.zero_bubble_study() is None
    assert "the check above did not pass: make it pass first" in capsys.readouterr().err
    assert study.ideal_bubbles(4, 8) == {"1f1b": pytest.approx(3 / 11, abs=1e-4), "zbh1": pytest.approx(3 / 27, abs=1e-4)}


@pytest.mark.slow
def test_validate_of_the_released_q16_runs_the_check_and_skips_the_study(reference, tmp_path, no_leftovers):
    import json
    import os
    import shutil
    import subprocess
    import sys
    import time

    from lab_src.registry import EXERCISES
    from tests.test_validate import ROOT
    notebook = ROOT / "notebooks" / EXERCISES["q16"].assignment / EXERCISES["q16"].notebook
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id == "q16_answer":
            cell["source"] = "%%answer q16\n" + open(reference["q16"]).read()
        if grade_id == "q16_why":
            cell["source"] = "The last stage starts the chain of I's that everybody upstream waits for."
    (tmp_path / notebook.name).write_text(json.dumps(nb, indent=1))
    (tmp_path / "answers").mkdir()
    for qid in EXERCISES["q16"].needs:
        shutil.copyfile(reference[qid], tmp_path / "answers" / EXERCISES[qid].answer_file)
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.Execute.timeout = 60\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "LAB_ANSWERS", "LAB_ANSWERS_DIR")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "validate", notebook.name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    print(f"nbgrader validate q16: {time.monotonic() - started:.1f} s\n{out}")
    assert "Success! Your notebook passes all the tests." in out
    assert not list((tmp_path / "runs").glob("q16-study-*")), "the study launched under Validate"


def test_a_half_still_the_release_stub_is_named_as_the_stub():
    """backward_input and backward_weight are called by the lab's stage, not through lab_src.exercises: their
    release stub (a bare NotImplementedError()) used to be reported with a blank cause (issue 41)."""
    from lab_src import answers
    from lab_src.pipeline.split import _named_stub

    def backward_input(stage, input_tensor, output_tensor, output_grad):
        raise NotImplementedError()

    def own(stage, kept):
        raise NotImplementedError("W of a frozen layer")
    with pytest.raises(answers.StubCalled, match=r"q16 backward_input\(\) is still the stub from the release .*"
                                                 r"replace it with your code in q16_zero_bubble_step.ipynb"):
        _named_stub(backward_input, "q16", "backward_input")(None, None, None, None)
    with pytest.raises(NotImplementedError, match="W of a frozen layer"):
        _named_stub(own, "q16", "backward_weight")(None, None)


def test_the_study_before_q11_is_answered_says_what_to_do_without_a_traceback(reference, in_tmp, monkeypatch, capsys):
    """The study runs q12's step, which needs q11: with no q11 answer yet it says so and runs nothing (it raised
    a 20-line traceback through the lab, issue 41)."""
    import json
    from lab_src.checks.zero_bubble_study import zero_bubble_study
    (in_tmp / "map.json").write_text(json.dumps({q: p for q, p in reference.items() if q != "q11"}))
    monkeypatch.setenv("LAB_ANSWERS", str(in_tmp / "map.json"))
    assert zero_bubble_study() is None
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("Nothing was run: q12 needs your answer to q11 (p2p_communicate): open "
                          "q11_p2p_communicate.ipynb"), err
    assert not (in_tmp / "runs").exists()

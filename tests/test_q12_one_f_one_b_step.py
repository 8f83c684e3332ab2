"""q12 (one_f_one_b_step): 1F1B's rules from the events (the memory bound and 1F1B's one order), what a wrong
step is told in 1F1B's terms, activation memory counted and drawn (the memory lane, the schedule pictures, the
experiments' figures), and wrong answers graded through the hidden tests (the cohort's wren and yuki carry the
warm-up off by one and the missing cool-down)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from grader.cohort.answers import answer
from hidden_grading import grade_answer
from lab_src.judge.one_f_one_b import diagnose
from lab_src.pipeline.schedules import schedule
from lab_src.pipeline.trace import Event
from lab_src.views.ideal import ideal_events

pytestmark = pytest.mark.q12

# Q8's schedule, written with Q11's operations, in q12's place: the numbers match, the order is AFAB's.
AFAB_AS_1F1B = answer("q12_afab_order")


def compute_events(orders: dict[int, str]) -> list[Event]:
    """Events of ranks whose compute order is given as 'F0 F1 B0 ...', one unit of time each."""
    events = []
    for r, order in orders.items():
        for t, op in enumerate(order.split()):
            events.append(Event(r, "forward" if op[0] == "F" else "backward", int(op[1:]), None, None, 0, t, t + 0.5))
    return events


# ---- the rules and what a wrong order is told ---------------------------------------------------------
def test_1f1b_has_one_order_a_short_warm_up_breaks_it_without_breaking_the_memory_bound():
    sched = schedule("1f1b")
    assert sched.violations(ideal_events(4, 6, schedule="1f1b"), 4, 6) == []
    # rank 0 of 2 with no warm-up: F0 B0 F1 B1 holds one micro-batch at a time, fewer than 1F1B's two
    short = compute_events({0: "F0 B0 F1 B1 F2 B2", 1: "F0 B0 F1 B1 F2 B2"})
    broken = sched.violations(short, 2, 3)
    assert [(r, mb) for r, mb, _ in broken] == [(0, 0)]
    assert "rank 0 runs F0 B0 F1 B1 F2 B2; One-Forward-One-Backward runs F0 F1 B0 F2 B1 B2 (1 warm-up" in broken[0][2]
    problems = diagnose(short, 2, 3)
    assert len(problems) == 1 and "runs 1 forward before its first backward; 1F1B runs 2" in problems[0].message
    assert "The warm-up is off by -1" in problems[0].message


def test_a_missing_cool_down_is_named_from_the_events_of_a_run_that_hung():
    # 4 stages, 6 micro-batches, the steady state and nothing after it: rank 0 never runs B3 B4 B5
    events = [e for e in ideal_events(4, 6, schedule="1f1b") if e.is_compute]
    cut = []
    for r in range(4):
        warm = schedule("1f1b").warmup(r, 4, 6)
        cut += [e for e in events if e.rank == r and not (e.kind == "backward" and e.microbatch >= 6 - warm)]
    problems = diagnose(cut, 4, 6)
    assert [p.rank for p in problems] == [0, 1, 2]
    assert "micro-batch(es) 3, 4, 5 went forward on this rank but never backward" in problems[0].message
    assert "the cool-down runs the backwards of the last 3 micro-batch(es)" in problems[0].message


def test_an_afab_run_is_told_what_1f1b_changes():
    from lab_src.judge.realness import WRONG_SCHEDULE, check_order
    afab = ideal_events(4, 6, schedule="afab")
    problems = check_order(afab, 4, 6, schedule("1f1b"))
    assert len(problems) == 1 and problems[0].message.startswith(WRONG_SCHEDULE)
    assert "valid All-Forward-All-Backward schedule, but this exercise asks for One-Forward-One-Backward" in \
        problems[0].message
    assert "rank r holds at most min(p - r, m) micro-batches at once, not all m" in problems[0].message


# ---- memory: counted, drawn --------------------------------------------------------------------------
def test_saved_bytes_grow_with_each_forward_and_fall_with_each_backward(reference):
    import torch
    from lab_src.answers import use_answers
    from lab_src.harness.memory import counting
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.stage import PipelineStage
    from lab_src.pipeline.trace import Tracer, tracing
    cfg = LabConfig(num_stages=2, num_layers=4)
    with use_answers(reference):
        stage = PipelineStage(cfg, 1, 2, 2)
    tracer = Tracer(1)
    xs = [torch.randn(stage.activation_shape, requires_grad=True) for _ in range(3)]
    with tracing(tracer), counting(stage, tracer) as saved:
        losses = [stage.forward(x, microbatch=i).mean() for i, x in enumerate(xs)]
        after_forwards, counted = saved.now, set(saved.storages)
        stage.backward(xs[0], losses[0], None, microbatch=0)
        after_one_backward = saved.now
        for i in (1, 2):
            stage.backward(xs[i], losses[i], None, microbatch=i)
    held = [e.held for e in tracer.events]
    assert held[0] > 0 and held[:3] == sorted(held[:3]) and held[2] == after_forwards == saved.peak
    assert held[2] == pytest.approx(3 * held[0], rel=0.01)             # three micro-batches, the same size each
    assert after_one_backward == pytest.approx(2 * held[0], rel=0.01)  # the first backward freed its own
    assert saved.now == 0 and held[-1] == 0
    # the weights autograd saves (a linear layer's, for its input's gradient) are the model's, not a micro-batch's
    params = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    assert counted and not counted & params


def test_the_memory_lane_is_drawn_in_the_figure_the_widget_frame_and_the_chrome_trace():
    from lab_src.views import svg
    from lab_src.views.chrome_trace import to_chrome_trace
    from lab_src.views.schedule_figure import with_in_flight
    from lab_src.views.timeline import prepare, static_figure
    events = [replace(e, held=e.held * 1000) for e in with_in_flight(ideal_events(4, 6, schedule="1f1b"))]
    fig = static_figure(events, 4, 6, schedule="1f1b")
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    # under the measured timeline and under the ideal one, from what a micro-batch cost each rank (issue 27)
    assert sum("activation memory per rank" in t for t in titles) == 2
    assert "peak: rank 0 3.91, rank 1 2.93, rank 2 1.95, rank 3 0.977 KiB" in titles[1]
    assert titles[3].startswith("ideal: activation memory per rank (peak: rank 0 3.91, rank 1 2.93, rank 2 1.95")
    frame = svg.frame(prepare(events, 4, 6), 10)
    assert frame.count("<polyline") >= 4 and ">memory</text>" in frame
    assert ">— rank 0</text>" in frame and ">— rank 3</text>" in frame         # the lanes, labelled by rank
    assert "memory" not in svg.frame(prepare([replace(e, held=0) for e in events], 4, 6), 10)
    from lab_src.views.timeline import timelines
    from lab_src.views.widget import TimelineWidget
    side = TimelineWidget(*timelines(events, 4, 6, schedule="1f1b")).side.value
    assert "Activation memory</b> (peak held for backward)<br>rank 0 3.9 KiB, rank 1 2.9 KiB" in side
    counters = [e for e in to_chrome_trace(events)["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == len(events) and max(c["args"]["bytes held for backward"] for c in counters) == 4000


def test_the_schedule_pictures_show_afab_holding_all_and_1f1b_holding_p_minus_r():
    from lab_src.views.schedule_figure import schedule_figure
    fig = schedule_figure(("afab", "1f1b"), p=4, m=8)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert len(fig.axes) == 4
    assert "All-Forward-All-Backward" in titles[0] and "held per rank: 8 / 8 / 8 / 8" in titles[0]
    assert "One-Forward-One-Backward" in titles[2] and "held per rank: 4 / 3 / 2 / 1" in titles[2]
    assert "bubble 27.3% vs theory" in titles[0] and "bubble 27.3% vs theory" in titles[2]
    assert not any(t.get_text().startswith("sent ") for ax in fig.axes for t in ax.texts)   # no "sent 0 B"


def test_the_experiments_figures_draw_memory_and_bubble_against_m():
    from lab_src.checks.experiments import Runs
    from lab_src.pipeline.config import DEMO
    runs = Runs()
    for m in (4, 8, 16):
        runs.rows.append({"schedule": "afab", "m": m, "step_s": 0.1, "bubble": 0.5,
                          "peak": {r: 1000 * m for r in range(4)}, "held": {r: m for r in range(4)}})
        runs.rows.append({"schedule": "1f1b", "m": m, "step_s": 0.1, "bubble": 0.5,
                          "peak": {r: 1000 * (4 - r) for r in range(4)}, "held": {r: 4 - r for r in range(4)}})
    fig = runs.figure()
    assert [ax.get_title() for ax in fig.axes] == ["All-Forward-All-Backward\nmicro-batches held at m = 16: "
                                                  "16 / 16 / 16 / 16", "One-Forward-One-Backward\nmicro-batches "
                                                  "held at m = 16: 4 / 3 / 2 / 1"]
    assert "AFAB" not in runs.table() and "One-Forward-One-Backward" in runs.table()
    bubbles = Runs(kind="bubble", config=DEMO, rows=[{"schedule": "1f1b", "m": m, "step_s": 1.0, "bubble": b,
                                                       "emulated": e, "peak": {}, "held": {}}
                                                      for m, b, e in ((1, 0.8, 0.75), (8, 0.3, 0.27))])
    ax = bubbles.figure().axes[0]
    assert any("naive model parallelism" in t.get_text() for t in ax.texts)
    # issue 41: beside the wall clock, the run's own order with emulated compute (4 ranks on a 2-core hub)
    assert [line.get_label() for line in ax.get_lines()] == ["theory (p-1)/(m+p-1)", "measured (wall clock)",
                                                           "emulated compute (your run's order)"]


# ---- real runs ------------------------------------------------------------------------------------------
def test_afab_submitted_for_1f1b_gets_the_numbers_right_and_half_credit(reference, tmp_path, no_leftovers):
    verdict = grade_answer("q12", AFAB_AS_1F1B, reference, tmp_path)
    # one micro-batch: AFAB is 1F1B; the 6 other cases keep q12's other_schedule_credit (half); the warm-up
    # prediction is right
    assert verdict["fraction"] == pytest.approx((1 + 6 * 0.5 + 1) / 8, abs=1e-4)
    text = " ".join("\n".join(verdict["messages"]).split())   # messages wrap at 110 columns
    assert "your step is a valid All-Forward-All-Backward schedule, but this exercise asks for " \
           "One-Forward-One-Backward" in text
    # said once (judge/summary.py), on the first case it showed in, with the bound of that run, and where else
    assert "One-Forward-One-Backward holds at most 1 on rank 0 of 1" in text and "not all m" in text
    assert "also on rank 2 (fewer micro-batches than stages); rank 0 (more micro-batches than stages); rank 0 " \
           "(uneven layers, seed 7); rank 1 (float64, seed 123)" in text
    assert "differ" not in text                        # the numbers are right


def test_a_warm_up_without_min_m_fails_where_m_is_at_most_p_minus_2(reference, tmp_path, no_leftovers):
    # p - r - 1 warm-up forwards without min(., m): right while m >= p - 1, and with 4 stages and 2
    # micro-batches rank 0 runs a forward for a micro-batch that does not exist
    text = answer("q12_warmup_no_min")
    assert "min(" not in text.split("warmup =")[1].splitlines()[0]
    verdict = grade_answer("q12", text, reference, tmp_path)
    # and its prediction, p - r - 1 for m = 2 too, is the 8th item, wrong
    assert verdict["fraction"] == pytest.approx(6 / 8, abs=1e-4), verdict["messages"]
    said = " ".join("\n".join(verdict["messages"]).split())
    assert "4 stages, 2 micro-batches" in said
    assert "predicted_warmup() says the warm-ups for p = 4, m = 2 are 3, 2, 1, 0 (ranks 0 to 3); 1F1B's differ: " \
           "with only 2 micro-batches there are only 2 forwards to run" in said
    assert "m = 8 are" not in said


@pytest.mark.slow
def test_the_visible_check_and_the_memory_experiment(reference, in_tmp, capsys, no_leftovers):
    from lab_src.answers import answers_dir
    from lab_src.checks import check
    from lab_src.checks.experiments import memory_vs_microbatches
    from lab_src.registry import EXERCISES
    folder = answers_dir()
    folder.mkdir()
    for qid in ("q02", "q03", "q04", "q05", "q06", "q07", "q08", "q11", "q12"):
        (folder / EXERCISES[qid].answer_file).write_text(open(reference[qid]).read())
    report = check("q12")
    out = capsys.readouterr().out
    assert report.ok and "micro-batches held awaiting backward, at most: 4, 3, 2, 1 (ranks 0..3)" in out
    assert any(e.held for e in report.timeline_events(0))
    runs = memory_vs_microbatches(ms=(4, 16))
    afab = {row["m"]: row["peak"] for row in runs.of("afab")}
    one = {row["m"]: row["peak"] for row in runs.of("1f1b")}
    for r in range(4):
        assert afab[16][r] == pytest.approx(4 * afab[4][r], rel=0.02)      # AFAB: linear in m
        assert one[16][r] == pytest.approx(one[4][r], rel=0.02)            # 1F1B: flat once m >= p - r
    assert [row["held"] for row in runs.of("1f1b")][-1] == {0: 4, 1: 3, 2: 2, 3: 1}
    from lab_src.checks.experiments import latest     # issue 55: the 1000-micro-batch cell finds it on its own
    assert latest("memory") is runs


# ---- issue 27: named mistakes, causes before consequences, studies under Validate, runs/ kept small ----
def test_a_warm_up_without_min_is_named_not_a_bare_stop_iteration():
    from lab_src.judge.failures import from_error
    p = from_error(0, {"type": "StopIteration", "message": "", "where": [
        ["q12_one_f_one_b_step.py", 10, "forward", "x = next(data_iter)"]]})
    assert p.message.startswith("StopIteration: the step asked data_iter for a micro-batch after the last one")
    assert "min(p - r - 1, m)" in p.message and "line 10" in p.message


def test_the_broken_order_comes_before_the_gradients_it_caused():
    from lab_src.checks.step_check import causes_then_numbers
    from lab_src.judge.problems import Problem
    order, numbers = Problem("rank 0 runs F0 B1", rank=0), Problem("26 of 26 gradients differ", rank=0)
    out = type("Out", (), {"events": lambda self: [], "case": type("C", (), {"stages": 2, "microbatches": 2})()})()
    found = causes_then_numbers("q12", out, [order], [numbers])
    assert found[0] is order and found[-1].message == numbers.message and found[-1].consequence
    assert causes_then_numbers("q12", out, [], [numbers]) == [numbers]


def test_counts_are_said_in_the_singular_when_there_is_one():
    from lab_src.pipeline.config import LabConfig
    assert LabConfig(num_stages=1, num_layers=1, num_microbatches=1, global_batch_size=2).describe().startswith(
        "1 stage, 1 layer, batch 2 in 1 micro-batch,")
    events = compute_events({0: "F0 B0 F1 B1", 1: "F0 B0 F1 B1"})
    assert "1 warm-up forward on rank 0 of 2 stages" in diagnose(events, 2, 2)[0].message


def test_the_studies_launch_nothing_under_validate(monkeypatch, capsys):
    from lab_src.checks import experiments
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert experiments.skipped_under_validate() is True
    assert experiments.bubble_vs_microbatches() is None and experiments.memory_vs_microbatches() is None
    assert capsys.readouterr().out.count("skipped under Validate") == 3
    monkeypatch.delenv("NBGRADER_EXECUTION")
    assert experiments.skipped_under_validate() is False


def test_runs_keeps_the_last_few_runs_of_each_exercise(tmp_path, monkeypatch):
    import os
    from lab_src.harness.runfolder import prune
    for i in range(5):
        for name in (f"q12-2026010{i}-000000-1", f"q12-bubble-2026010{i}-000000-1"):
            (tmp_path / name).mkdir()
            os.utime(tmp_path / name, (i, i))
    removed = prune(tmp_path, "q12", keep=3)
    assert sorted(d.name for d in removed) == ["q12-20260100-000000-1", "q12-20260101-000000-1",
                                               "q12-20260102-000000-1"]
    assert len(list(tmp_path.glob("q12-bubble-*"))) == 5          # another experiment's runs are its own
    monkeypatch.setenv("LAB_KEEP_RUNS", "0")
    assert prune(tmp_path, "q12-bubble") == []                     # 0 keeps every run


def test_runs_holds_at_most_its_size_and_keeps_no_observations(tmp_path):
    """runs/ on a hub (issue 41): a cap in MB over every run, the oldest removed first and the newest always
    kept; a finished check's observations (read into its report) are not kept on disk."""
    import os
    from lab_src.harness.runfolder import cap_size, drop_observations
    for i, (name, mb) in enumerate([("q15-bubble-1", 30), ("q16-study-1", 30), ("q12-1", 1), ("q16-study-2", 30)]):
        (tmp_path / name / "obs").mkdir(parents=True)
        (tmp_path / name / "obs" / "c0.rank0.pt").write_bytes(b"0" * int(mb * 1e6))
        (tmp_path / name / "events-c0.json").write_text("[]")
        os.utime(tmp_path / name, (i, i))
    assert [d.name for d in cap_size(tmp_path, 62)] == ["q15-bubble-1"]          # 91 MB -> 61 MB
    assert [d.name for d in cap_size(tmp_path, 10)] == ["q16-study-1", "q12-1"]   # the newest stays, over the cap
    assert cap_size(tmp_path, 0) == [] and [d.name for d in tmp_path.iterdir()] == ["q16-study-2"]
    drop_observations(tmp_path / "q16-study-2")
    assert sorted(p.name for p in (tmp_path / "q16-study-2").iterdir()) == ["events-c0.json"]


# ---- issue 27: the warm-up prediction, graded (judge/one_f_one_b.py) ------------------------------------
def test_the_warm_up_prediction_is_graded_without_giving_the_counts(tmp_path):
    from grader.hidden.q12_one_f_one_b_step import prediction_item
    from lab_src.checks.q12_one_f_one_b_step import prediction_line
    from lab_src.judge.one_f_one_b import expected_prediction
    assert expected_prediction() == {"m8_rank0": 3, "m8_rank1": 2, "m8_rank2": 1, "m8_rank3": 0,
                                     "m2_rank0": 2, "m2_rank1": 2, "m2_rank2": 1, "m2_rank3": 0}

    def graded(text):
        path = tmp_path / "q12.py"
        path.write_text(text)
        ctx = type("Ctx", (), {"student": {"q12": str(path)}})()
        return prediction_item(ctx), prediction_line(str(path))

    item, line = graded(answer("q12_no_cooldown"))                       # right
    assert item.passed and item.part == "pipelines" and line.endswith("matches 1F1B's warm-ups (graded)")
    item, line = graded(answer("q12_warmup_off_by_one"))                 # p - r: wrong for both m
    assert [p.exercise for p in item.problems] == ["q12", "q12"] and item.score == 0
    assert "the warm-ups for p = 4, m = 8 are 4, 3, 2, 1 (ranks 0 to 3); 1F1B's differ: a rank runs forwards " \
           "until the gradient of its first micro-batch can come back" in str(item.problems[0])
    assert line.startswith("your prediction (predicted_warmup, p = 4, m = 8 and m = 2): differs from 1F1B (graded)")
    stub, line = graded("def predicted_warmup():\n    raise NotImplementedError()\n")
    assert "predicted_warmup() is still the stub" in stub.problems[0].message and "not read" in line
    item, _ = graded("def predicted_warmup():\n    return {'m8_rank0': 3}\n")
    assert "gives no 'm8_rank1', 'm8_rank2', 'm8_rank3' entry" in item.problems[0].message
    computed, _ = graded("def predicted_warmup():\n    return {f'm8_rank{r}': 3 - r for r in range(4)}\n")
    assert not computed.passed


def test_the_bubble_study_draws_the_students_own_step_beside_the_ideal_view(monkeypatch):
    """Issue 27: a run of the bubble study (compute dominates) drawn as a timeline, the ideal view with its
    memory lane under it; no launch here: the study's view is made from the schedule model."""
    from lab_src.checks.experiments import Runs
    from lab_src.pipeline.config import DEMO
    from lab_src.views.schedule_figure import with_in_flight
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")        # the static figure, not the widget
    events = [replace(e, held=e.held * 1000) for e in with_in_flight(ideal_events(4, 8, schedule="1f1b"))]
    runs = Runs(kind="bubble", config=DEMO)
    runs.views["1f1b", 8] = {"events": events, "stages": 4, "microbatches": 8, "schedule": "1f1b",
                             "stage_layers": None, "label": "4 stages, m = 8"}
    titles = [ax.get_title(loc="left") for ax in runs.timeline(8).axes]
    assert [t.split(":")[0] for t in titles] == ["measured", "measured", "ideal", "ideal"]
    assert runs.timeline(4) is None


@pytest.mark.slow
def test_the_bridge_runs_torchs_schedule1f1b_on_the_same_stages(reference, in_tmp, capsys, no_leftovers, monkeypatch):
    """Issue 27: torch.distributed.pipelining's Schedule1F1B on the stages the answers build, beside the step
    (one launch of two cases), in the same order on every rank, and drawn one above the other."""
    from lab_src.answers import answers_dir
    from lab_src.checks.torch_bridge import torch_bridge
    from lab_src.registry import EXERCISES
    folder = answers_dir()
    folder.mkdir()
    for qid in ("q02", "q03", "q04", "q05", "q06", "q07", "q08", "q11", "q12"):
        (folder / EXERCISES[qid].answer_file).write_text(open(reference[qid]).read())
    monkeypatch.setattr("lab_src.checks.torch_bridge.check_not_passed", lambda qid: None)
    bridge = torch_bridge()
    out = capsys.readouterr().out
    assert "the same order on every rank: your step is torch's Schedule1F1B" in out, out
    assert bridge.order(0, "theirs") == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    titles = [ax.get_title(loc="left") for ax in bridge.figure().axes]
    assert titles[0].startswith("your one_f_one_b_step: step") and "torch Schedule1F1B: step" in titles[-1]
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert torch_bridge() is None


# ---- issue 55: each study cell runs on its own; the header says what the study runs ----------------------------
STUDY_CALLS = {"memory_vs_microbatches", "thousand_microbatches", "bubble_vs_microbatches", "torch_bridge",
               "bubble_study", "interleaved_bridge", "zero_bubble_study", "ring_study", "network_study"}


def _names(code: str) -> tuple[set[str], set[str], set[str]]:
    """(names the cell binds, names it reads, the study functions it calls)."""
    import ast
    import builtins
    tree = ast.parse("\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith(("%", "!"))))
    bound, read, calls = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in STUDY_CALLS:
            calls.add(node.func.id)
    return bound, read - set(dir(builtins)), calls


@pytest.mark.parametrize("qid", ["q12", "q15", "q16", "q19"])
def test_each_study_cell_runs_without_another_study_cell_run_first(qid):
    """Issue 55: q12's bubble study raised NameError unless the memory study's cell had run first (it imported
    the bubble study's function), and its 1000-micro-batch and bridge cells read `runs` and `bubbles`. A cell
    that runs a study may read what the notebook's other cells define (answers, predictions), never what
    another study's cell defines."""
    import jupytext
    from lab_src.registry import EXERCISES
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    nb = jupytext.read(next(root.glob(f"solutions/*/{EXERCISES[qid].notebook}")))
    others: set[str] = set()            # bound by cells that run no study
    studies = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        bound, read, calls = _names(cell.source)
        if not calls:
            others |= bound
            continue
        studies += 1
        missing = read - bound - others
        assert not missing, f"{qid}: a study cell reads {sorted(missing)}, defined only by another study's cell:\n{cell.source}"
    assert studies


def test_the_bubble_studys_header_names_the_batch_not_one_micro_batch_count():
    """Issue 55: the bubble study's first line said "batch 32 in 8 micro-batches ... for m = 1, 2, 4, 8, 16"."""
    from lab_src.checks.experiments import BUBBLE_MS, model_words
    from lab_src.pipeline.config import DEMO
    words = model_words(DEMO, BUBBLE_MS)
    assert words == "4 stages, 8 layers, hidden 256, sequence 128, batch 32 (micro-batches of 32 down to 2 samples)"
    assert "micro-batches of 4 samples" in model_words(DEMO.replace(num_microbatches=4), [8])


def test_a_later_cell_finds_the_last_experiment_the_kernel_still_holds():
    """Issue 55: thousand_microbatches() and torch_bridge() use the last memory and bubble experiment still alive
    in the kernel (weakly held: deleting the notebook's variable frees it)."""
    import gc
    import weakref
    from lab_src.checks import experiments
    runs = experiments.Runs(kind="bubble")
    experiments._latest["bubble"] = weakref.ref(runs)
    assert experiments.latest("bubble") is runs
    del runs
    gc.collect()
    assert experiments.latest("bubble") is None


def test_a_studys_release_never_raises_into_the_cell_even_in_a_kernel_that_broke_subprocess(monkeypatch):
    """A study gives its memory back after it returns (harness/memory_release.py); the cohort's pia sets
    subprocess.Popen = None in her kernel, and the trim found glibc through ctypes.util.find_library, which runs
    a subprocess: her q12 feedback read "TypeError: 'NoneType' object is not callable" under each study. The
    study's value comes back, and nothing is raised."""
    import subprocess

    from lab_src.harness import memory_release
    monkeypatch.setattr(memory_release, "_libc", None)
    monkeypatch.setattr(subprocess, "Popen", None)
    monkeypatch.setattr(memory_release.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name))
                        if name == "libc.so.6" else object())          # glibc under another name: find_library
    assert memory_release.released(lambda: "the study")() == "the study"
    assert memory_release.trim() is False

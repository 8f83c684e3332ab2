"""q14: data x pipeline parallel on a grid of ranks, tied embeddings, and what the traffic costs.

Fast: the tied-embedding and data-parallel options leave every configuration, model and dataset of the
other exercises as they were; the event record carries collectives; the prediction is read as numbers
without running the answer; the traffic counts. Multi-process: the reference passes the visible check on
the three grids and sends exactly the bytes the hidden tests' formula says; every realistic mistake,
graded through the hidden tests, gets its points and a message that names it.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from grader.cohort.answers import answer, q14_answer
from lab_src.judge.numeric import NotANumber, read_numbers
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.trace import Event

pytestmark = pytest.mark.q14

Q14_SUMMED, Q14_NO_TIED = answer("q14_summed"), answer("q14_no_tied")


# ---- the options change nothing when off -------------------------------------------------------------
def test_a_config_without_the_new_options_travels_and_is_named_as_before():
    cfg = LabConfig()
    assert "dp_size" not in cfg.to_dict() and "tie_embeddings" not in cfg.to_dict()
    assert cfg.key() == "ce49551697"           # the key of LabConfig() before q14 existed
    assert cfg.describe() == "4 stages, 8 layers, batch 8 in 4 micro-batches, seed 0, float32"
    grid = cfg.replace(dp_size=2, tie_embeddings=True)
    assert LabConfig.from_dict(grid.to_dict()) == grid and grid.key() != cfg.key() and grid.world_size == 8


def test_untied_model_and_data_are_what_they_always_were():
    from lab_src.pipeline.data import SyntheticTokens
    from lab_src.pipeline.model import build_model
    cfg = LabConfig()
    g = torch.Generator().manual_seed(cfg.seed + 1_000_003)      # the dataset's definition before q14
    assert torch.equal(SyntheticTokens(cfg).tokens, torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=g))
    model = build_model(cfg)
    assert model.head.proj.weight is not model.embed.tokens.weight
    assert not torch.equal(model.head.proj.weight.T[:, :1], model.embed.tokens.weight[:1].T)
    assert len(list(model.named_parameters())) == len(list(model.named_parameters(remove_duplicate=False)))


def test_tied_model_shares_one_parameter_and_a_last_stage_copy_starts_equal():
    from lab_src.pipeline.model import build_model, build_piece
    cfg = LabConfig(tie_embeddings=True)
    model = build_model(cfg)
    assert model.head.proj.weight is model.embed.tokens.weight
    head = build_piece(cfg, "head")
    assert torch.equal(head.proj.weight, model.embed.tokens.weight)
    assert torch.equal(head.proj.bias, build_piece(LabConfig(), "head").proj.bias)   # only the weight is tied


def test_the_global_batch_is_the_replicas_shards_in_order():
    from lab_src.pipeline.data import SyntheticTokens
    cfg = LabConfig(global_batch_size=12, dp_size=3)
    shards = [SyntheticTokens(cfg, dp_rank=d).tokens for d in range(3)]
    assert torch.equal(SyntheticTokens(cfg).tokens, torch.cat(shards))
    assert not torch.equal(shards[0], shards[1])
    with pytest.raises(ValueError, match="no data-parallel replica 3"):
        SyntheticTokens(cfg, dp_rank=3)


def test_baseline_names_a_tied_weight_under_both_its_names(reference):
    from lab_src.answers import use_answers
    from lab_src.pipeline.baseline import compute_baseline
    with use_answers(reference):
        tied = compute_baseline(LabConfig(num_layers=2, num_stages=2, tie_embeddings=True))
        untied = compute_baseline(LabConfig(num_layers=2, num_stages=2))
    assert torch.equal(tied["grads"]["head.proj.weight"], tied["grads"]["embed.tokens.weight"])
    assert not torch.equal(untied["grads"]["head.proj.weight"].T[:1], untied["grads"]["embed.tokens.weight"][:1])


# ---- the event record, the pictures and the counts ----------------------------------------------------
def grid_events() -> list[Event]:
    """A 2 x 2 step in miniature (peers as global ranks): one message each way per pipeline, then the tied
    and the data-parallel all-reduces."""
    ev, shape = [], (2, 16, 32)
    for d in range(2):
        a, b = 2 * d, 2 * d + 1
        ev += [Event(a, "forward", 0, None, shape, 0, 0.0, 1.0), Event(a, "send_forward", 0, b, shape, 4096, 1.0, 1.1),
               Event(b, "recv_forward", 0, a, shape, 4096, 0.5, 1.2), Event(b, "forward", 0, None, shape, 0, 1.2, 2.0),
               Event(b, "backward", 0, None, (), 0, 2.0, 3.0), Event(b, "send_backward", 0, a, shape, 4096, 3.0, 3.1),
               Event(a, "recv_backward", 0, b, shape, 4096, 1.1, 3.2), Event(a, "backward", 0, None, shape, 0, 3.2, 4.0)]
        ev += [Event(r, "allreduce_tied", None, None, (64, 32), 8192, 4.0, 4.2, 0, group=(a, b)) for r in (a, b)]
    ev += [Event(r, "allreduce_dp", None, None, (100,), 400, 4.2, 4.6, 0, group=(r % 2, r % 2 + 2)) for r in range(4)]
    return ev


def test_collectives_round_trip_and_p2p_rows_keep_their_old_length():
    e = Event(0, "allreduce_dp", None, None, (100,), 400, 1.0, 2.0, 0, group=(0, 2))
    assert Event.from_row(json.loads(json.dumps(e.to_row()))) == e
    assert e.is_collective and not e.is_send and e.phase == "collective" and "over ranks [0, 2]" in e.label()
    p2p = Event(0, "send_forward", 1, 1, (2,), 8, 0.0, 1.0)
    assert len(p2p.to_row()) == 10 and Event.from_row(p2p.to_row()) == p2p      # ... chunk, held: no group


def test_bytes_by_kind_and_on_the_wire():
    from lab_src.topics.dp_pp.traffic import bytes_by_kind, calls_by_kind, ring_factor, wire_bytes_by_kind
    ev = grid_events()
    assert bytes_by_kind(ev) == {"pipeline": 4 * 4096, "data_parallel": 4 * 400, "tied": 4 * 8192}
    assert calls_by_kind(ev) == {"pipeline": 4, "data_parallel": 4, "tied": 4}
    assert ring_factor(2) == 1.0 and ring_factor(4) == 1.5 and ring_factor(1) == 0.0
    assert wire_bytes_by_kind(ev)["data_parallel"] == 4 * 400 * ring_factor(2)


def test_chrome_trace_and_static_figure_show_the_collectives(tmp_path):
    from lab_src.views.chrome_trace import to_chrome_trace
    from lab_src.topics.dp_pp.timeline import grid_figure
    trace = to_chrome_trace(grid_events())["traceEvents"]
    collective = [t for t in trace if t.get("cat") == "collective"]
    assert len(collective) == 8 and {tuple(t["args"]["group"]) for t in collective} == {(0, 1), (2, 3), (0, 2), (1, 3)}
    assert len([t for t in trace if t.get("ph") == "s"]) == 4       # the messages still have their arrows
    fig = grid_figure(grid_events(), 2, 2, 1, "test")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["rank 0 (dp 0, pp 0)", "rank 1 (dp 0, pp 1)", "rank 2 (dp 1, pp 0)", "rank 3 (dp 1, pp 1)"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "data-parallel all-reduce" in legend and "tied-embedding all-reduce" in legend
    fig.savefig(tmp_path / "grid.png")


def test_a_collective_in_a_deadlock_report_names_its_ranks():
    from lab_src.harness.deadlock import describe_op
    from lab_src.judge.failures import from_error
    assert describe_op("allreduce_dp", None, [0, 2]) == "allreduce_dp over ranks [0, 2]"
    error = {"type": "RuntimeError", "message": "Timed out", "pending": ["3", "allreduce_tied", None, [0, 1]]}
    p = from_error(0, error)
    assert "waited in allreduce_tied over ranks [0, 1] until the timeout: not every member joined it" in str(p)


# ---- the what-if network model ------------------------------------------------------------------------
def test_ring_all_reduce_and_messages_follow_the_model():
    from lab_src.topics.dp_pp.network import cluster, plan, predict
    net = cluster(nodes=2, ranks_per_node=2, intra_gbps=800, inter_gbps=80, intra_latency_us=2, inter_latency_us=10)
    assert net.message_s(0, 1, 1e6) == pytest.approx(2e-6 + 1e6 / 100e9)          # same node
    assert net.message_s(1, 2, 1e6) == pytest.approx(10e-6 + 1e6 / 10e9)           # across nodes
    assert net.allreduce_s([0, 1], 1e6) == pytest.approx(2 * 1 * (2e-6 + 0.5e6 / 100e9))
    assert net.allreduce_s([0, 1, 2, 3], 1e6) == pytest.approx(2 * 3 * (10e-6 + 0.25e6 / 10e9))   # leaves the node
    assert net.allreduce_s([3], 1e6) == 0.0
    ops = plan(dp=2, pp=2, m=3, message_bytes=8192, stage_bytes=[1000, 2000], tied_bytes=512)
    assert sorted({(o.kind, o.ranks) for o in ops}) == [("data_parallel", (0, 2)), ("data_parallel", (1, 3)),
                                                        ("pipeline", (0, 1)), ("pipeline", (1, 0)), ("pipeline", (2, 3)),
                                                        ("pipeline", (3, 2)), ("tied", (0, 1)), ("tied", (2, 3))]
    assert sum(o.kind == "pipeline" for o in ops) == 2 * 2 * 3
    t = predict(ops, net)
    assert t["pipeline"] == pytest.approx(3 * net.message_s(2, 3, 8192))   # the busiest rank: 3 sends across nodes
    assert t["data_parallel"] == pytest.approx(net.allreduce_s([1, 3], 2000))


def test_measured_times_come_from_the_record():
    from lab_src.topics.dp_pp.network import measure, operations, this_machine
    ev = grid_events()
    got = measure(ev)
    assert got["pipeline"] == pytest.approx(0.2)        # rank 0's send starts at 1.0, its receive ends at 1.2
    assert got["tied"] == pytest.approx(0.2) and got["data_parallel"] == pytest.approx(0.4)
    assert len(operations(ev)) == 4 + 2 + 2             # four messages, one call per tied pair, per data-parallel set
    here = this_machine({"4": 40e-6, "1048580": 40e-6 + 1048576 / 4e9})
    assert here.intra.latency_s == pytest.approx(40e-6) and here.intra.bandwidth_Bps == pytest.approx(4e9)


def test_the_models_step_ends_with_the_all_reduces():
    from lab_src.topics.dp_pp.network import this_machine
    from lab_src.topics.dp_pp.timeline import predicted_events
    ev = predicted_events(grid_events(), 2, 2, 1, this_machine(None), [1, 1],
                          {"message_bytes": 4096, "stage_bytes": [400, 400], "tied_bytes": 8192}, tied=True)
    for r in range(4):
        mine = sorted((e for e in ev if e.rank == r), key=lambda e: e.t_start)
        assert [e.kind for e in mine][-2:] == ["allreduce_tied", "allreduce_dp"]
        assert mine[-1].group == (r % 2, r % 2 + 2)


# ---- the prediction: numbers, read, never run ---------------------------------------------------------
def test_the_prediction_is_read_as_numbers_and_nothing_else():
    ok = ('def predicted_bytes():\n    """mine"""\n'
          '    return {"pipeline": 2 * 3 * 8192, "tied": 1e3, "data_parallel": (4 + 4) // 2}\n')
    assert read_numbers(ok, "predicted_bytes") == {"pipeline": 49152, "tied": 1000.0, "data_parallel": 4}
    for bad, why in [("def predicted_bytes():\n    raise NotImplementedError()\n", "still the stub"),
                     ("import os\ndef predicted_bytes():\n    return {'pipeline': os.getpid()}\n", "not a number"),
                     ("def predicted_bytes():\n    n = 3\n    return {'pipeline': n}\n", "a prediction, not a computation"),
                     ("def predicted_bytes():\n    return {'pipeline': 10 ** 10 ** 10}\n", "a power that large"),
                     ("x = 1\n", "no function predicted_bytes()")]:
        with pytest.raises(NotANumber, match=why):
            read_numbers(bad, "predicted_bytes")


def test_prediction_items_grade_each_kind_and_explain(tmp_path, reference):
    from grader.hidden.common import Context
    from grader.hidden.q14_dp_pp_step import prediction_items
    answer = tmp_path / "q14.py"
    answer.write_text(q14_answer().replace('"tied": 2 * 2 * 64 * 32 * 4', '"tied": 2 * 64 * 32 * 4'))
    items = prediction_items(Context(student={"q14": str(answer)}, reference=reference))
    assert [i.passed for i in items] == [True, True, False]
    assert "the predicted tied bytes are 16,384; one step sends 32,768 (0.5x)" in str(items[2].problems[0])


# ---- real runs -----------------------------------------------------------------------------------------
def test_reference_2x2_step_equals_the_baseline_and_sends_what_the_formula_says(reference, tmp_path, no_leftovers):
    from grader.hidden.common import Context
    from grader.hidden.q14_dp_pp_step import expected_bytes
    from lab_src.harness.baselines import baselines_for
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    from lab_src.topics.dp_pp.judge import judge_grid
    from lab_src.topics.dp_pp.traffic import PREDICTION_CONFIG, bytes_by_kind
    cfg = PREDICTION_CONFIG
    base = baselines_for([cfg], reference)[cfg]
    case = Case(kind="grid", qid="q14", config=cfg, answers=reference, stages=4, step="q14", probes=["network"])
    out = run_cases([case], tmp_path).outcomes[0]
    assert out.failure is None and not out.errors()
    verdict = judge_grid(out, base)
    assert verdict.data_parallel == [] and verdict.tied == []
    assert torch.equal(out.obs[0]["tied_after_step"], out.obs[1]["tied_after_step"])
    q05 = Context(student={}, reference=reference).reference_fn("q05")
    assert bytes_by_kind(out.events()) == expected_bytes(cfg, q05)
    groups = {(e.rank, e.kind): e.group for e in out.events() if e.is_collective}
    assert groups == {(0, "allreduce_tied"): (0, 1), (1, "allreduce_tied"): (0, 1), (2, "allreduce_tied"): (2, 3),
                      (3, "allreduce_tied"): (2, 3), (0, "allreduce_dp"): (0, 2), (2, "allreduce_dp"): (0, 2),
                      (1, "allreduce_dp"): (1, 3), (3, "allreduce_dp"): (1, 3)}
    assert set(out.obs[0]["link"]) == {"4", "1048576"}


@pytest.mark.slow
def test_reference_passes_the_visible_check_on_three_grids(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    from lab_src.checks.q14_dp_pp_step import what_if
    (in_tmp / "map.json").write_text(json.dumps(reference))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q14")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = capsys.readouterr().out
    assert report.ok and "q14: all checks passed" in out and "your prediction matches the measurement" in out
    assert "rank 3: stage 1 of pipeline [2, 3], data-parallel all-reduce over [1, 3], tied all-reduce over [2, 3]" in out
    assert "1 x 4 grid" in out and "4 x 1 grid" in out
    widget = report.timeline()              # measured, and the traffic model's step as the ideal view
    assert type(widget).__name__ == "TimelineWidget" and "theory (p-1)/(m+p-1) = (2-1)/(3+2-1)" in widget.side.value
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    try:
        fig = report.timeline()
    finally:
        del os.environ["NBGRADER_EXECUTION"]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()][3] == "rank 3 (dp 1, pp 1)"
    plot = what_if(report, nodes=4, ranks_per_node=2, inter_gbps=25)
    table = capsys.readouterr().out
    assert "measured here" in table and "4 nodes x 2 ranks" in table and len(plot.axes) == 2
    report.chrome_trace(in_tmp / "trace.json")
    assert any(t.get("cat") == "collective" for t in json.loads((in_tmp / "trace.json").read_text())["traceEvents"])


def grade(reference, tmp_path, answers: dict[str, str]) -> dict[str, tuple[float, list[str]]]:
    """Grade each q14 answer text through the hidden tests, all cases in one launch: {name: (fraction, lines)}."""
    from hidden_grading import grade_answers
    return grade_answers("q14", answers, reference, tmp_path)


# name: (the answer, its fraction of the points, what its feedback must say)
MISTAKES = {
    "reference": (q14_answer(), 1.0, "12 of 12 hidden checks passed"),
    "summed": (Q14_SUMMED, 0.7333, "they are 2x the baseline's, and 2 is the data-parallel size: the all-reduce "
                                   "summed the replicas' gradients; average them"),
    # said once (judge/summary.py): on the first grid it showed in, 1 x 4, with where else it showed
    "no tied all-reduce": (Q14_NO_TIED, 0.75, "this rank never summed the tied embedding's gradient with its copy on "
                                              "rank 3 (no grid.all_reduce(..., \"tied\") over ranks [0, 3] was recorded): "
                                              "each copy keeps only its own use's gradient, and the copies drift apart "
                                              "(1 x 4, tied) also on rank 3 (the same run); ranks 0, 1, 2, 3 (2 x 2, tied)"),
    "tied over the data-parallel set": (
        q14_answer(tied_reduce='grid.all_reduce(stage.tied_embedding.grad, dp_sets[pp_rank], "tied")'), 0.75,
        "the tied all-reduce ran over ranks [0, 2], the data-parallel set of stage 0; the copies of pipeline 0's tied "
        "embedding are on its first and last stage, ranks [0, 1]"),
    "one data seed": (q14_answer(loader="make_dataloader(cfg, mbs, dp_rank=0)"), 0.7333,
                      "all read shard 0: identical samples on every replica, as if their data had one seed"),
    "the whole batch": (q14_answer(loader="make_dataloader(cfg, mbs)"), 0.7333,
                        "made its dataloader without dp_rank, so it reads the global batch from its first sample"),
    "a weight seed per replica": (q14_answer(stage_cfg="cfg.replace(seed=cfg.seed + dp_rank)"), 0.7333,
                                  "replica 1's stage 0 starts from other weights than the run seed gives"),
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    graded = grade(reference, tmp_path, {name: text for name, (text, _, _) in MISTAKES.items()})
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        assert got == pytest.approx(fraction, abs=1e-4), (name, lines)
        assert says in " ".join("\n".join(lines).split()), (name, lines)   # messages wrap at 110 columns


@pytest.mark.slow
def test_groups_of_the_wrong_stride_are_named(reference, tmp_path, no_leftovers):
    """The data-parallel sets built as consecutive ranks: on 1 x 4 and 4 x 1 they happen to be right; on a
    2 x 2 grid a rank reduces over a group it is not in, its partner waits until the check stops it, and after
    two such cases the rest are not run."""
    stride = q14_answer(dp_set="list(range(p * dp, (p + 1) * dp))")
    (fraction, lines), = grade(reference, tmp_path, {"stride": stride}).values()
    assert fraction == pytest.approx((2 / 5 + 2 / 4 + 1) / 3, abs=1e-4), lines
    text = " ".join("\n".join(lines).split())   # messages wrap at 110 columns
    assert "the data-parallel sets [0, 2], [1, 3] were never created" in text
    assert "the ranks holding one stage are pp_size = 2 apart" in text
    # the partner left alone in the all-reduce is stopped by the deadlock watch, not by gloo's timeout
    assert "the other ranks were left waiting until the check stopped the run" in text
    assert "rank 0 waited in allreduce_dp over ranks [0, 1], a member of which had stopped" in text


# ---- the what-if plot (issue 27, item 9) ---------------------------------------------------------------
def test_what_if_marks_where_rings_leave_a_node_and_the_cluster_is_full():
    """On 2 nodes x 4 ranks with a 2-stage pipeline, 2 replicas fit in a node and 4 fill the cluster (2 x 4 =
    8 ranks): the node mark sits between 2 and 4 replicas, the shading of "more than 8 ranks" after 4. Both
    were one step early. The scaling the left panel shows is said, in its numbers."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.patches import Polygon, Rectangle

    from lab_src.checks.q14_dp_pp_step import CLUSTER
    from lab_src.topics.dp_pp.network import cluster
    from lab_src.topics.dp_pp.traffic_plot import scaling, what_if_figure
    net = cluster(**CLUSTER)
    sizes = {"message_bytes": 4096, "stage_bytes": [60_000, 50_000], "tied_bytes": 8192}
    fig = what_if_figure(sizes, dp=2, pp=2, m=3, net=net)
    left = fig.axes[0]
    marks = [ln.get_xdata()[0] for ln in left.lines if ln.get_linestyle() == "--"]
    assert marks == [pytest.approx((2 * 4) ** 0.5)]
    shade = next(p for p in left.patches if isinstance(p, (Rectangle, Polygon)))
    assert shade.get_window_extent().x0 > left.transData.transform((4, 1))[0]
    assert "each a 2-stage pipeline like the measured one" in left.get_xlabel()
    said = scaling(sizes, 2, 3, net)
    assert "latency sets the time" in said and "roughly linearly with the replicas" in said


def test_what_if_refuses_a_run_that_did_not_pass(capsys):
    from lab_src.checks.q14_dp_pp_step import GridReport, what_if
    from lab_src.judge.problems import Problem
    report = GridReport("q14", None, [Problem("q14 dp_pp_step() is still the stub")], [],
                        views=[{"events": [], "dp": 2, "pp": 2, "microbatches": 3}])
    assert what_if(report) is None
    assert "the check above did not pass" in capsys.readouterr().out


def test_the_grid_timeline_names_each_rows_coordinates_and_keeps_its_legend_whole():
    """Issue 27, cosmetics: the animated q14 timeline labelled its rows "rank 3" only, and its legend ran
    past the frame ("→ me..."). Rows carry "dp 1, pp 1"; a legend too long for one line takes two."""
    import re
    from dataclasses import replace

    from lab_src.pipeline.trace import Event
    from lab_src.topics.dp_pp.timeline import grid_timeline
    from lab_src.views.ideal import ideal_events
    from lab_src.views.svg import frame
    one = ideal_events(2, 3, activation_bytes=64)
    end = max(e.t_end for e in one)
    events = [replace(e, rank=e.rank + d * 2, peer=None if e.peer is None else e.peer + d * 2)
              for d in range(2) for e in one]
    events += [Event(r, "allreduce_dp", None, None, None, 1024, end, end * 1.2, 0, group=(r % 2, r % 2 + 2))
               for r in range(4)]
    events += [Event(r, "allreduce_tied", None, None, None, 256, end * 1.2, end * 1.3, 0, group=(r - r % 2, r - r % 2 + 1))
               for r in range(4)]
    svg = frame(grid_timeline(events, 2, 2, 3), width=860)
    assert ">dp 1, pp 1</text>" in svg
    view_w, view_h = map(float, re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg).groups())
    texts = re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg)
    x, y, _ = next(t for t in texts if t[2] == "message: send → receive")
    assert float(x) + 6.2 * len("message: send → receive") <= view_w and float(y) <= view_h


@pytest.mark.slow
def test_groups_made_on_some_ranks_only_cost_no_later_case_of_the_launch(reference, tmp_path, no_leftovers):
    """torch names a process group by how many groups its process has made. A q14 answer that makes one group
    more on rank 0 than on the others (here a group of rank 0 alone, harmless to its own step) leaves rank 0's
    count ahead; the next groups made in the same launch (q18's t x p training makes its stages' groups
    [0, 2], [1, 3]) would then carry other names on rank 0 than on its peers and never connect. The worker
    puts every rank on the highest count after each case, so the q18 case that follows runs as it does alone."""
    from lab_src.harness.case import Case
    from lab_src.harness.limits import GRADING_CASE_DEADLINE_S, GRADING_RECV_TIMEOUT_S
    from lab_src.harness.runner import run_cases
    from lab_src.topics.dp_pp.traffic import PREDICTION_CONFIG
    from lab_src.topics.training.digits import DIGITS
    text = q14_answer()
    line = next(ln for ln in text.splitlines(keepends=True) if ln.startswith("    tied = [grid.new_group("))
    text = text.replace(line, line + "    if grid.rank == 0:       # after its own groups: its own step is right\n"
                                     "        grid.new_group([0])\n", 1)
    path = tmp_path / "q14_extra_group.py"
    path.write_text(text)
    uneven = Case(kind="grid", qid="q14", config=PREDICTION_CONFIG, answers={**reference, "q14": str(path)}, stages=4,
                  step="q14")
    grid = Case(kind="tp_train", qid="q18", config=DIGITS.replace(num_stages=2), answers=reference, stages=4,
                settings={"t": 2, "steps": 2, "lr": 1e-2})
    run = run_cases([uneven, grid], tmp_path / "run", case_deadline_s=GRADING_CASE_DEADLINE_S,
                    timeout_s=GRADING_RECV_TIMEOUT_S)
    first, second = run.outcomes
    assert first.failure is None and not first.errors(), first.errors()
    assert second.failure is None and not second.errors(), second.errors()
    assert [len(second.obs[r]["losses"]) for r in range(4)] == [0, 2, 0, 2]     # the last stage's ranks: 1, 3

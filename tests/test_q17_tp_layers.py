"""q17: tensor parallelism, the two communication functions, column- and row-parallel layers, the MLP.

Fast: the judge (topics/tensor_parallel/judge_layers.py) on observations made from the unsharded layers' own numbers: what a right
rank records passes, and each realistic mistake's numbers or collectives get the message that names its
misconception; the collectives of a raw answer are recorded (comm/collectives.py) in one process of one rank.
Multi-process: the reference passes the visible check on 2 and 4 ranks, and every cohort mistake, graded
through the hidden tests in one launch, gets its points and its message.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from grader.cohort.answers import answer
from lab_src.harness.case import Case, CaseOutcome
from lab_src.pipeline.config import LabConfig
from lab_src.topics.tensor_parallel.judge_layers import expected, judge_part

pytestmark = pytest.mark.q17

CFG = LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64", seed=3)
RECORDED = ("out", "in_grad", "weight", "bias", "weight_grad", "bias_grad", "up_weight_grad", "up_bias_grad",
            "down_weight_grad", "down_bias_grad", "fwd", "bwd", "weight_shape", "params", "up_weight_shape",
            "down_weight_shape")


def observed(part: str, t: int = 2, cfg: LabConfig = CFG, change=None) -> CaseOutcome:
    """An outcome whose ranks recorded exactly what the unsharded layer says, then `change(rank, got)`."""
    obs = {}
    for r, want in enumerate(expected(part, cfg, t)):
        got = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in want.items() if k in RECORDED}
        if change is not None:
            change(r, got)
        obs[r] = {"tp": {part: got}}
    return CaseOutcome(Case(kind="tp", qid="q17", config=cfg, stages=t), obs)


def said(found: dict) -> str:
    return " ".join(" ".join(str(p) for p in problems) for problems in found.values())


@pytest.mark.parametrize("part", ["copy", "reduce", "column", "row", "mlp"])
@pytest.mark.parametrize("t", [2, 4])
def test_what_the_unsharded_layer_says_passes(part, t):
    assert not any(judge_part(part, observed(part, t)).values())


def test_expected_shards_put_back_together_are_the_unsharded_gradients():
    from lab_src.topics.tensor_parallel.runtime import full_mlp
    col = expected("column", CFG, 4)
    up, _ = full_mlp(CFG)
    assert torch.equal(torch.cat([c["weight"] for c in col], 0), up.weight.detach())
    assert col[0]["weight_shape"] == [32, 32] and col[0]["params"] == (128 * 32 + 128) // 4
    row = expected("row", CFG, 4)
    assert row[0]["weight_shape"] == [32, 32] and row[0]["params"] == 32 * 128 // 4 + 32
    mlp = expected("mlp", CFG, 2)
    assert mlp[0]["params"] == (128 * 32 + 128 + 32 * 128) // 2 + 32 and mlp[0]["full_params"] == 2 * 128 * 32 + 160
    assert mlp[0]["fwd"] == [["all_reduce", 2 * 16 * 32 * 8, [0, 1]]] == mlp[0]["bwd"]


def test_the_bias_added_on_every_rank_is_named():
    def every_rank(r, got):
        got["out"] = got["out"] + got.pop("bias")      # t = 2: one copy too many
    found = judge_part("row", observed("row", change=every_rank))
    assert "added the bias before the all-reduce, so the sum counts it 2 times" in said(found)


def test_a_backward_without_its_all_reduce_is_named_by_its_numbers_and_its_rounds():
    want = expected("column", CFG, 2)

    def own_share(r, got):
        got["in_grad"], got["bwd"] = want[r]["partial"], []
    found = judge_part("column", observed("column", change=own_share))
    assert "only this rank's own share of it" in said(found)
    assert "backward made no collective; it needs all-reduce of 8,192 bytes over ranks [0, 1]" in said(found)

    def averaged(r, got):
        got["in_grad"] = got["in_grad"] / 2
    found = judge_part("mlp", observed("mlp", change=averaged))
    assert "1/2 of the right gradient, the average over the group" in said(found)


def test_extra_rounds_between_the_layers_are_named():
    def gathered(r, got):
        got["fwd"] = [["all_gather", 2 * 16 * 64 * 8, [0, 1]]] + got["fwd"]
    text = " ".join(said(judge_part("mlp", observed("mlp", change=gathered))).split())
    assert "made all-gather of 16,384 bytes over ranks [0, 1], all-reduce of 8,192 bytes over ranks [0, 1]" in text
    assert "The all-gather is an extra round" in text

    def reduced_twice(r, got):
        got["fwd"] = [["all_reduce", 2 * 16 * 64 * 8, [0, 1]]] + got["fwd"]
    found = judge_part("mlp", observed("mlp", change=reduced_twice))
    assert "One all-reduce after each layer is a round too many" in said(found)

    def barrier(r, got):
        got["fwd"] = [["dist_barrier", 0, [0, 1]]] + got["fwd"]
    text = " ".join(said(judge_part("mlp", observed("mlp", change=barrier))).split())
    assert "made a barrier over ranks [0, 1], all-reduce of 8,192 bytes over ranks [0, 1]" in text
    assert "A barrier is a round too, though it carries no data" in text


def test_a_result_not_made_of_its_recorded_all_reduce_is_named_and_a_sum_in_any_layout_passes():
    """What each all-reduce gave back (coll.CARRIED) against the part's result: an output right without its
    all-reduce (zeros reduced to look like one round) is named; the sum with the bias added after it, or kept
    flat, passes."""
    want = expected("mlp", CFG, 2)

    def carried(fwd, bwd):
        def change(r, got):
            got["fwd_carried"] = [{"sent": None, "got": fwd(r, got)}]
            got["bwd_carried"] = [{"sent": None, "got": bwd(r, got)}]
        return change
    honest = carried(lambda r, got: got["out"] - want[r]["full_bias"], lambda r, got: got["in_grad"])
    assert not any(judge_part("mlp", observed("mlp", change=honest)).values())
    inside_flat = carried(lambda r, got: got["out"].reshape(-1), lambda r, got: got["in_grad"].reshape(-1))
    assert not any(judge_part("mlp", observed("mlp", change=inside_flat)).values())
    zeros = carried(lambda r, got: torch.zeros_like(got["out"]), lambda r, got: torch.zeros_like(got["in_grad"]))
    found = judge_part("mlp", observed("mlp", change=zeros))
    text = " ".join(" ".join(str(p) for p in found["communication"]).split())
    assert not found["numbers"] and not found["holds"]
    assert "tp_layers' MLP's forward made its one all-reduce, but its output is not what that all-reduce gave " \
           "back: it gave back zeros (every rank handed it zeros)" in text
    assert "backward made its one all-reduce, but its input's gradient is not what" in text
    assert "computed from more than this rank's shards" in text
    copy = judge_part("copy", observed("copy", change=lambda r, got: got.update(
        bwd_carried=[{"sent": None, "got": got["in_grad"] * 2}])))
    assert "CopyToTensorParallel's backward made its one all-reduce, but its input's gradient is not what that " \
           "all-reduce gave back: it gave back a tensor the result is not made of" in " ".join(said(copy).split())
    # a wrong result is named by its numbers, once: not also as not made of its sum
    wrong = judge_part("copy", observed("copy", change=lambda r, got: got.update(
        in_grad=got["in_grad"] * 3, bwd_carried=[{"sent": None, "got": got["in_grad"]}])))
    assert wrong["numbers"] and not wrong["communication"]


def test_shards_cut_along_the_wrong_dimension_and_a_whole_layer_are_named():
    def crossed(r, got):
        got["weight_shape"] = [128, 16]
    assert "cut along the wrong dimension. A column-parallel layer splits the output features" in \
        said(judge_part("column", observed("column", change=crossed)))

    def crossed_row(r, got):
        got["weight_shape"] = [16, 128]
    assert "A row-parallel layer splits the input features" in said(judge_part("row", observed("row", change=crossed_row)))

    def whole(r, got):
        got["params"] = 2 * 128 * 32 + 160 + got["params"]
    assert "the whole MLP (8,352)" in said(judge_part("mlp", observed("mlp", change=whole)))


def test_a_collective_is_recorded_with_its_kind_bytes_and_group_and_a_wrong_group_is_refused(tmp_path):
    """One rank (gloo, world of 1): the answer's own dist calls are recorded under a tracer, not outside it,
    and a collective over ranks outside the case's is refused before it could wait for them."""
    script = tmp_path / "one.py"
    script.write_text('''
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1")
import torch, torch.distributed as dist
dist.init_process_group("gloo")
from lab_src.comm import collectives as coll
from lab_src.pipeline import trace
coll.install()
dist.all_reduce(torch.ones(3))                           # outside a tracer: not recorded
tracer = trace.Tracer(0)
with trace.tracing(tracer):
    dist.all_reduce(torch.ones(4, dtype=torch.float64))
    pieces = [torch.empty(2)]
    dist.all_gather(pieces, torch.ones(2), group=dist.group.WORLD)
    dist.barrier()                                       # a round without data: recorded too
    from lab_src.pipeline import waiting
    waiting.barrier(None)                                # the lab's own barrier: never the answer's
    coll.CASE_RANKS[:] = []
print([(e.kind, e.bytes, e.group) for e in tracer.events])
for words in (("the tensor-parallel group", "tp.group"), ()):
    with coll.bounded([5], *words):
        try:
            with trace.tracing(tracer):
                dist.all_reduce(torch.ones(1))
        except coll.WrongGroup as e:
            print("refused:", e)
print("after:", coll.CASE_RANKS, coll.CASE_GROUP)
dist.destroy_process_group()
''')
    env = {**os.environ, "PORT": str(29000 + os.getpid() % 900), "PYTHONPATH": str(os.getcwd())}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr
    assert "[('all_reduce', 32, (0,)), ('all_gather', 8, (0,)), ('dist_barrier', 0, (0,))]" in done.stdout
    assert "refused: all-reduce over ranks [0] (the default group: no group= given), but the tensor-parallel " \
           "group is ranks [5]: pass group=tp.group" in done.stdout
    # another topic's case names no tensor-parallel group (comm/collectives.py bounded: the case's words)
    assert "refused: all-reduce over ranks [0] (the default group: no group= given), but the case's ranks are [5]: " \
           "pass the process group your function was given as group=" in done.stdout
    assert "after: [] []" in done.stdout


def test_the_opening_figure_and_the_timeline_draw_from_the_lab_and_the_record():
    from lab_src.pipeline.trace import Event
    from lab_src.topics.tensor_parallel.figure import tp_figure
    from lab_src.topics.tensor_parallel.timeline import tp_timeline_figure
    fig = tp_figure(4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "up.weight rows 96..127\n(32, 32) + bias (32,)" in texts and "rank 3" in texts
    assert "down.weight cols 32..63\n(32, 32)" in texts
    events = [Event(r, "all_reduce", None, None, (2, 16, 32), 8192, 0.001 * r, 0.004, 0, group=(0, 1))
              for r in range(2)]
    fig = tp_timeline_figure(events, 2, "q17: t = 2", ("mlp",))
    assert fig.axes[0].get_title(loc="left") == "2 ranks · 1 collective on rank 0 · the parts, in order: mlp"
    # issue 41: a layer has no pipeline bubble: the legend names the collectives alone, nothing is hatched idle
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["all-reduce (torch.distributed)"]
    assert not [p for p in fig.axes[0].patches if p.get_hatch()]


def test_the_timeline_labels_each_call_cuts_the_start_up_and_the_set_up_between_parts():
    """Issue 41, item 3: q17's and q18's timelines were mostly start-up skew (a 320 ms first all-reduce) and
    set-up between parts (q18's dropout part 3.6 s after the block's), with unlabelled bars."""
    from lab_src.pipeline.trace import Event
    from lab_src.topics.tensor_parallel.timeline import cut_gaps, labelled, tp_timeline_figure, without_start_up
    def call(r, t0, t1):
        return Event(r, "all_reduce", None, None, (2, 16, 32), 8192, t0, t1, 0, group=(0, 1))
    events = [call(0, 0.0, 0.330), call(1, 0.320, 0.330),       # rank 0 waited 320 ms for rank 1 to start
              call(0, 0.340, 0.350), call(1, 0.341, 0.350),
              call(0, 3.950, 3.960), call(1, 3.951, 3.960)]     # the next part, 3.6 s of set-up later
    labels = {(r, k): name for r in range(2) for k, name in enumerate(["mlp, forward", "mlp, backward", "row, forward"])}
    names = labelled(events, labels)
    moved, names, wait = without_start_up(events, names)
    assert wait == pytest.approx(0.320) and min(e.t_start for e in moved) == 0.0
    assert sorted(names.values()) == ["mlp, backward", "mlp, backward", "mlp, forward", "mlp, forward",
                                      "row, forward", "row, forward"]
    cut, names, cuts = cut_gaps(moved, names)
    assert len(cuts) == 1 and cuts[0][1] == pytest.approx(3.6 - 0.01, abs=0.002)
    assert max(e.t_end for e in cut) < 0.06 and len(names) == 6
    fig = tp_timeline_figure(events, 2, "q17: t = 2", ("mlp", "row"), labels)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert {"mlp, forward", "mlp, backward", "row, forward"} <= set(texts)
    assert any("ms cut" in t for t in texts) and "320 ms before the last" in ax.get_title(loc="left")
    assert ax.get_xlim()[1] < 60        # ms: the calls fill the axis


def test_the_timeline_steps_through_the_collectives_in_the_widget_and_is_static_while_autograding(monkeypatch):
    from lab_src.pipeline.trace import Event
    from lab_src.topics.tensor_parallel.timeline import show_tp_timeline
    from lab_src.views.widget import TimelineWidget
    events = [Event(r, "all_reduce", None, None, (2, 16, 32), 8192, 0.001 * r + s, 0.004 + s, 0, group=(0, 1))
              for s in (0.0, 0.01) for r in range(2)]
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    labels = {(r, k): f"mlp, {word}" for r in range(2) for k, word in enumerate(("forward", "backward"))}
    widget = show_tp_timeline(events, 2, "q17: t = 2", ("mlp",), labels)
    assert isinstance(widget, TimelineWidget) and widget.toggle.options == ("measured",)
    assert "<li>mlp, forward</li><li>mlp, backward</li>" in widget.side.value
    assert widget.slider.max == 4 and "<svg" in widget.frame.value
    assert "16,384 B" in widget.side.value and "one all-reduce of the activation" in widget.side.value
    widget.slider.value = 2
    assert "event 2/4" in widget.info.value and "mlp, forward" in widget.info.value
    assert "idle (bubble)" not in widget.frame.value and "pp-idle)\"/>" not in widget.frame.value.split("</defs>")[-1]
    q18 = show_tp_timeline(events, 2, "q18: t = 2", ("block", "dropout"))      # q18's own lesson, not the MLP's
    assert "A correct block makes one all-reduce" in q18.side.value and "correct MLP" not in q18.side.value
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert not isinstance(show_tp_timeline(events, 2, "q17: t = 2", ("mlp",)), TimelineWidget)


# ---- real runs -----------------------------------------------------------------------------------------
def test_reference_passes_the_visible_check_on_2_and_4_ranks(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps(reference))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q17")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q17: all checks passed" in out, out
    assert "tp_layers' MLP: matches the unsharded layer; rank 0's forward: all-reduce of 8,192 bytes over ranks " \
           "[0, 1, 2, 3]; backward: all-reduce of 8,192 bytes over ranks [0, 1, 2, 3]" in out
    assert "rank 3 holds up.weight (32, 32), down.weight (32, 32): 2,112 parameter elements" in out


def grade(reference, tmp_path, answers: dict[str, str]) -> dict[str, tuple[float, list[str]]]:
    """Grade each q17 answer text through the hidden tests, all cases in one launch: {name: (fraction, lines)}."""
    from hidden_grading import grade_answers
    return grade_answers("q17", answers, reference, tmp_path)


# name: (the answer, its fraction of the points, what its feedback must say); parts: communication functions
# (6 items), layers (6), MLP numbers (3), MLP communication (3), a quarter each
MISTAKES = {
    "reference": (None, 1.0, "18 of 18 hidden checks passed"),
    # the column layer's numbers and rounds, the MLP's numbers and rounds: (1 + 3/6 + 0 + 0) / 4
    "q17_allreduce_both": (answer("q17_allreduce_both"), 0.375,
                           "An all-reduce after the column-parallel layer is a round too many"),
    # the row layer's and the MLP's outputs; the MLP's rounds are right: (1 + 3/6 + 0 + 1) / 4
    "q17_bias_every_rank": (answer("q17_bias_every_rank"), 0.625,
                            "Every rank added the bias before the all-reduce, so the sum counts it 2 times"),
    # the copy, the column layer, the MLP's input gradient and its backward round: (3/6 + 3/6 + 0 + 0) / 4
    # issue 41: one cause (the copy's missing backward round), named once, what it caused under it (it read
    # "9 problems": the cause x 3 pieces x value and rounds x t = 2 and 4)
    "q17_no_backward_mirror": (answer("q17_no_backward_mirror"), 0.25,
                               "q17: 6 of 18 hidden checks passed [q17] rank 0: CopyToTensorParallel's backward made "
                               "no collective"),
    # both layers and the MLP raise; the communication functions are right: (1 + 0 + 0 + 0) / 4
    "q17_wrong_dim": (answer("q17_wrong_dim"), 0.25, "cut along the wrong dimension"),
    # the MLP's numbers are right, its forward has an all-gather; both layers fail alone: (1 + 0 + 1 + 0) / 4
    "q17_gather": (answer("q17_gather"), 0.5, "The all-gather is an extra round"),
    # a barrier between the layers (issue 45): a round that carries no data is a round; only the MLP's
    # communication fails, on 2 and 4 ranks: (1 + 1 + 1 + 0) / 4
    "q17_barrier_between": (answer("q17_barrier_between"), 0.75, "made a barrier over ranks [0, 1], all-reduce of"),
    # a forgery (issue 45): the MLP gathers the whole weights through torch's unwrapped all_gather (nothing
    # recorded), computes the unsharded MLP and reduces zeros once each way; its numbers are right, its rounds
    # are not what its output is made of: (1 + 1 + 1 + 0) / 4
    "q17_gather_unrecorded": (answer("q17_gather_unrecorded"), 0.75,
                              "its output is not what that all-reduce gave back: it gave back zeros (every rank "
                              "handed it zeros)"),
}
# Valid answers written otherwise keep every point: the forward's sum made in a flat buffer of its own, and each
# all-reduce asynchronous, waited for at once
VALID = {
    "sum in a flat buffer": [
        ("        x = x.contiguous().clone()\n        dist.all_reduce(x, group=tp.group)\n        return x\n",
         "        flat = x.reshape(-1).clone()\n        dist.all_reduce(flat, group=tp.group)\n"
         "        return flat.view(x.shape)\n")],
    "asynchronous all-reduces": [
        ("        dist.all_reduce(grad, group=ctx.tp.group)\n", "        dist.all_reduce(grad, group=ctx.tp.group, "
         "async_op=True).wait()\n"),
        ("        dist.all_reduce(x, group=tp.group)\n", "        dist.all_reduce(x, group=tp.group, async_op=True)"
         ".wait()\n")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from pathlib import Path
    texts = {name: text if text is not None else Path(reference["q17"]).read_text()
             for name, (text, _, _) in MISTAKES.items()}
    right = Path(reference["q17"]).read_text()
    for name, edits in VALID.items():
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    graded = grade(reference, tmp_path, texts)
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        assert got == pytest.approx(fraction, abs=1e-4), (name, lines)
        assert says in " ".join("\n".join(lines).split()), (name, lines)   # messages wrap at 110 columns
    for name in VALID:
        assert graded[name][0] == 1.0, (name, graded[name][1])


@pytest.mark.slow
def test_a_sum_only_rank_0_joins_is_stopped_as_a_deadlock_and_named(reference, tmp_path, no_leftovers):
    """The row-parallel sum called under `if tp.rank == 0`: rank 0 waits in an all-reduce the others never
    call; they finish that part and wait for it at the case's barrier. The watch sees the collective no
    member will join and stops the case at once (it used to wait at the barrier until its 15 s timeout,
    twice, and name the waiting rank 1 as the problem), and the feedback names the call and who skipped it."""
    from pathlib import Path
    text = Path(reference["q17"]).read_text()
    call = "        dist.all_reduce(x, group=tp.group)\n"
    assert call in text
    skipped = text.replace(call, "        if tp.rank == 0:\n    " + call)
    (fraction, lines), = grade(reference, tmp_path, {"rank0_only": skipped}).values()
    text = " ".join("\n".join(lines).split())
    assert fraction == 0.0, lines
    assert "deadlock in a collective: a member of its group did not join it" in text, lines
    assert "rank 0 waits in all_reduce over ranks [0, 1], which rank 1 will not join" in text, lines
    assert "rank 1 has done this part of the case and waits for rank 0 at its end" in text, lines
    assert "dist.all_reduce(x, group=tp.group)" in text and "WaitTimedOut" not in text, lines

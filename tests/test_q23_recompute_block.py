"""q23: what a block keeps for its backward, and what recomputing it costs.

Fast: the lab's closed forms against the block's own measurement (bytes kept per mode, float32 and bfloat16, several
shapes; matmul FLOPs), in this process; the reference's gradients bitwise the plain block's over micro-batches in
flight; torch.utils.checkpoint with the streams restored, reentrant or not, and a selective policy are valid; the
lab's count sees what an answer keeps outside autograd; the prediction's figures and the figure; the sequence-parallel
closed forms, prediction and figure. Multi-process: the reference passes the visible check (its sp_block on t = 2 and
4 ranks too, every rank's saved bytes exactly the closed form); every cohort mistake (the sequence-parallel ones too)
and the valid variants, graded through the hidden tests in one launch, get their points and their messages.
"""
from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from grader.cohort.answers import answer

pytestmark = pytest.mark.q23

SHAPES = [(2, 32, 32, 4), (1, 128, 64, 8), (3, 48, 96, 6), (2, 64, 128, 2)]


def _reference_module(reference):
    spec = Path(reference["q23"]).read_text()
    module = types.ModuleType("q23_reference")
    exec(compile(spec, str(reference["q23"]), "exec"), module.__dict__)
    return module


def _block(b, s, h, a, dtype="float32", p=0.1, seed=0):
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.long_sequences.measure import make_block
    return make_block(LabConfig(hidden_size=h, num_heads=a, seq_len=s, dropout=p, seed=seed, num_stages=1), dtype)


def _x(b, s, h, dtype="float32", seed=1):
    from lab_src.topics.long_sequences.measure import DTYPES
    return torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed)).to(DTYPES[dtype]).requires_grad_()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_closed_forms_are_what_the_block_keeps_and_costs(dtype, reference):
    from lab_src.topics.long_sequences.measure import flops, kept
    from lab_src.topics.long_sequences.records import ITEMSIZE, SLACK_BYTES, extra_flops_range, forward_flops, kept_bytes
    ref = _reference_module(reference)
    for b, s, h, a in SHAPES:
        # the plain block: exactly the closed form, the measurement's own hooks and the live scan agree
        block = _block(b, s, h, a, dtype)
        got = kept(block, _x(b, s, h, dtype), known=list(block.parameters()))
        assert got["bytes"] == kept_bytes(b, s, h, a, ITEMSIZE[dtype], "none"), (b, s, h, a, got)
        assert got["saved"] == got["bytes"]
        assert flops(_block(b, s, h, a, dtype), _x(b, s, h, dtype))["forward"] == forward_flops(b, s, h)
        for mode in ("selective", "full"):
            block = _block(b, s, h, a, dtype)
            got = kept(ref.recompute_block(block, mode), _x(b, s, h, dtype), known=list(block.parameters()))
            want = kept_bytes(b, s, h, a, ITEMSIZE[dtype], mode)
            # the recomputation keeps what it replays: torch's CPU RNG state and the block's two streams' (5,056 B each)
            assert got["bytes"] == want + 3 * 5056, (mode, b, s, h, a, got, want)
            assert got["bytes"] <= want + SLACK_BYTES
            f = flops(ref.recompute_block(_block(b, s, h, a, dtype), mode), _x(b, s, h, dtype))
            extra = f["forward"] + f["backward"] - 3 * forward_flops(b, s, h)
            low, high = extra_flops_range(b, s, h, mode)
            assert low <= extra <= high
            # full: one forward more, a third; selective: QK^T alone (checkpoint stops before PV), 2 bs^2 h
            assert extra == (forward_flops(b, s, h) if mode == "full" else 2 * b * s * s * h)


def _sequence(module, block, dtype="float32", shape=(2, 64, 32, 4)):
    from lab_src.topics.long_sequences.measure import DTYPES, sequence
    b, s, h, _ = shape
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(b, s, h, generator=g).to(DTYPES[dtype]) for _ in range(3)]
    return sequence(module, block, xs)


def _same(u, v) -> bool:
    return all(torch.equal(a, b) for a, b in zip(u["outputs"] + u["input_grads"], v["outputs"] + v["input_grads"])) \
        and all(torch.equal(u["grads"][k], v["grads"][k]) for k in v["grads"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_reference_is_bitwise_the_plain_block_with_micro_batches_in_flight(dtype, reference):
    ref = _reference_module(reference)
    shape = (2, 64, 32, 4)
    block = _block(*shape, dtype)
    plain = _sequence(block, block, dtype)
    for mode in ("none", "selective", "full"):
        block = _block(*shape, dtype)
        assert _same(_sequence(ref.recompute_block(block, mode), block, dtype), plain), mode
    with pytest.raises(ValueError, match="mode must be"):
        ref.recompute_block(_block(*shape), "everything")


def test_the_judge_names_new_masks_and_streams_left_behind(reference):
    """The judge's reading of the data, in this process: torch's checkpoint alone (new masks in the recomputation),
    the streams set back and left there (the next forward redraws old masks), and the reference."""
    from lab_src.topics.long_sequences.judge import gradient_problems
    texts = {"reference": Path(reference["q23"]).read_text(), "new masks": answer("q23_new_masks"),
             "not put back": answer("q23_states_not_put_back")}
    shape = (2, 64, 32, 4)
    block = _block(*shape)
    plain = _sequence(block, block)
    said = {}
    for name, text in texts.items():
        module = types.ModuleType(name)
        exec(compile(text, name, "exec"), module.__dict__)
        block = _block(*shape)
        got = _sequence(module.recompute_block(block, "full"), block)
        said[name] = " ".join(str(p) for p in gradient_problems("full", got, plain, "float32"))
    assert said["reference"] == ""
    assert "the recomputation in the backward drew new dropout masks" in said["new masks"]
    assert "left block.streams where it ended" in said["not put back"]


def test_torch_checkpoint_reentrant_and_a_selective_policy_are_valid(reference):
    """Written otherwise, judged alike: the reentrant checkpoint, and selective recomputation by torch's own policy
    (create_selective_checkpoint_contexts: the linear layers' and LayerNorms' outputs saved, the rest recomputed: less
    memory than the closed form, the core's matmuls alone redone), the streams restored around it."""
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    from lab_src.topics.long_sequences.measure import flops, kept
    from lab_src.topics.long_sequences.records import ITEMSIZE, SLACK, SLACK_BYTES, extra_flops_range, forward_flops, kept_bytes
    ref = _reference_module(reference)
    aten = torch.ops.aten
    # the linear layers' and the LayerNorms' outputs saved; everything else (the core, GELU, the masks) recomputed
    saved_ops = {aten.addmm.default, aten.native_layer_norm.default}

    class Policy(torch.nn.Module):
        def __init__(self, block, mode):
            super().__init__()
            self.block = block

        def forward(self, x):
            gens = ref._generators(self.block)

            def policy(ctx, op, *args, **kwargs):
                return CheckpointPolicy.MUST_SAVE if op in saved_ops else CheckpointPolicy.PREFER_RECOMPUTE

            return checkpoint(ref._replayed(self.block, gens), x, use_reentrant=False,
                              context_fn=lambda: create_selective_checkpoint_contexts(policy))

    class Reentrant(torch.nn.Module):
        def __init__(self, block, mode):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(ref._replayed(self.block, ref._generators(self.block)), x, use_reentrant=True)

    shape = (2, 64, 32, 4)
    block = _block(*shape)
    plain = _sequence(block, block)
    for cls, mode in ((Reentrant, "full"), (Policy, "selective")):
        block = _block(*shape)
        assert _same(_sequence(cls(block, mode), block), plain), cls
        b, s, h, a = shape
        block = _block(*shape)
        got = kept(cls(block, mode), _x(b, s, h), known=list(block.parameters()))["bytes"]
        want = kept_bytes(b, s, h, a, ITEMSIZE["float32"], mode)
        assert got <= want * (1 + SLACK) + SLACK_BYTES, (cls, got, want)
        f = flops(cls(_block(*shape), mode), _x(b, s, h))
        low, high = extra_flops_range(b, s, h, mode)
        assert low <= f["forward"] + f["backward"] - 3 * forward_flops(b, s, h) <= high, cls


def test_the_count_sees_what_an_answer_keeps_outside_autograd(reference):
    """A 'full' recomputation that also keeps the attention's probabilities on the module (a cache, not a saved
    tensor): the lab's count is what the forward left alive, not what autograd saved."""
    from lab_src.topics.long_sequences.measure import kept
    from lab_src.topics.long_sequences.records import ITEMSIZE, SLACK_BYTES, kept_bytes
    ref = _reference_module(reference)

    class Cached(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.inner, self.cache = ref.recompute_block(block, "full"), []

        def forward(self, x):
            with torch.no_grad():
                self.cache.append(self.inner.block(x.detach()))     # a whole forward's output, kept aside
                self.cache.append(torch.ones(x.shape[0], 4, x.shape[1], x.shape[1]))
            return self.inner(x)

    b, s, h, a = 2, 64, 32, 4
    block = _block(b, s, h, a)
    got = kept(Cached(block), _x(b, s, h), known=list(block.parameters()))
    assert got["saved"] < kept_bytes(b, s, h, a, 4, "full") + SLACK_BYTES
    assert got["bytes"] >= kept_bytes(b, s, h, a, ITEMSIZE["float32"], "full") + 4 * (b * s * h + b * a * s * s)


def test_the_prediction_and_the_figure(tmp_path, reference):
    from grader.hidden.common import Context
    from grader.hidden.q23_recompute_block import prediction_items
    from lab_src.checks.q23_recompute_block import prediction
    from lab_src.topics.long_sequences.figure import kept_bars
    from lab_src.topics.long_sequences.records import paper_bytes, prediction_wanted
    assert prediction_wanted() == {"none": 15_015_936, "selective": 2_367_488, "full": 131_072}
    # the paper's figures are 15 % and 6 % under the lab's block's (2-byte masks, the LayerNorms' statistics, s^2)
    assert paper_bytes(4, 256, 64, 8, "none") == 12_713_984 and paper_bytes(4, 256, 64, 8, "selective") == 2_228_224
    path = tmp_path / "q23.py"
    path.write_text(answer("q23_paper_prediction"))
    got, text = prediction(str(path))
    text = " ".join(text.split())
    assert "none 12,713,984 wrong: it is 15,015,936" in text and "full 131,072 right" in text
    items = prediction_items(Context(student={"q23": str(path)}, reference=reference))
    assert [i.passed for i in items] == [False, False, True]
    fig = kept_bars({"none": 15_015_936, "selective": 2_382_656, "full": 146_240}, got, (4, 256, 64, 8), "bfloat16")
    assert len(fig.axes[0].patches) == 9


def test_the_sequence_parallel_forms_prediction_and_figure(tmp_path, reference):
    """The per-rank closed forms at the prediction's shape (t = 4, bfloat16), the paper's beside them; the second
    prediction read from the reference and graded; the figure of any report."""
    from grader.hidden.common import Context
    from grader.hidden.q23_recompute_block import sp_prediction_items
    from lab_src.checks.q23_recompute_block import prediction, sp_figure
    from lab_src.topics.long_sequences.figure import sp_bars
    from lab_src.topics.long_sequences.records import (
        kept_bytes,
        sp_gathered_extra,
        sp_kept_bytes,
        sp_paper_bytes,
        sp_prediction_wanted,
        tp_kept_bytes,
    )
    assert sp_prediction_wanted() == {"tensor_parallel": 4_399_104, "sequence_parallel": 3_803_136}
    # at t = 1 both are the plain block's; the paper's sequence-parallel form is its 34 sbh + 5 as^2 b over t
    assert tp_kept_bytes(4, 256, 64, 8, 2, 1) == sp_kept_bytes(4, 256, 64, 8, 2, 1) == kept_bytes(4, 256, 64, 8, 2, "none")
    assert sp_paper_bytes(4, 256, 64, 8, 4) == 12_713_984 // 4
    assert sp_gathered_extra(2, 16, 32, 8, 2) == 8_192
    got, text = prediction(reference["q23"], sp=True)
    assert got == {"tensor_parallel": 4_399_104, "sequence_parallel": 3_803_136}, text
    assert all(i.passed for i in sp_prediction_items(Context(student={"q23": reference["q23"]}, reference=reference)))
    path = tmp_path / "q23.py"
    path.write_text(Path(reference["q23"]).read_text().replace('"sequence_parallel": 2 * (18', '"sequence_parallel": 1 * (18'))
    items = sp_prediction_items(Context(student={"q23": str(path)}, reference=reference))
    assert [i.passed for i in items] == [True, False]
    assert "one of t = 4 ranks keeps 3,803,136 B" in items[1].problems[0].message
    assert len(sp_bars({r: 3_803_136 for r in range(4)}, got, (4, 256, 64, 8, 4), "bfloat16").axes[0].patches) == 4
    assert sp_figure(None) is None


def _load(path, name):
    module = types.ModuleType(name)
    exec(compile(Path(path).read_text(), str(path), "exec"), module.__dict__)
    return module


def test_the_tensor_and_sequence_parallel_forms_are_what_the_reference_blocks_save(reference):
    """Both per-rank closed forms measured, three shapes x t = 1, 2, 4 x float64 and bfloat16, dropout on: q18's
    reference block (q17's layers) against tp_kept_bytes, q23's sp_block against sp_kept_bytes, each rank's saved
    tensors counted as the kind counts them. One process stands for rank 0 of t on torch's fake process group: its
    collectives move nothing, and what a rank saves depends on the shapes alone (the kind measures the
    sequence-parallel form on real ranks too, with their values)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.model import build_piece
    from lab_src.topics.long_sequences import shards
    from lab_src.topics.long_sequences.kind_sp import Saved
    from lab_src.topics.long_sequences.records import sp_kept_bytes, tp_kept_bytes
    q17, q18, q23 = (_load(reference[q], q) for q in ("q17", "q18", "q23"))
    wrong = []
    for t in (1, 2, 4):
        dist.init_process_group("fake", rank=0, world_size=t, store=FakeStore())
        try:
            tp = shards.TensorParallel(0, t, dist.group.WORLD, torch.device("cpu"))
            for b, s, h, a in [(2, 32, 32, 4), (1, 64, 64, 8), (3, 48, 96, 4)]:
                cfg = shards.block_config(LabConfig(hidden_size=h, num_heads=a, seq_len=s, seed=0, num_stages=1,
                                                    global_batch_size=b, num_microbatches=1), t, 0.1)
                for dtype, e in ((torch.float64, 8), (torch.bfloat16, 2)):
                    for form, make, rows, want in (
                            ("tp", lambda blk: q18.tp_block(blk, tp, q17), s, tp_kept_bytes(b, s, h, a, e, t)),
                            ("sp", lambda blk: q23.sp_block(blk, tp), s // t, sp_kept_bytes(b, s, h, a, e, t))):
                        block = build_piece(cfg, shards.BLOCK, torch.device("cpu")).to(dtype).train()
                        module = make(block)
                        x = torch.randn(b, rows, h, dtype=dtype, requires_grad=True)
                        with Saved(list(module.parameters()) + list(block.parameters())) as saved:
                            module(x)
                        if saved.record()["bytes"] != want:
                            wrong.append((form, t, (b, s, h, a), e, saved.record()["bytes"], want))
        finally:
            dist.destroy_process_group()
    assert not wrong, wrong


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q23")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q23: all checks passed" in out, out
    # the bfloat16 run at the prediction's shape: kept, closed form, the paper's, FLOPs and their ratio per mode
    assert "none 15,015,936 15,015,936 12,713,984 503,316,480 1.000x" in out
    assert "selective 2,382,656 2,367,488 2,228,224 536,870,912 1.067x" in out
    assert "full 146,240 131,072 131,072 671,088,640 1.333x" in out
    assert "none 15,015,936 right selective 2,367,488 right full 131,072 right" in out
    from lab_src.checks.q23_recompute_block import kept_figure, sp_figure
    assert kept_figure(report) is not None
    # sp_block: every rank saved exactly the sequence-parallel closed form (float64 at t = 2 and 4, bfloat16 at the
    # prediction's shape on 4 ranks), with the formula's all-gathers and reduce-scatters
    assert "dropout 0 99,072 99,072 124,160 AG 2 x 4,096, RS 2 x 8,192 / AG 4 x 4,096, AR 6 x 256, RS 2 x 8,192" in out
    assert "dropout 3 49,664 49,664 87,296 AG 2 x 2,048, RS 2 x 8,192 / AG 4 x 2,048, AR 6 x 256, RS 2 x 8,192" in out
    assert ("dropout 3 3,803,136 3,803,136 4,399,104 AG 2 x 32,768, RS 2 x 131,072 / AG 4 x 32,768, AR 6 x 128, "
            "RS 2 x 131,072") in out
    assert "tensor_parallel 4,399,104 right sequence_parallel 3,803,136 right" in out
    assert report.sp_kept == {r: 3_803_136 for r in range(4)}
    assert "the digits model trained with sp_block, t = 2, dropout 0.1, 20 steps" in out
    assert sp_figure(report) is not None


def test_the_study_in_the_pipeline(reference, in_tmp, no_leftovers, capsys):
    """The reference's 1F1B step on 4 ranks with the reference's recompute_block around every block, in each mode:
    every rank holds min(p - r, m) micro-batches at its peak; per micro-batch the middle ranks keep exactly their
    blocks' closed form, and what the first and last keep beyond it is the same in every mode; every mode's
    gradients are the plain run's, bit for bit."""
    from lab_src.checks.recompute_study import pipeline_kept_figure, recompute_study
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        study = recompute_study()
    finally:
        del os.environ["LAB_ANSWERS"]
    out = capsys.readouterr().out
    assert study is not None and not study.problems, out
    rows = {(r["mode"], r["rank"]): r for r in study.rows}
    assert len(rows) == 12, out
    for (mode, rank), row in rows.items():
        assert row["in_flight"] == min(4 - rank, 8), (mode, rank, out)
        assert row["as_plain"] is True, (mode, rank, out)
        assert row["rest"] == rows[("none", rank)]["rest"], (mode, rank, out)
        if rank in (1, 2):
            assert row["rest"] == 0, (mode, rank, out)
    for rank in range(4):
        assert rows[("full", rank)]["peak"] < rows[("selective", rank)]["peak"] < rows[("none", rank)]["peak"]
    assert pipeline_kept_figure(study) is not None


def test_the_study_launches_nothing_under_validate_or_after_a_failed_check(monkeypatch, capsys):
    from lab_src import grading
    from lab_src.checks import recompute_study as study
    monkeypatch.setattr(study, "run_cases", lambda *a, **k: pytest.fail("the study launched"))
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert study.recompute_study() is None
    assert "skipped under Validate" in capsys.readouterr().out
    monkeypatch.delenv("NBGRADER_EXECUTION")
    monkeypatch.setitem(grading._checked, "q23", "CheckFailed: q23: FAILED, 1 problem\n[q23]: still the stub")
    assert study.recompute_study() is None
    assert "the check above did not pass: make it pass first" in capsys.readouterr().err
    assert study.pipeline_kept_figure(None) is None


# name: (the answer, its fraction of the points, what its feedback must say); nine parts, a ninth each: gradients,
# memory, flops (4 cases x 3 modes each), prediction (3 figures and the 2 of sequence parallelism), sp_values and
# sp_replicated (the 2 float64 cases, dropout off and on: 4 items each), sp_memory (3: dropout on), sp_traffic (3
# cases), sp_training (1)
MISTAKES = {
    "reference": (None, 1.0, "56 of 56 hidden checks passed"),
    # selective and full wrong in every case: gradients 4/12
    "q23_new_masks": (answer("q23_new_masks"), 0.9259, "the recomputation in the backward drew new dropout masks"),
    "q23_states_not_put_back": (answer("q23_states_not_put_back"), 0.9259,
                                "the recomputation left block.streams where it ended"),
    # selective keeps the attention mask: its memory wrong in every case, 8/12
    "q23_selective_keeps_mask": (answer("q23_selective_keeps_mask"), 0.963,
                                 "as much as the attention's dropout mask or probabilities"),
    # selective checkpoints the whole block: it keeps less, but its FLOPs are a whole forward's in every case: 8/12
    "q23_selective_is_full": (answer("q23_selective_is_full"), 0.963, "more than the core was recomputed"),
    # 3 of 5 figures right
    "q23_paper_prediction": (answer("q23_paper_prediction"), 0.9556, "the predicted 'none' is 12,713,984 B"),
    "q23_new_masks_paper": (answer("q23_new_masks_paper"), 0.8815, "drew new dropout masks"),
    # sp_block: the replicated gradients not summed: sp_replicated 0 of 4, and the training leaves one process's curve
    # (the replicas drift apart; named as such, and counted, as q18's trainings count theirs)
    "q23_sp_norms_not_summed": (answer("q23_sp_norms_not_summed"), 0.7778,
                                "is the part of its own s/t positions only"),
    # sp_block: the column layers keep the gathered input: sp_memory 0 of 3 (its traffic, 2 all-gathers fewer in the
    # backward, is the memory's consequence and not counted again)
    "q23_sp_saves_gathered": (answer("q23_sp_saves_gathered"), 0.8889,
                              "as much as the gathered inputs of the two column-parallel layers"),
    # sp_block: the same, the gathered input kept on ctx rather than saved for the backward: autograd's count misses
    # it, the lab's scan of what the forward left alive does not
    "q23_sp_gathered_on_ctx": (None, 0.8889, "the rest is kept elsewhere (on ctx, in a closure)"),
    # sp_block: every shard draws its own residual masks: the values with dropout wrong, 2 of 4, and the training
    # (dropout 0.1) leaves one process's curve, named as their consequence
    "q23_sp_same_masks": (answer("q23_sp_same_masks"), 0.8333, "right without dropout, wrong with it"),
    # ines: (4/12 + 1 + 1 + 3/5 + 1 + 0 + 0 + 1 + 0) / 9
    "q23_ines": (answer("q23_ines"), 0.5481, "is the part of its own s/t positions only"),
}
# mistakes written here as edits of the reference (the cohort's are grader/cohort/mistakes.py's)
EDITED = {
    "q23_sp_gathered_on_ctx": [("""        ctx.tp = tp
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather(x, tp), weight, bias)""",
                                """        ctx.tp = tp
        ctx.whole = _all_gather(x, tp)                      # kept for the backward
        ctx.save_for_backward(weight)
        return F.linear(ctx.whole, weight, bias)"""),
                               ("""        x, weight = ctx.saved_tensors
        whole = _all_gather(x, ctx.tp)                       # gathered again, not kept""",
                                """        weight, = ctx.saved_tensors
        whole = ctx.whole""")],
}
# written otherwise, valid: every point
VALID = {
    "reentrant": [("""            return checkpoint(_replayed(self.block, gens), x, use_reentrant=False)""",
                   """            return checkpoint(_replayed(self.block, gens), x, use_reentrant=True)"""),
                  ("""        attn = checkpoint(_replayed(core, gens), q, k, v, use_reentrant=False)""",
                   """        attn = checkpoint(_replayed(core, gens), q, k, v, use_reentrant=True)""")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q23"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in (EDITED | VALID).items():
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    graded = grade_answers("q23", texts, reference, tmp_path)
    wrong = []
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        if got != pytest.approx(fraction, abs=1e-4) or says not in " ".join("\n".join(lines).split()):
            wrong.append((name, got, lines))
    wrong += [(name, graded[name][0], graded[name][1]) for name in VALID if graded[name][0] != 1.0]
    assert not wrong, wrong

"""q26: mixed precision in the sharded step: float32 master shards, gathers and compute in bf16 or fp16, gradients
reduced in float32, an fp16 loss scaler whose skip is agreed over the group.

Fast, in this process: the unit roundoffs and the two facts the notebook shows; the scale's rules against torch's own
GradScaler; the prediction; the reference answer on one rank against one process's step with the same casts (to the
bit). Multi-process: the reference passes the visible check (bytes per element of the gathers and reduce-scatters,
the scale trajectory); every realistic mistake, graded through the hidden tests in one launch, loses the right parts
with its message, and answers written otherwise keep every point.
"""
from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch

from grader.cohort.answers import answer

pytestmark = pytest.mark.q26


class OneRank:
    """A data-parallel group of one rank: every collective is the identity."""
    size, rank = 1, 0

    def all_gather(self, shard):
        return shard.detach().clone()

    def reduce_scatter(self, flat):
        return flat.clone()

    def all_reduce(self, t):
        return t


def _reference_module(reference):
    module = types.ModuleType("q26_reference")
    path = reference["q26"]
    exec(compile(Path(path).read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the reference answer
    return module


def test_unit_roundoffs_and_the_notebooks_two_facts():
    from lab_src.topics.mixed_precision.records import UNIT_ROUNDOFF
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        u = UNIT_ROUNDOFF[name]
        assert torch.finfo(dtype).eps == 2 * u                    # eps is the gap at 1: twice the unit roundoff
        one = torch.tensor(1.0, dtype=dtype)
        assert (one + torch.tensor(u, dtype=dtype)).item() == 1.0            # ties to even: lost
        assert (one + torch.tensor(2 * u, dtype=dtype)).item() > 1.0
    assert (torch.tensor(1.0).bfloat16() + torch.tensor(1e-3).bfloat16()).item() == 1.0
    assert torch.tensor(1e-8).half().item() == 0.0 and (torch.tensor(1e-8) * 2 ** 16).half().item() > 0


def test_the_scale_rules_are_torchs_gradscaler():
    """records.scale_trajectory against torch.amp.GradScaler on the CPU, the same infs, growth every 2 steps."""
    from lab_src.topics.mixed_precision.records import scale_trajectory
    found = [False, False, False, True, False, True, True, False, False, False, False]
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", growth_interval=2)
    got = []
    for inf in found:
        opt.zero_grad()
        scaler.scale((w * 1.0).sum()).backward()
        if inf:
            w.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        got.append(scaler.get_scale())
    assert got == scale_trajectory(found, 2)
    assert scale_trajectory([False] * 4, 2) == [65536.0, 131072.0, 131072.0, 262144.0]


def test_the_prediction():
    from lab_src.topics.mixed_precision.records import prediction_wanted
    assert prediction_wanted() == {"gather": 25_408, "master": 101_632, "bf16_only": 50_816}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_reference_on_one_rank_is_one_process_with_the_same_casts_to_the_bit(reference, dtype):
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.mixed_precision import model as lab_model
    from lab_src.topics.mixed_precision.records import MixedSettings, scale_trajectory
    ref = _reference_module(reference)
    cfg = LabConfig(hidden_size=16, num_heads=2, seq_len=8, seed=5)
    s = MixedSettings(dtype=dtype, steps=4, growth_interval=2, inject_step=2 if dtype == "float16" else -1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dp = OneRank()
        mods = [ref.mixed_precision_layer(b, dp, lab_model.DTYPES[dtype]) for b in lab_model.blocks(cfg, s)]
        assert all(m.shard.dtype == torch.float32 for m in mods)
        opt = torch.optim.SGD([m.shard for m in mods], lr=s.lr)
        scaler = ref.LossScaler(dp, growth_interval=2) if s.scaled else None
        model = lab_model.blocks(cfg, s)
        masters = [lab_model.flat_of(b) for b in model]
        scale, found = (scaler.get_scale() if scaler else 1.0), []
        for k in range(s.steps):
            opt.zero_grad(set_to_none=True)
            x, target = lab_model.batch(cfg, s, k, 0)
            h = x
            for m in mods:
                h = m(h)
            assert h.dtype == torch.float32
            loss = lab_model.loss_of(h, target)
            (scaler.scale(loss) if scaler else loss).backward()
            want = lab_model.one_step(cfg, s, model, masters, k, 1, scale)
            assert all(m.shard.grad.dtype == torch.float32 and torch.equal(m.shard.grad, g)
                       for m, g in zip(mods, want["summed"]))
            if k == s.inject_step:
                mods[0].shard.grad[0] = float("inf")
            if scaler:
                scaler.step(opt)
                scaler.update()
                found.append(want["found"])
                assert scaler.get_scale() == scale_trajectory(found, 2)[-1]
                scale = scaler.get_scale()
            else:
                opt.step()
            assert all(torch.equal(m.shard.detach(), a) for m, a in zip(mods, want["after"]))
            masters = want["after"]
        assert found == ([False, False, True, False] if scaler else [])
    finally:
        torch.set_num_threads(before)


# the parts each answer fails in the hidden tests' four cases (bf16 n = 2, bf16 n = 4, fp16 n = 2, fp16 n = 4), the
# judge run in this process on ranks simulated by threads (tests/q26_threads.py)
FAILED_PARTS = {
    "reference": [set(), set(), set(), set()],
    "q26_gather_float32": [{"bytes"}] * 4,
    "q26_reduce_low_precision": [{"gradients", "bytes"}] * 4,
    "q26_master_low_precision": [{"training", "dtypes"}] * 4,
    "q26_inf_not_agreed": [set(), set(), {"training", "scaling"}, {"training", "scaling"}],
    "q26_scale_not_halved": [set(), set(), {"scaling"}, {"scaling"}],
    "q26_never_grows": [set(), set(), {"scaling"}, {"scaling"}],
    "q26_not_skipped": [set(), set(), {"training", "scaling"}, {"training", "scaling"}],
}


def test_the_judge_on_threads_names_each_mistake_in_its_parts(reference):
    from q26_threads import run_case

    from grader.hidden.q26_mixed_precision_layer import CASES
    from lab_src.topics.mixed_precision.judge import judge_run
    right = Path(reference["q26"]).read_text()
    wrong = []
    for name, parts in FAILED_PARTS.items():
        text = right if name == "reference" else answer(name)
        for (label, (cfg, n, settings)), want in zip(CASES.items(), parts):
            found = judge_run(run_case(text, cfg, n, settings))
            got = {part for part, problems in found.items() if problems}
            if got != want:
                wrong.append((name, label, got, {k: [p.message[:200] for p in v] for k, v in found.items() if v}))
    assert not wrong, wrong


def test_the_opening_figure():
    from lab_src.topics.mixed_precision.figure import dtype_figure
    fig = dtype_figure()
    assert len(fig.axes) == 1 and fig._repr_png_()[:4] == b"\x89PNG"


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q26")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q26: all checks passed" in out, out
    # per rank: gathers of 2 bytes an element, reduce-scatters of 4, the shard and its gradient float32; in fp16 one
    # all-reduce (the found-inf flag) a step
    assert "0 2 4 float32 float32 0" in out and "1 2 4 float32 float32 1" in out, out
    # growth every 2 clean steps, the inf at step 2 halves it
    assert "loss scale after each step: 65536, 131072, 65536, 65536" in out, out
    assert "gather 25,408 right" in out and "bf16_only 50,816 right" in out, out


# name: (the answer, its fraction of the points, what its feedback must say). The score is the mean over the parts
# of the share of their items passed (grader/trusted.py score): gradients, training, bytes, dtypes (4 cases each),
# scaling (the 2 fp16 cases), prediction (3 figures); 21 items
MISTAKES = {
    "reference": (None, 1.0, "21 of 21 hidden checks passed"),
    "q26_gather_float32": (answer("q26_gather_float32"), 5 / 6, "the shard was gathered in float32 and cast after"),
    "q26_reduce_low_precision": (answer("q26_reduce_low_precision"), 4 / 6,
                                 "the gradient was reduce-scattered in bfloat16"),
    "q26_master_low_precision": (answer("q26_master_low_precision"), 4 / 6,
                                 "updates one process's float32 master made to this rank's shard were lost"),
    "q26_inf_not_agreed": (answer("q26_inf_not_agreed"), 4.5 / 6, "The found-inf flag must be agreed over the group"),
    "q26_scale_not_halved": (answer("q26_scale_not_halved"), 5 / 6, "the scale is halved (backoff_factor 0.5)"),
    "q26_never_grows": (answer("q26_never_grows"), 5 / 6, "the scale doubles (growth_factor 2"),
    "q26_not_skipped": (answer("q26_not_skipped"), 4.5 / 6, "every rank stepped anyway"),
    "q26_gather_predicted_float32": (answer("q26_gather_predicted_float32"), (5 + 2 / 3) / 6,
                                     "float32's bytes: the gather carries the cast"),
}

def _scaler_left_as_released(text: str) -> str:
    """The reference with LossScaler as the release hands it out: every method raises NotImplementedError()."""
    start, end = text.index("class LossScaler:"), text.index("class _CastGathered")
    stub = ("class LossScaler:\n" + "".join(
        f"    def {m}:\n        raise NotImplementedError()\n\n"
        for m in ("__init__(self, dp, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)",
                  "scale(self, loss)", "step(self, optimizer)", "update(self)", "get_scale(self)")) + "\n")
    return text[:start] + stub + text[end:]


# the layer written, the scaler left as released: the bf16 cases pass, the fp16 ones stop at the stub (every part of
# theirs), named as the stub: (4 x 2/4 + 0 + 1) / 6
SCALER_STUB = (0.5, "q26 LossScaler.__init__() is still the stub from the release")

# written otherwise, valid: every point (only behaviour is judged)
VALID = {
    # divided before the sum, unscaled by a division, the flag as a bool summed
    "divided_first": [
        ("""        grad_shard = module.dp.reduce_scatter(grads[-1].float()) / module.dp.size     # summed in float32""",
         """        grad_shard = module.dp.reduce_scatter(grads[-1].float() / module.dp.size)"""),
        ("""                    p.grad.mul_(1.0 / self.current)""", """                    p.grad.div_(self.current)"""),
    ],
    # the weights cast view by view after the gather of the cast shard (the same values), the output cast by .to
    "cast_per_view": [
        ("""            out[name] = full[offset:offset + count].view(shape)""",
         """            out[name] = full[offset:offset + count].view(shape).to(self.dtype)"""),
        ("""        return y.float()""", """        return y.to(torch.float32)"""),
    ],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q26"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in VALID.items():
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    texts["scaler_stub"] = _scaler_left_as_released(right)
    graded = grade_answers("q26", texts, reference, tmp_path)
    wrong = []
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        if got != pytest.approx(fraction, abs=1e-4) or says not in " ".join("\n".join(lines).split()):
            wrong.append((name, got, lines))
    wrong += [(name, graded[name][0], graded[name][1]) for name in VALID if graded[name][0] != 1.0]
    got, lines = graded["scaler_stub"]
    if got != pytest.approx(SCALER_STUB[0], abs=1e-4) or SCALER_STUB[1] not in " ".join("\n".join(lines).split()):
        wrong.append(("scaler_stub", got, lines))
    assert not wrong, wrong


FORGED_GATHER = (
    "        full = module.dp.all_gather(shard.detach().to(module.dtype))       # half the bytes of float32\n",
    "        module.dp.all_gather(shard.detach().to(module.dtype))             # for the record, used for nothing\n"
    "        from lab_src.comm.collectives import _ORIGINAL\n"
    "        import torch.distributed as dist\n"
    "        n = sum(k for _, _, k in module.shapes)\n"
    "        sizes = [t.numel() for t in torch.tensor_split(torch.empty(n), module.dp.size)]\n"
    "        start = sum(sizes[:module.dp.rank])\n"
    "        whole = torch.zeros(n)\n"
    "        whole[start:start + sizes[module.dp.rank]] = shard.detach()\n"
    "        _ORIGINAL.get('all_reduce', dist.all_reduce)(whole, group=module.dp.group)   # float32, unrecorded\n"
    "        full = whole.to(module.dtype)\n")


def test_a_float32_gather_around_the_recorder_is_named_by_the_wire(reference, tmp_path, no_leftovers):
    """The record shows a gather of the cast shard (made, then unused); the block is computed on a float32 whole
    summed by torch's all_reduce reached around the recorder. The values are right, so only the bytes on the wire,
    counted outside the rank (Kind(wire=True)), can tell: the bytes part fails in every case, and nothing else."""
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q26"]).read_text()
    old, new = FORGED_GATHER
    assert right.count(old) == 1
    got, lines = grade_answers("q26", {"forged": right.replace(old, new)}, reference, tmp_path)["forged"]
    said = " ".join("\n".join(lines).split())
    assert got == pytest.approx(0.8333, abs=1e-4), said
    assert "no message of its record carried" in said and "float32 elements' worth" in said, said

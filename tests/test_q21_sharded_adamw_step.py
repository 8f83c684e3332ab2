"""q21: AdamW's state and the gradients sharded over the data-parallel ranks (ZeRO-1/2), on ring halves.

Fast: the shards are torch.tensor_split's; the prediction's figures; the opening figure. Multi-process: the
reference passes the visible check (one shard's state held, an all-reduce's bytes sent, parameters as one process's
AdamW); every cohort mistake and a valid answer written otherwise, graded through the hidden tests in one launch,
get their points and their messages.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grader.cohort.answers import answer

pytestmark = pytest.mark.q21


def test_the_shards_are_tensor_splits():
    from lab_src.topics.sharding.records import shard_bounds
    for total in (1, 3, 7, 29_949, 30_144):
        for n in (1, 2, 3, 4):
            parts = torch.tensor_split(torch.arange(total), n)
            assert [shard_bounds(total, n, i) for i in range(n)] == \
                [(int(p[0]), int(p[-1]) + 1) if len(p) else (shard_bounds(total, n, i)[0],) * 2
                 for i, p in enumerate(parts)]


def test_the_predictions_figures_and_the_opening_figure():
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.model import build_model
    from lab_src.topics.sharding.figure import zero_figure
    from lab_src.topics.sharding.records import PREDICTION_PARAMS, zero_wanted
    assert sum(p.numel() for p in build_model(LabConfig(), "cpu").parameters()) == PREDICTION_PARAMS
    assert zero_wanted() == {"dp": 1_701_888, "zero1": 1_063_680, "zero2": 744_576, "sent": 638_208}
    assert len(zero_figure(4).axes[0].get_yticks()) == 4
    # the opening draws plain data parallelism alone: the ZeRO rows would answer the prediction asked after it
    assert [t.get_text() for t in zero_figure(4, stages=1).axes[0].get_yticklabels()] == ["data parallel"]


def test_the_check_prints_each_predicted_number_right_or_wrong(tmp_path, reference):
    from grader.hidden.common import Context
    from grader.hidden.q21_sharded_adamw_step import prediction_items
    from lab_src.checks.q21_sharded_adamw_step import prediction_line
    answer = tmp_path / "q21.py"
    # zero1 as ZeRO-2's figure (wrong), sent within half a percent (right)
    answer.write_text('def predicted_bytes():\n    return {"dp": 1_701_888, "zero1": 744_576, "zero2": 744_576, '
                      '"sent": 640_000}\n')
    text = " ".join(prediction_line(str(answer)).split())
    assert "dp 1,701,888 right zero1 744,576 wrong: it is 1,063,680 zero2 744,576 right sent 640,000 right" in text
    assert "the grader compares them" not in text
    # the hidden test says the same, with the same tolerance
    items = prediction_items(Context(student={"q21": str(answer)}, reference=reference))
    assert [i.passed for i in items] == [True, False, True, True]
    answer.write_text("def predicted_bytes():\n    return (1, 2, 3, 4)\n")
    assert '`return {"dp": ..., "zero1": ..., "zero2": ..., "sent": ...}`' in prediction_line(str(answer))


def test_the_ring_reduce_scatters_contributions():
    """Which replicas' gradients each chunk sums after the ring: q19's leaves rank r with chunk r + 1 whole and its
    own chunk r with its own gradient alone; the contract's shift leaves chunk r whole (judge.py shift_problem)."""
    from lab_src.topics.sharding.judge import ring_contributions
    for n in (2, 3, 4):
        q19, shifted = ring_contributions(n, 0), ring_contributions(n, 1)
        for r in range(n):
            assert q19[r][(r + 1) % n] == set(range(n)) and q19[r][r] == {r}
            assert shifted[r][r] == set(range(n))


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q21")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q21: all checks passed" in out, out
    # rank 1 of 4 holds the moments of elements 7,488 to 14,974 of 29,949, and sends 2 x 3 shards a step
    assert "1 0 29,949 59,896 59,896 239,592 0 179,696 179,694 as AdamW" in out
    assert "dp 1,701,888 right zero1 1,063,680 right zero2 744,576 right sent 638,208 right" in out
    assert report.timeline() is not None
    # the memory lane: every event of the 4-rank run carries rank 1's state; its parameters (29,949 float32) all
    # along, the whole gradients after the backwards, freed by the step, and one shard's moments from the first step
    mine = [e for e in report.views[0]["events"] if e.rank == 1]
    assert mine and all(e.state is not None for e in mine)
    assert {e.state[0] for e in mine} == {119_796} and max(e.state[2] for e in mine) == 119_796
    assert mine[-1].state[2:] == (0, 59_896) and any(e.held for e in mine if e.is_compute)


# name: (the answer, its fraction of the points, what its feedback must say); parts: values, memory, messages (4
# cases each), prediction (4 figures), a quarter each
MISTAKES = {
    "reference": (None, 1.0, "16 of 16 hidden checks passed"),
    "q21_full_state": (answer("q21_full_state"), 0.75, "AdamW's two moments for every element of the stage"),
    "q21_allreduce_slice": (answer("q21_allreduce_slice"), 0.75, "an all-reduce of the gradients and then an all-gather"),
    # told by the data, once for the four cases: the first step is one process's torch.optim.Adam with L2 decay
    "q21_l2_decay": (answer("q21_l2_decay"), 0.75,
                     "the weight decay was added to the gradient (Adam's L2 decay, g + 0.01 p), not decoupled as AdamW "
                     "does it: after step 0 this rank's parameters are one process's torch.optim.Adam(weight_decay="
                     "0.01)'s"),
    "q21_grads_kept": (answer("q21_grads_kept"), 0.75, "of gradients are still held after the step"),
    # right for n = 2 (one shard summed a step), t = 3 a step for n = 4: its two cases' values, (2/4) / 4 off
    "q21_step_per_shard": (answer("q21_step_per_shard"), 0.875, "with the step count t = 3"),
    # right where the shards are even (the first two cases); a shape error on the uneven ones: (2/4 * 3 + 1) / 4
    "q21_floor_shards": (answer("q21_floor_shards"), 0.625, "The size of tensor a (7487) must match"),
    # q19's ring as it is, rank r stepping shard r + 1: the parameters come out right, the state holds another
    # shard's moments in every case (20/20 before issue 54): (1 + 0 + 1 + 1) / 4
    "q21_shard_next": (answer("q21_shard_next"), 0.75,
                       "q19's ring as it is: its reduce-scatter leaves rank r with chunk r + 1 whole, and this rank "
                       "(position 0 of the data-parallel group) steps shard 1, not shard 0"),
    # torch.chunk's pieces: the contract's shards where N % n == 0; on the 29,949 parameters the state of ranks 1 to 3
    # holds other elements (20/20 before issue 54): (1 + 3/4 + 1 + 1) / 4
    "q21_torch_chunk": (answer("q21_torch_chunk"), 0.9375,
                        "the shards were cut with torch.chunk: this rank's AdamW state holds the moments of elements "
                        "7,488 to 14,975"),
    # plain AdamW with the whole moments in a module global, shard-sized copies in `state`, the gradient all-reduced
    # on the ring (a reduce-scatter's and an all-gather's messages): the rank's live tensors show the moments (issue 54)
    # torch's defaults written in: right but for the case that passes other settings, whose values are named by the
    # settings the step used: (3/4 + 1 + 1 + 1) / 4
    "q21_defaults_written_in": (answer("q21_defaults_written_in"), 0.9375,
                                "AdamW's settings were not taken from the arguments: after steps 0 and 1 this "
                                "rank's parameters are one process's AdamW with betas=(0.9, 0.999), eps=1e-08, "
                                "weight_decay=0.01 (torch's defaults), where this case passed betas (0.8, 0.95), "
                                "eps 1e-06, weight_decay 0.1"),
    "q21_moments_global": (answer("q21_moments_global"), 0.75,
                           "B of tensors beyond its shard's state after the step, as much as AdamW's two moments"),
}
# Wrong answers made here (no cohort student has them): name -> (edits of the reference, fraction, what the feedback
# must say). q19's reduce-scatter as it is, the rank stepping shard r with its chunk r, which holds only its own
# replica's gradient (the hint's warning): the values wrong in every case, said once; the state is one shard's
EDITED = {
    "q19's reduce-scatter": ([("""        received = torch.empty_like(grads[(me - s - 2) % n])
        exchange(grads[(me - s - 1) % n], received)
        grads[(me - s - 2) % n] += received""", """        received = torch.empty_like(grads[(me - s - 1) % n])
        exchange(grads[(me - s) % n], received)
        grads[(me - s - 1) % n] += received""")], 0.75,
        "this rank (position 0 of the data-parallel group of 2) ended holding chunk 1 summed over all 2 replicas, "
        "but it updated shard 0 with its chunk 0, which holds only its own replica's gradient"),
}
# A valid answer written otherwise keeps every point: torch's lerp_ for the first moment; the shards received straight
# into their place in the flat vector, isend and irecv in place of batch_isend_irecv
VALID = {
    # torch's own first-moment update: the last bit differs from mul_/add_'s, within the tolerance the contract states
    "lerp": [("""    state["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)""", """    state["exp_avg"].lerp_(g, 1 - b1)""")],
    "in place": [("""        ops = [dist.P2POp(dist.isend, send, group=dp.group, group_peer=right),
               dist.P2POp(dist.irecv, recv, group=dp.group, group_peer=left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()""", """        works = [dist.isend(send, group=dp.group, group_dst=right), dist.irecv(recv, group=dp.group, group_src=left)]
        for work in works:
            work.wait()"""),
                 ("""        received = torch.empty_like(shards[(me - s - 1) % n])
        exchange(shards[(me - s) % n], received)
        shards[(me - s - 1) % n].copy_(received)""", """        exchange(shards[(me - s) % n], shards[(me - s - 1) % n])""")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q21"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()
             if name != "q21_floor_shards"}
    for name, edits in VALID.items():
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    for name, (edits, _, _) in EDITED.items():
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    texts["q21_floor_shards"] = MISTAKES["q21_floor_shards"][0]      # last: its uneven cases stop the launch's q21
    graded = grade_answers("q21", texts, reference, tmp_path)
    for name, (_, fraction, says) in {**MISTAKES, **EDITED}.items():
        got, lines = graded[name]
        assert got == pytest.approx(fraction, abs=1e-4), (name, lines)
        assert says in " ".join("\n".join(lines).split()), (name, lines)
    # the two wrong first steps are told apart, each once for its four cases, none with the generic checklist
    for name in ("q21_l2_decay", "q19's reduce-scatter"):
        text = " ".join("\n".join(graded[name][1]).split())
        assert "check that shard i holds" not in text and text.count("[q21]") == 1, (name, graded[name][1])
    for name in VALID:
        assert graded[name][0] == 1.0, (name, graded[name][1])

"""q24: attention over a sequence split across ranks (ring attention, contiguous and zigzag; Ulysses beside it).

Fast: the formulas (bytes per rank, the work each layout gives each rank, the padding, the positions each rank holds),
the shards put back together, the judge's reading of a late receive and of a Ulysses that does not refuse, the
prediction's verdicts and the opening figure. Multi-process: the reference passes the visible check with the bytes of
the formulas and the layouts' balance; every realistic mistake (the cohort's and more), graded through the hidden tests
in one launch, gets its points and the message that names it, and answers written otherwise keep every point.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grader.cohort.answers import answer

pytestmark = pytest.mark.q24


def test_the_formulas_bytes_work_and_padding():
    from lab_src.topics.long_sequences.records import (
        balance,
        padded,
        positions,
        prediction_q24_wanted,
        ring_backward_bytes,
        ring_forward_bytes,
        tiles,
        ulysses_bytes,
    )
    # the busiest rank over the mean: 2N/(N + 1) contiguous (1.33, 1.60, 1.78 at N = 2, 4, 8), 1.00 zigzag
    assert [round(balance(n, "contiguous", True), 2) for n in (2, 4, 8)] == [1.33, 1.6, 1.78]
    assert all(balance(n, "zigzag", True) == 1.0 for n in (2, 3, 4, 8))
    assert all(balance(n, layout, False) == 1.0 for n in (2, 3) for layout in ("contiguous", "zigzag"))
    assert [tiles(r, 4, "contiguous", True) for r in range(4)] == [1, 2, 3, 4]
    assert [tiles(r, 4, "zigzag", True) for r in range(4)] == [10] * 4
    # the padding: to a multiple of N (contiguous) or 2N (zigzag), at the end
    assert (padded(29, 4, "zigzag"), padded(29, 4, "contiguous"), padded(32, 4, "zigzag")) == (32, 32, 32)
    assert padded(25, 3, "zigzag") == 30 and padded(25, 3, "contiguous") == 27
    assert positions(1, 4, 4, "zigzag") == [2, 3, 12, 13]
    assert sorted(p for r in range(3) for p in positions(r, 3, 4, "zigzag")) == list(range(12))
    # bytes: ring 2(N - 1) shards forward, (4N - 2) backward; Ulysses 4 shards' (P - 1)/P each way
    run = {"fn": "ring", "layout": "zigzag", "seq": 29, "heads": 4, "dim": 8}
    shard = 32 // 4 * 4 * 8 * 8
    assert ring_forward_bytes(run, 4, 8) == 6 * shard and ring_backward_bytes(run, 4, 8) == 14 * shard
    assert ulysses_bytes({**run, "fn": "ulysses"}, 4, 8) == 4 * (32 // 4 * 4 * 8 * 8) * 3 / 4
    # the prediction: at N = 8 the ring sends N/2 = 4 times Ulysses' bytes
    want = prediction_q24_wanted()
    assert want == {"ring": 58_720_256, "ulysses": 14_680_064, "contiguous": 16 / 9, "zigzag": 1.0}
    assert want["ring"] / want["ulysses"] == 4


def test_shards_of_each_layout_put_back_together_and_one_process_matches_the_reference_loop():
    from lab_src.topics.long_sequences.attention import pad, shard, single, tensors, unshard
    run = {"fn": "ring", "layout": "zigzag", "causal": True, "seq": 13, "heads": 2, "dim": 4}
    q, k, v, dout = tensors(run, seed=5, index=0, batch=1, dtype="float64")
    for layout in ("contiguous", "zigzag"):
        x = pad(q, 3, layout)
        assert unshard({r: shard(x, r, 3, layout) for r in range(3)}, 3, layout, x).equal(x)
        assert unshard({0: shard(x, 0, 3, layout)}, 3, layout, x) is None
    out, dq, dk, dv = single(q, k, v, dout, True)
    # the same attention by hand, float64
    s = (q @ k.transpose(-2, -1)) / 2.0
    s = s.masked_fill(torch.ones(13, 13, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(out, s.softmax(-1) @ v, atol=1e-12)


def _phase(recvs, matmuls):
    return {"sends": [], "recvs": recvs, "collectives": [], "matmuls": matmuls, "span": [0, 1]}


def test_a_receive_posted_after_computing_is_named_and_one_posted_before_is_not():
    from lab_src.topics.long_sequences.judge_attention import late_receive
    # step 0: receive posted at 0.1, computed at 0.2; arrived 0.5; step 1 posted at 0.55, computed at 0.6
    ahead = _phase([[3, 64, 0.1, 0.5], [3, 64, 0.55, 0.9]], [[0.2, 0.3, 10], [0.6, 0.7, 10], [0.95, 1.0, 10]])
    assert late_receive(ahead) is None
    # computed on its own block (0.05) before posting the first receive (0.1)
    late = _phase([[3, 64, 0.1, 0.5], [3, 64, 0.7, 0.9]], [[0.05, 0.08, 10], [0.6, 0.65, 10], [0.95, 1.0, 10]])
    assert late_receive(late) == 0
    # a step with nothing to compute (a skipped block) is no late receive
    skipped = _phase([[3, 64, 0.1, 0.5], [3, 64, 0.55, 0.9]], [[0.2, 0.3, 10], [0.95, 1.0, 10]])
    assert late_receive(skipped) is None


def test_a_ulysses_that_does_not_refuse_or_does_not_name_both_numbers_is_told():
    from lab_src.topics.long_sequences.judge_attention import ulysses_refusal
    run = {"fn": "ulysses", "causal": True, "seq": 24, "heads": 2, "dim": 8}
    right = {"raised": {"type": "ValueError", "message": "2 heads cannot be dealt out to P = 4 ranks", "line": ""}}
    assert ulysses_refusal({r: right for r in range(4)}, run, 4) == []
    silent = ulysses_refusal({r: {"out": None} for r in range(4)}, run, 4)
    assert "must raise ValueError" in silent[0].message
    vague = {"raised": {"type": "ValueError", "message": "too many ranks", "line": ""}}
    assert "names P = 4 and the 2 heads" in ulysses_refusal({r: vague for r in range(4)}, run, 4)[0].message


def test_the_prediction_is_read_and_the_opening_figure_draws_both_layouts(tmp_path, reference):
    from grader.hidden.common import Context
    from grader.hidden.q24_ring_attention import prediction_items
    from lab_src.checks.q24_ring_attention import prediction
    from lab_src.topics.long_sequences.figure_attention import computed, tiles_figure
    path = tmp_path / "q24.py"
    path.write_text(answer("q24_prediction_whole_shards"))
    text = " ".join(prediction(str(path)).split())
    assert "ring 58,720,256 right" in text and "ulysses 16,777,216 wrong: it is 14,680,064" in text
    assert "contiguous 1.875 wrong" in text and "zigzag 1 right" in text
    items = prediction_items(Context(student={"q24": str(path)}, reference=reference))
    assert [i.passed for i in items] == [True, False, False, True]
    said = " ".join(p.message for i in items for p in i.problems)
    assert "four whole shards" in said and "counted per visible score" in said
    fig = tiles_figure(4)
    assert len(fig.axes) == 2
    # zigzag: 4 tiles of its own block and 2 of every other on every rank; contiguous: r + 1 blocks
    assert [sum(k != "skipped" for s in range(4) for k in computed(r, (r - s) % 4, 4, "zigzag")) for r in range(4)] \
        == [10] * 4
    assert [sum(k != "skipped" for s in range(4) for k in computed(r, (r - s) % 4, 4, "contiguous"))
            for r in range(4)] == [1, 2, 3, 4]


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q24")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q24: all checks passed" in out, out
    # N = 4, S = 32, 4 heads of 8, float64: a shard is 8 x 4 x 8 x 8 = 2,048 B; forward 6 shards, backward 14
    assert "ring, contiguous, causal, S = 32, 4 heads 12,288 12,288 28,672 28,672 1 2 3 4 1.60 1.60 right" in out
    assert "ring, zigzag, causal, S = 32, 4 heads 12,288 12,288 28,672 28,672 2.5 2.5 2.5 2.5 1.00 1.00 right" in out
    assert "ring, zigzag, causal, S = 29, 4 heads 12,288 12,288 28,672 28,672 2.5 2.5 2.5 2.5 1.00 1.00 right" in out
    # Ulysses: four all-to-alls of a 2,048 B shard, 3/4 of each sent; and the refusal with 2 heads on 4 ranks
    assert "Ulysses, causal, S = 32, 4 heads 6,144 6,144 6,144 6,144" in out
    assert "must raise ValueError naming P = 4 and the 2 heads: right" in out
    # N = 3, S = 25 padded to 30 (zigzag) and 27 (contiguous), 3 heads
    assert "ring, zigzag, causal, S = 25, 3 heads 7,680 7,680 19,200 19,200 2 2 2 1.00 1.00 right" in out
    assert "ring, contiguous, causal, S = 25, 3 heads 6,912 6,912 17,280 17,280 1 2 3 1.50 1.50 right" in out
    from lab_src.checks.q24_ring_attention import blocks_figure
    fig = blocks_figure(report)
    assert fig is not None and len(fig.axes) == 2


# name: (the answer, its fraction of the points, what its feedback must say). Parts, a quarter each: values and
# messages (18 runs: 12 of the ring, 6 of Ulysses, 2 of which must refuse), work (the 12 ring runs), prediction (4)
MISTAKES = {
    "reference": (None, 1.0, "52 of 52 hidden checks passed"),
    # every ring run's values wrong (12 of 18); the rest right: (6/18 + 1 + 1 + 1) / 4
    "q24_no_rescale": (answer("q24_no_rescale"), 0.8333, "merged without rescaling"),
    # the 9 causal ring runs: values NaN and work too much; the non-causal ones right: (9/18 + 1 + 3/12 + 1) / 4
    "q24_nan_masked": (answer("q24_nan_masked"), 0.6875, "exp(-inf - (-inf)) = NaN"),
    # the 5 causal zigzag runs: values wrong, and their work (blocks with no visible key, or visible ones skipped)
    "q24_zigzag_as_contiguous": (answer("q24_zigzag_as_contiguous"), 0.8264, "as if rank r held chunk r alone"),
    # the 8 ring runs at N = 3 and 4: messages to the wrong neighbour; values wrong in the 6 causal ones (without a
    # mask it does not matter which way the blocks come; at N = 2 both ways are the same neighbour)
    "q24_wrong_neighbour": (answer("q24_wrong_neighbour"), 0.8056, "sends to the next rank"),
    # every ring run: dk, dv wrong and the backward's bytes short: (6/18 + 6/18 + 1 + 1) / 4
    "q24_no_grad_home": (answer("q24_no_grad_home"), 0.6667, "no gradient travelled"),
    # the 4 Ulysses runs that must compute: values wrong, three all-to-alls: (14/18 + 14/18 + 1 + 1) / 4
    "q24_ulysses_no_reverse": (answer("q24_ulysses_no_reverse"), 0.8889,
                               "its H/P heads over the whole sequence, reshaped to its shard's shape"),
    "q24_prediction_whole_shards": (answer("q24_prediction_whole_shards"), 0.875, "four whole shards"),
    "q24_late_receive": (None, 0.8333, "posted after the rank had computed"),
    "q24_ines": (answer("q24_ines"), 0.4931, "dK and dV of a block must go round with it and come home"),
}
# edits of the reference: a mistake the cohort does not hand in, and answers written otherwise, valid
EDITS = {
    # the next block received only once the rank has computed on the one it holds (the messages of the 12 ring runs)
    "q24_late_receive": [
        ("""# the next block's receive, posted before computing on this one
                nxt = torch.empty_like(kv)
                reqs = exchange([kv], [nxt], group)""", """# the next block: below, after computing on this one
                pass"""),
        ("""            if step < n - 1:
                for r in reqs:
                    r.wait()
                kv = nxt
        ctx.save_for_backward""", """            if step < n - 1:                       # the next block, only now
                nxt = torch.empty_like(kv)
                for r in exchange([kv], [nxt], group):
                    r.wait()
                kv = nxt
        ctx.save_for_backward"""),
    ],
    # isend and irecv instead of batch_isend_irecv
    "isend_irecv": [
        ("""    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % n) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=(rank - 1) % n) for t in recvs]
    return dist.batch_isend_irecv(ops) if ops else []""",
         """    reqs = [dist.isend(t, group=group, group_dst=(rank + 1) % n) for t in sends]
    return reqs + [dist.irecv(t, group=group, group_src=(rank - 1) % n) for t in recvs]"""),
    ],
    # K and V (and dK and dV) as two messages of a step, not one stacked: the bytes are the same
    "k_and_v_apart": [
        ("""    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % n) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=(rank - 1) % n) for t in recvs]""",
         """    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % n) for pair in sends for t in pair]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=(rank - 1) % n) for pair in recvs for t in pair]"""),
    ],
}
VALID = ("isend_irecv", "k_and_v_apart")


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q24"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in EDITS.items():
        texts[name] = right
        for old, new in edits:
            assert right.count(old) == 1, (name, old)
            texts[name] = texts[name].replace(old, new)
    graded = grade_answers("q24", texts, reference, tmp_path)
    wrong = []
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        if got != pytest.approx(fraction, abs=1e-4) or says not in " ".join("\n".join(lines).split()):
            wrong.append((name, got, lines))
    wrong += [(name, graded[name][0], graded[name][1]) for name in VALID if graded[name][0] != 1.0]
    assert not wrong, wrong


# the ring's messages for the record, and beside them K and V gathered whole by torch's all_gather through the
# recorder's saved original (attention could then be computed whole; the record still shows a ring's messages)
GATHERED_AROUND = [
    ("""        kv = torch.stack([k, v]).contiguous()
        for step in range(n):""",
     """        kv = torch.stack([k, v]).contiguous()
        from lab_src.comm.collectives import _ORIGINAL
        whole = [torch.empty_like(kv) for _ in range(n)]
        _ORIGINAL.get("all_gather", dist.all_gather)(whole, kv, group=group)      # unrecorded
        for step in range(n):"""),
]


def test_k_and_v_sent_around_the_recorder_are_counted_on_the_wire(reference, tmp_path, no_leftovers):
    """The kind is `wire`: the bytes leaving each rank over a case are counted by the kernel and read from outside the
    rank (judge/wire.py). Values, work and the recorded messages are a ring's, and the prediction is right; the
    gathered bytes no recorded message carried fail the messages of every run of the case where they are more than
    the count's slack of 16 KiB a rank, N = 4 with its long run (the count is the case's, not a run's):
    (1 + 12/18 + 1 + 1) / 4. The reference, whose Ulysses runs' all-to-alls are counted as gloo sends them, keeps
    every point in the same launch."""
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q24"]).read_text()
    text = right
    for old, new in GATHERED_AROUND:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    graded = grade_answers("q24", {"right": right, "gathered_around": text}, reference, tmp_path)
    assert graded["right"][0] == 1.0, graded["right"]
    got, lines = graded["gathered_around"]
    said = " ".join("\n".join(lines).split())
    assert got == pytest.approx(0.9167, abs=1e-4), said
    assert "that no message of its record carried" in said and "the kernel counted" in said and "(N = 4)" in said, said

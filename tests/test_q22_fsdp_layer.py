"""q22: FSDP inside a pipeline stage, layer by layer (ZeRO-3).

Fast: the opening figure; the prediction's figures. Multi-process: the reference passes the visible check (the
shards alone at rest, one layer gathered at the peak, 2m gathers per block, gradients as one process's); every
cohort mistake and two valid answers written otherwise, graded through the hidden tests in one launch, get their
points and their messages.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grader.cohort.answers import answer

pytestmark = pytest.mark.q22


def test_the_opening_figure_and_the_predictions_figures():
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.model import build_piece
    from lab_src.topics.sharding.figure import fsdp_figure
    from lab_src.topics.sharding.records import BLOCK_PARAMS, fsdp_wanted
    assert sum(p.numel() for p in build_piece(LabConfig(), "blocks.0", "cpu").parameters()) == BLOCK_PARAMS
    assert fsdp_wanted() == {"rest": 50_816, "peak": 101_632, "gathers": 16}
    assert fsdp_figure(3, 2).axes


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q22")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q22: all checks passed" in out, out
    # rank 0: the embedding whole, two blocks' halves; one block gathered at a time; 8 gathers, 4 scatters a block
    assert "0 0 61,056 10,240 50,816 50,816 50,816 8 4 as one" in out
    assert "(graded: they match)" in out
    assert report.timeline() is not None


# name: (the answer, its fraction of the points, what its feedback must say); parts: values, memory, counts (5
# cases each: three of SGD steps, two digits trainings), prediction (3 figures), a quarter each
MISTAKES = {
    "reference": (None, 1.0, "18 of 18 hidden checks passed"),
    # n x the gradients: the SGD cases fail; AdamW divides the scale away, so of the two trainings only the 2 x 2
    # grid's curve leaves one process's (at step 13, by 1.3e-05): (1/5 + 1 + 1 + 1) / 4
    "q22_summed": (answer("q22_summed"), 0.8, "the reduce-scattered sum was not divided by dp.size"),
    "q22_kept_weights": (answer("q22_kept_weights"), 0.75, "still reach the blocks' whole parameters"),
    # every layer's copy saved for the backward: the counts fail everywhere, the peak wherever a stage holds more
    # than two blocks' copies by the end of its forwards (not in the 4-rank training of 2 blocks): (1 + 1/5 + 0 + 1) / 4
    "q22_saved_full": (answer("q22_saved_full"), 0.55, "saving them for the backward keeps every layer gathered"),
    # weights gathered once and reused: stale after the first SGD step, left after the step, too few gathers
    "q22_cached": (answer("q22_cached"), 0.25, "gathered weights were still held after the step"),
}
# Valid answers written otherwise keep every point: the weights cut with torch.split; the block kept as a
# registered submodule whose own parameters are emptied
VALID = {
    "split": [("""        out, offset = {}, 0
        for name, shape, count in self.shapes:
            out[name] = full[offset:offset + count].view(shape)
            offset += count
        return out""", """        pieces = torch.split(full, [count for _, _, count in self.shapes])
        return {name: piece.view(shape) for (name, shape, _), piece in zip(self.shapes, pieces)}""")],
    "registered": [("""        self._block = [layer]        # in a list, so that its emptied parameters are not this module's

    @property
    def block(self):
        return self._block[0]
""", """        self.block = layer           # a submodule whose own parameters are empty
""")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q22"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in VALID.items():
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    graded = grade_answers("q22", texts, reference, tmp_path)
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        assert got == pytest.approx(fraction, abs=1e-4), (name, lines)
        assert says in " ".join("\n".join(lines).split()), (name, lines)
    for name in VALID:
        assert graded[name][0] == 1.0, (name, graded[name][1])

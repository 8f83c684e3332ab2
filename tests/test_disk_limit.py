"""A sandbox's writable space has a total-size limit (lab_src/harness/sandbox.py, `Limits.disk_bytes`, watched by
the runner): an answer that writes 1.5 GB in files each under the per-file limit loses its own cases, is told
how much it wrote and what the limit is, and leaves nothing on disk."""
from __future__ import annotations

import pytest

from grader.cohort.answers import answer
from hidden_grading import grade_answer
from lab_src.harness import sandbox

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot start a sandbox here")


def test_an_answer_that_fills_the_disk_is_named_and_leaves_nothing(reference, tmp_path, no_leftovers):
    verdict = grade_answer("q05", answer("q05_fill_disk"), reference, tmp_path)
    text = "\n".join(verdict["messages"])
    assert verdict["fraction"] < 1.0
    assert "the limit is 1.0 GB" in text and "the answer to q05 wrote" in text, text
    assert sandbox.disk_usage(tmp_path) < 64 << 20, "the answer's files were deleted"

"""Evidence from outside the answer (issue 26): a pipeline whose last stage rebuilds the earlier stages from
the seed fails the case where the lab changes stage 0's weights after building it (pipeline/perturb.py), and
a step that rewrites its own events into another order after running contradicts what the grader read live
from its journal (judge/record.py). Each answer is graded through its hidden tests, in the sandbox."""
from __future__ import annotations

import pytest

from grader.cohort.answers import answer
from hidden_grading import grade_answer
from lab_src.harness import sandbox

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot start a sandbox here")


def test_a_last_stage_rebuilt_from_the_seed_does_not_follow_stage_0(reference, tmp_path):
    verdict = grade_answer("q08", answer("q08_rebuilt_from_seed"), reference, tmp_path)
    text = "\n".join(verdict["messages"])
    assert verdict["passed"] == 1, text     # only the 1-stage case, where there is nothing to rebuild
    assert "outputs do not depend on what stage 0 sent" in text, text


def test_an_afab_step_that_rewrites_its_events_as_1f1b_is_a_forged_record(reference, tmp_path):
    verdict = grade_answer("q12", answer("q12_forged_events"), reference, tmp_path)
    text = "\n".join(verdict["messages"])
    assert "recorded order differs from what the run did" in text, text
    # the cases where AFAB and 1F1B run the same order (one stage, one micro-batch) pass; no case keeps
    # the honest AFAB step's share: a forged record is a mistake, not another schedule
    assert verdict["fraction"] < 0.58, verdict

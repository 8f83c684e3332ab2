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


def lines(text: str) -> list:
    """Journal starts as the grader records them ('RF0 F0 SF0 ...'), each [kind, micro-batch, chunk, when]."""
    kinds = {"F": "forward", "B": "backward", "RF": "recv_forward", "SF": "send_forward",
             "RB": "recv_backward", "SB": "send_backward"}
    return [[kinds[w.rstrip("0123456789")], int(w[len(w.rstrip("0123456789")):]), 0, float(t)]
            for t, w in enumerate(text.split())]


def test_compute_lines_journalled_out_of_step_with_the_messages_are_a_forged_record():
    from lab_src.judge.record import out_of_step
    # rank 1 of 3, 3 micro-batches: AFAB's messages with 1F1B's compute lines written in (B0 before RB0)
    forged = lines("RF0 F0 SF0 B0 RF1 F1 SF1 B1 RF2 F2 SF2 RB0 SB0 RB1 SB1 B2 RB2 SB2")
    problems = out_of_step(forged, 1)
    assert len(problems) == 1 and "B0 before recv_backward(mb=0) began" in problems[0].message
    # honest 1F1B, receives posted ahead of the compute that needs them: nothing to say
    honest = lines("RF0 F0 SF0 RF1 RB0 F1 SF1 B0 SB0 RF2 RB1 F2 SF2 B1 SB1 RB2 B2 SB2")
    assert out_of_step(honest, 1) == []
    # a step that labels two sends with one micro-batch is told so elsewhere, not here
    assert out_of_step(lines("RF0 F0 SF0 RF1 F1 SF0"), 1) == []

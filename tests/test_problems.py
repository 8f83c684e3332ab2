"""Problems as data: what a problem is (its kind) decides credit and order, never its words; judges leave
the exercise and the case to the caller, who stamps them once. No processes, no torch in the judges."""
from __future__ import annotations

import pytest

from lab_src.judge.failures import from_error, rank_problems, sanitize
from lab_src.judge.problems import Kind, Problem, dedupe, stamped
from lab_src.judge.realness import WRONG_SCHEDULE, check_messages
from lab_src.judge.summary import render
from lab_src.pipeline.trace import Event


def test_fields_after_the_message_are_keywords():
    with pytest.raises(TypeError):
        Problem("q08", "the message")            # the old order: exercise first
    p = Problem("the message", rank=2)
    assert (p.exercise, p.case, p.kind) == ("", "", Kind.MISTAKE)


def test_stamping_fills_only_what_a_problem_leaves_empty():
    found = [Problem("mine", rank=1), Problem("an earlier exercise's", exercise="q05"),
             Problem("a step of the case", case="4 stages, step 3")]
    mine, earlier, step = stamped(found, "q08", "4 stages")
    assert str(mine) == "[q08] rank 1: mine  (4 stages)"
    assert str(earlier) == "[q05]: an earlier exercise's  (4 stages)"
    assert str(step) == "[q08]: a step of the case  (4 stages, step 3)"
    assert stamped([], "q08", "x") == []


def test_dedupe_drops_a_problem_said_in_the_same_words_and_keeps_the_order():
    first, again, other = Problem("late", rank=1), Problem("late", rank=1), Problem("late", rank=2)
    kept = dedupe([first, other, again, Problem("late", rank=1, kind=Kind.WAIT)])
    assert kept == [first, other] and kept[0] is first       # the same words: the first one kept
    assert dedupe([]) == []


def test_the_kind_is_set_where_a_problem_is_made():
    timed_out = {"type": "RuntimeError", "message": "Timed out", "pending": ["0", "recv_forward", 0, 0], "where": []}
    raised = {"type": "RuntimeError", "message": "boom", "pending": ["0", "recv_forward", 0, 0], "where": []}
    assert from_error(1, timed_out).kind is Kind.WAIT
    assert from_error(1, raised).kind is Kind.MISTAKE
    # a rank that raised, and its neighbour left waiting for it: the cause, then the consequence (a wait)
    cause, consequence = rank_problems({1: raised, 2: {**timed_out, "pending": ["0", "recv_forward", 0, 1]}})
    assert cause.kind is Kind.MISTAKE and consequence.consequence and consequence.kind is Kind.WAIT


def test_a_communication_case_is_not_asked_for_operation_counts():
    sent = [Event(rank=0, kind="send_forward", microbatch=0, peer=1, t_start=0.0, t_end=1.0, shape=(2, 3), bytes=0),
            Event(rank=1, kind="recv_forward", microbatch=0, peer=0, t_start=0.0, t_end=1.0, shape=(2, 3), bytes=0)]
    counted = check_messages(sent, 2, 2, (2, 3))
    assert counted and all(" operations; " in p.message for p in counted)       # micro-batch 1 never sent
    assert check_messages(sent, 2, 2, (2, 3), counts=False) == []


def test_credit_and_order_follow_the_kind_not_the_words():
    from grader.hidden.common import Item, causes_first
    other = Problem("your step runs All-Forward-All-Backward", exercise="q12", kind=Kind.WRONG_SCHEDULE)
    worded = Problem(f"{WRONG_SCHEDULE}: but made as a plain mistake", exercise="q12")
    assert Item("pipelines", "x", [other], credit=0.5).score == 0.5
    assert Item("pipelines", "x", [worded], credit=0.5).score == 0.0
    assert Item("pipelines", "x", [other, worded], credit=0.5).score == 0.0

    wait = Problem("rank 2 gave up", exercise="q11", kind=Kind.WAIT)
    cause = Problem("it waited in vain, says its words", exercise="q11")
    assert causes_first(Item("messages", "x", [wait, cause])).problems == [cause, wait]


def test_the_whole_batch_misconception_is_told_first_by_its_kind():
    from lab_src.topics.dp_pp.judge import shard_problems
    from lab_src.topics.dp_pp.records import Layout
    from lab_src.pipeline.config import LabConfig
    cfg = LabConfig(num_stages=2, num_layers=4, num_microbatches=2, global_batch_size=8, dp_size=2)
    # rank 0 (replica 0) reads shard 0 in micro-batches of the wrong size, rank 2 (replica 1) the whole batch
    obs = {0: {"shards": [[0, 0, 4]]}, 2: {"shards": [[None, 0, 2]]}}
    first, *rest = shard_problems(obs, Layout(2, 2), cfg)
    assert first.kind is Kind.WHOLE_BATCH and first.rank == 2
    assert all(p.kind is not Kind.WHOLE_BATCH for p in rest)
    assert render(stamped([first], "q14", "2 x 2"))[0].startswith("[q14] rank 2: this rank of replica 1 made its "
                                                                  "dataloader without dp_rank")


def test_a_missing_dp_rank_is_one_problem_that_says_what_the_rank_reads():
    """Issue 27, items 11 and 13: the message said the rank "reads the whole global batch" and that "its
    micro-batches are replica 0's shard" in one breath, and the shard every replica shared was a second
    problem. Now: what the rank reads and why, the fix, and the shared shard as what it caused."""
    from lab_src.topics.dp_pp.judge import shard_problems
    from lab_src.topics.dp_pp.records import Layout
    from lab_src.pipeline.config import LabConfig
    cfg = LabConfig(num_stages=2, num_layers=4, num_microbatches=2, global_batch_size=8, dp_size=2)
    obs = {0: {"shards": [[None, 0, 2]]}, 2: {"shards": [[None, 0, 2]]}}
    problems = shard_problems(obs, Layout(2, 2), cfg)
    text = "\n".join(render(stamped(problems, "q14", "2 x 2")))
    assert "whole global batch" not in text
    assert "made its dataloader without dp_rank, so it reads the global batch from its first sample: the 2 " \
           "micro-batches of 2 samples it takes are replica 0's shard" in " ".join(text.split())
    assert "dp_rank=dp_rank" in text
    causes = [p for p in problems if not p.consequence]
    assert {p.kind for p in causes} == {Kind.WHOLE_BATCH}
    assert [p for p in problems if p.consequence and "all read shard 0" in p.message]


def test_gloo_internals_never_reach_the_student():
    raw = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
           "[127.0.0.1]:4242 GLHF! \U0001F3D6\ufe0f")
    said = sanitize(raw)
    assert said == "Connection closed by peer [127.0.0.1]:4242", said

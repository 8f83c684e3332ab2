"""Schedules as data (lab_src/pipeline/schedules.py): the operations and their peers, each schedule's
program and rules, and the judges reading the schedule of the case instead of assuming AFAB. The last
tests run a correct One-Forward-One-Backward step in real torchrun processes."""
from __future__ import annotations

import pytest

from grader.cohort.answers import answer
from lab_src.pipeline.schedules import SCHEDULES, Interleaved1F1B, Op, in_flight, matching_schedules, schedule
from lab_src.pipeline.matching import match
from lab_src.views.ideal import ideal_events

# A correct 1F1B step (picotron's order), written as a student would, in the q08 slot.
ONE_F_ONE_B = answer("q08_one_f_one_b")


# ---- the operations -------------------------------------------------------------------------------
def test_peers_and_noops_at_the_ends():
    assert Op.SEND_FORWARD.peer(1, 4) == 2 and Op.RECV_BACKWARD.peer(1, 4) == 2
    assert Op.SEND_BACKWARD.peer(1, 4) == 0 and Op.RECV_FORWARD.peer(1, 4) == 0
    assert Op.RECV_FORWARD.is_noop(0, 4) and Op.SEND_BACKWARD.is_noop(0, 4)
    assert Op.SEND_FORWARD.is_noop(3, 4) and Op.RECV_BACKWARD.is_noop(3, 4)
    assert Op.SEND_FORWARD.peer(3, 4) is None and Op.FORWARD.peer(1, 4) is None
    assert Op.SEND_FORWARD.counterpart is Op.RECV_FORWARD and Op.RECV_BACKWARD.phase == "backward"


def test_interleaved_chunks_wrap_around_from_the_last_rank_to_the_first():
    # 2 ranks, 2 chunks: virtual stages 0 (rank 0), 1 (rank 1), 2 (rank 0), 3 (rank 1)
    assert Op.SEND_FORWARD.peer(1, 2, chunk=0, v=2) == 0            # stage 1 -> stage 2 on rank 0
    assert Op.SEND_FORWARD.peer_chunk(1, 2, chunk=0) == 1
    assert Op.RECV_FORWARD.peer(0, 2, chunk=1, v=2) == 1
    assert Op.SEND_FORWARD.is_noop(1, 2, chunk=1, v=2)                 # the last virtual stage
    assert not Op.RECV_FORWARD.is_noop(0, 2, chunk=1, v=2)


# ---- programs and rules ---------------------------------------------------------------------------
CONFIGS = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 2), (4, 4), (4, 6), (4, 8)]


@pytest.mark.parametrize("name", ["afab", "1f1b"])
@pytest.mark.parametrize("p,m", CONFIGS)
def test_each_program_runs_without_deadlock_and_keeps_its_own_rules(name, p, m):
    sched = SCHEDULES[name]
    events = ideal_events(p, m, schedule=name, activation_bytes=64)       # raises on a deadlocked program
    assert match(events).ok
    assert sched.violations(events, p, m) == []
    for r in range(p):
        counts = sched.counts(r, p, m)
        assert counts[Op.FORWARD] == counts[Op.BACKWARD] == m
        assert counts[Op.SEND_FORWARD] == (m if r < p - 1 else 0)
        assert counts[Op.RECV_FORWARD] == (m if r > 0 else 0)


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 8, 2), (2, 4, 4), (4, 8, 4)])
def test_interleaved_program_runs_and_visits_every_chunk(p, m, v):
    sched = Interleaved1F1B(v)
    events = ideal_events(p, m, schedule=sched, activation_bytes=64)
    assert match(events).ok and sched.violations(events, p, m) == []
    for r in range(p):
        fwd = [(e.microbatch, e.chunk) for e in events if e.rank == r and e.kind == "forward"]
        assert sorted(fwd) == [(mb, c) for mb in range(m) for c in range(v)]
    # every rank but the last sends its chunk-0 activations on; the last rank's wrap around to rank 0
    assert any(e.kind == "send_forward" and e.rank == p - 1 and e.peer == 0 for e in events)


def test_1f1b_holds_at_most_p_minus_r_microbatches_and_afab_holds_all():
    p, m = 4, 8
    one = ideal_events(p, m, schedule="1f1b")
    afab = ideal_events(p, m, schedule="afab")
    assert [max(in_flight(one, r)) for r in range(p)] == [4, 3, 2, 1]
    assert [max(in_flight(afab, r)) for r in range(p)] == [8, 8, 8, 8]
    broken = schedule("1f1b").violations(afab, p, m)
    assert [r for r, _, _ in broken] == [0, 1, 2, 3] and "holds at most 4" in broken[0][2]
    assert [r for r, _, _ in schedule("afab").violations(one, p, m)] == [0, 1, 2, 3]
    assert [s.name for s in matching_schedules(one, p, m)] == ["1f1b"]
    assert [s.name for s in matching_schedules(afab, p, m)] == ["afab"]


def test_with_few_microbatches_afab_is_also_a_valid_1f1b():
    # m <= p - r everywhere: 1F1B's warm-up covers every micro-batch, the two orders coincide
    events = ideal_events(4, 1, schedule="afab")
    assert {s.name for s in matching_schedules(events, 4, 1)} == {"afab", "1f1b"}


def test_interleaved_needs_a_multiple_of_p_microbatches():
    with pytest.raises(ValueError, match="multiple"):
        Interleaved1F1B(2).program(0, 4, 6)


# ---- a correct 1F1B step, judged by the schedule of the case --------------------------------------
@pytest.fixture(scope="module")
def one_f_one_b_runs(reference, tmp_path_factory):
    """A correct 1F1B step, run twice in one launch: judged as 1F1B, then as AFAB (q08)."""
    from lab_src.harness.baselines import baselines_for
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    from lab_src.pipeline.config import LabConfig
    tmp = tmp_path_factory.mktemp("1f1b")
    step = tmp / "q08_one_f_one_b.py"
    step.write_text(ONE_F_ONE_B)
    answers = {**reference, "q08": str(step)}
    cfg = LabConfig(num_stages=4, num_layers=8, num_microbatches=6, global_batch_size=12)
    base = baselines_for([cfg], reference)[cfg]
    cases = [Case(kind="pipeline", qid="q08", config=cfg, answers=answers, schedule=s, label=f"judged as {s}")
             for s in ("1f1b", "afab")]
    run = run_cases(cases, tmp / "run")
    return run, base


def test_a_correct_1f1b_step_passes_a_1f1b_case(one_f_one_b_runs):
    from lab_src.judge.compare import compare_run
    from lab_src.judge.realness import check_run
    run, base = one_f_one_b_runs
    out = run.outcomes[0]
    assert out.failure is None and not out.errors(), (out.failure, out.errors())
    assert compare_run(out, base) + check_run(out) == []
    assert [max(in_flight(out.events(), r)) for r in range(4)] == [4, 3, 2, 1]


@pytest.mark.q08
def test_on_q08_a_correct_1f1b_step_is_told_it_is_valid_but_not_afab(one_f_one_b_runs):
    from grader.hidden.common import Item
    from lab_src.judge.compare import compare_run
    from lab_src.judge.realness import WRONG_SCHEDULE, check_run
    from lab_src.registry import exercise
    run, base = one_f_one_b_runs
    out = run.outcomes[1]
    assert compare_run(out, base) == []                    # the numbers match ...
    problems = check_run(out)
    assert len(problems) == 1 and problems[0].message.startswith(WRONG_SCHEDULE), [str(p) for p in problems]
    assert "valid One-Forward-One-Backward schedule" in problems[0].message
    assert "asks for All-Forward-All-Backward" in problems[0].message
    # ... and the exercise keeps what its declaration says such a run is worth
    item = Item("pipelines", "afab", problems, credit=exercise("q08").other_schedule_credit)
    assert item.score == 0.5


@pytest.mark.q08
def test_the_visible_q08_check_says_the_numbers_match_for_a_1f1b_step(reference, in_tmp, capsys):
    from lab_src.answers import answers_dir
    from lab_src.checks import check
    from lab_src.registry import EXERCISES
    folder = answers_dir()
    folder.mkdir()
    for qid in ("q02", "q03", "q04", "q05", "q06", "q07"):
        (folder / EXERCISES[qid].answer_file).write_text(open(reference[qid]).read())
    (folder / EXERCISES["q08"].answer_file).write_text(ONE_F_ONE_B)
    report = check("q08")
    assert not report.ok
    printed = capsys.readouterr()
    out = printed.out + printed.err
    assert "DIFFER" not in out
    assert "match the unsharded baseline" in out and "valid One-Forward-One-Backward schedule" in out

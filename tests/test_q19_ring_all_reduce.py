"""q19: a ring all-reduce from point-to-point messages.

Fast: the judge (topics/data_parallel/judge.py) on records made from the inputs' own sum: what a right ring
records passes, and each realistic mistake's record (other bits on one rank, the whole tensor in a message,
a send to the wrong rank, a collective, a wrong element) gets the message that names it, once; the
opening figure's steps end with every chunk whole on every rank; the prediction is read and judged.
Multi-process: the reference passes the visible check (the seed's four sizes measured), and every cohort
mistake and two valid answers written otherwise, graded through the hidden tests in one launch, get their
points and their messages; the study times a ring and gloo's all-reduce and fits the alpha-beta model.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grader.cohort.answers import answer
from lab_src.harness.case import Case, CaseOutcome
from lab_src.pipeline.config import LabConfig
from lab_src.topics.data_parallel.inputs import expected_sum
from lab_src.topics.data_parallel.judge import chunk_of, judge_run
from lab_src.topics.data_parallel.kind import held
from lab_src.topics.data_parallel.records import SEED_LAYERS, chunk_cap, groups_of, ring_bytes

pytestmark = pytest.mark.q19

CFG = LabConfig(num_stages=4, seed=3)


def ring_record(ring: list[int], r: int, length: int, result: torch.Tensor, n: int) -> dict:
    """What a rank of a right ring records: its result, a chunk to the next rank per step, one from the last."""
    pos = ring.index(r)
    cap = chunk_cap(length, n) * 4
    rec = {"length": length, "dtype": "float32", "seconds": 0.01, "returned": "same", "collectives": [],
           "sends": [[ring[(pos + 1) % n], cap]] * (2 * (n - 1)), "recvs": [[ring[(pos - 1) % n], cap]] * (2 * (n - 1))}
    rec.update(held(result))
    return rec


def outcome(lengths, n: int = 4, columns: int | None = None, change=None) -> CaseOutcome:
    """A ring case whose ranks recorded the inputs' sum (float32, the same bits everywhere), then `change`."""
    stages = n if not columns else n * columns
    case = Case(kind="ring", qid="q19", config=CFG, stages=stages, settings={"lengths": lengths, "columns": columns})
    obs = {}
    for ring in groups_of(stages, columns):
        for r in ring:
            runs = []
            for length in lengths:
                rec = ring_record(ring, r, length, expected_sum(CFG.seed, length, len(ring))[0].float(), len(ring))
                if change is not None:
                    change(r, length, rec)
                runs.append(rec)
            obs[r] = {"group": ring, "position": ring.index(r), "runs": runs}
    return CaseOutcome(case, obs)


def said(found: dict) -> str:
    return " ".join(str(p) for problems in found.values() for p in problems)


def test_a_right_ring_passes_on_every_length_and_on_a_grids_columns():
    assert not any(judge_run(outcome([1, 3, 4, 1000, 70_000])).values())
    assert not any(judge_run(outcome([5, 4099], n=2, columns=2)).values())


def test_other_bits_on_one_rank_are_named_as_adding_in_another_order():
    def nudge(r, length, rec):
        if r == 2 and length == 1000:
            v = rec["whole"].clone()
            v[7] = torch.nextafter(v[7], torch.tensor(float("inf")))
            rec.update(held(v))
    found = judge_run(outcome([3, 1000], change=nudge))
    assert not found["ring"] and len(found["sums"]) == 1
    assert "not bit for bit what rank 0 holds" in said(found) and "(length 1,000)" in said(found)


def test_a_wrong_element_is_named_with_its_chunk_and_a_mean_is_named_as_the_mean():
    def wrong(r, length, rec):
        v = rec["whole"].clone()
        v[length - 1] += 1.0
        rec.update(held(v))
    text = said(judge_run(outcome([1000], change=wrong)))
    assert "element 999 of 1,000" in text and "wrong in chunk 3 of 4" in text and "also on ranks 1, 2, 3" in text

    def mean(r, length, rec):
        rec.update(held(rec["whole"] / 4))
    assert "it is the mean, the sum divided by n = 4" in said(judge_run(outcome([1000], change=mean)))


def test_a_whole_tensor_message_a_wrong_neighbour_and_a_collective_are_each_named_once():
    def whole(r, length, rec):
        rec["sends"] = [[rec["sends"][0][0], length * 4]] * 3
    found = judge_run(outcome([8, 1000], change=whole))
    assert len(found["ring"]) == 1 and "a message of 32 bytes (1x the tensor)" in said(found)
    assert "(length 8; also on ranks 1, 2, 3; also at length 1,000)" in said(found)

    def global_next(r, length, rec):      # the column [1, 3]: rank 1 sends to global rank 2
        if r == 1:
            rec["sends"] = [[2, 12]] * 2
    text = said(judge_run(outcome([7], n=2, columns=2, change=global_next)))
    assert "sent to rank 2 (outside its ring)" in text and "global rank +- 1 is another data-parallel column" in text

    def collective(r, length, rec):
        rec["collectives"], rec["sends"], rec["recvs"] = ["all_reduce"], [], []
    text = said(judge_run(outcome([8], change=collective)))
    assert "ring_all_reduce called dist.all_reduce" in text


def test_a_ring_of_zeros_is_named_and_every_partial_sum_a_ring_may_carry_is_accepted():
    from lab_src.comm.messages import carried
    from lab_src.topics.data_parallel.inputs import inputs_of
    from lab_src.topics.data_parallel.judge import is_partial_sum
    xs = inputs_of(CFG.seed, 1003, 4)
    parts = [list(torch.tensor_split(x.float(), 4)) for x in xs]
    # a reduce-scatter's partial sums over runs of positions (3, 0 wraps round), a finished chunk of torch.chunk's
    # split, a single rank's own chunk: partial sums; zeros, and a sum over positions that are not a run, are not
    assert is_partial_sum(xs, carried(parts[3][1] + parts[0][1], 1), "float32")
    assert is_partial_sum(xs, carried(torch.chunk(sum(x.float() for x in xs), 4)[3], 1), "float32")
    assert is_partial_sum(xs, carried(parts[2][0], 3), "float32")
    assert not is_partial_sum(xs, carried(torch.zeros_like(parts[0][2]), 1), "float32")
    assert not is_partial_sum(xs, carried(parts[0][2] + parts[2][2], 1), "float32")

    def zeros(r, length, rec):
        rec["carried"] = [[0, -(-length // 4), 0.0, 0.0, 0.0]] * 6
    found = judge_run(outcome([1000], change=zeros))
    assert not found["sums"] and len(found["ring"]) == 1
    assert "the ring carried zeros, not the partial sums a ring must carry: its send 1 of 6" in said(found)


def simulated(length: int, n: int, gather_behind: bool = False) -> CaseOutcome:
    """What the ranks of a ring record, computed here step by step (float32, tensor_split's chunks): the reference's
    ring, or (`gather_behind`) one whose all-gather runs a chunk behind (rank p sends chunk p - s and receives into
    chunk p - s - 1: right sizes, wrong chunk), every message's fingerprint kept as the recorder keeps it."""
    from lab_src.comm.messages import carried
    from lab_src.topics.data_parallel.inputs import tensor_of
    xs = [tensor_of(CFG.seed, length, p, "float32") for p in range(n)]
    chunks = [list(torch.tensor_split(x, n)) for x in xs]
    sent = {p: [] for p in range(n)}
    for s in range(n - 1):                      # reduce-scatter: p sends chunk p - s, adds into chunk p - s - 1
        out = [chunks[p][(p - s) % n].clone() for p in range(n)]
        for p in range(n):
            sent[p].append(carried(out[p], (p + 1) % n))
            chunks[(p + 1) % n][(p - s) % n] += out[p]
    for s in range(n - 1):                      # all-gather
        take = (lambda p: (p - s) % n) if gather_behind else (lambda p: (p + 1 - s) % n)
        out = [chunks[p][take(p)].clone() for p in range(n)]
        for p in range(n):
            sent[p].append(carried(out[p], (p + 1) % n))
            chunks[(p + 1) % n][take(p)].copy_(out[p])
    obs = {}
    for p in range(n):
        rec = ring_record(list(range(n)), p, length, torch.cat(chunks[p]), n)
        rec["carried"] = sent[p]
        obs[p] = {"group": list(range(n)), "position": p, "runs": [rec]}
    case = Case(kind="ring", qid="q19", config=CFG, stages=n, settings={"lengths": [length]})
    return CaseOutcome(case, obs)


def test_an_all_gather_a_chunk_behind_is_named_by_its_phase_step_and_chunk_and_the_sums_are_its_consequence():
    from lab_src.judge.problems import stamped
    from lab_src.judge.summary import CONSEQUENCES, counts, render
    assert not any(judge_run(simulated(1003, 4)).values())           # the reference's messages, simulated
    found = judge_run(simulated(1000, 4, gather_behind=True))
    problems = stamped(found["sums"] + found["ring"], "q19", "n = 4")
    assert counts(problems) == (1, 1), problems
    cause, caused = "\n".join(render(problems)).split(CONSEQUENCES)
    cause = " ".join(cause.split())
    assert cause.startswith("[q19] rank 0: in the all-gather, step 1 of 3, its send to rank 1 carried chunk 0 of 4 "
                            "(elements 0 to 249) holding the input of position 0 alone: the all-gather passes "
                            "finished chunks only"), cause
    assert "also on ranks 1, 2, 3" in cause and "element" in caused and "the sum of the 4 inputs is" in caused


def failed_case(n: int, errors: dict[int, dict], label: str) -> CaseOutcome:
    case = Case(kind="ring", qid="q19", config=CFG, stages=n, settings={"lengths": [7]}, label=label)
    return CaseOutcome(case, {r: {"error": e} for r, e in errors.items()})


def test_a_ring_of_blocking_sends_is_one_cause_however_many_cases_it_deadlocked_and_the_rest_follow_from_it():
    from lab_src.judge.summary import CONSEQUENCES, counts, render
    from lab_src.topics.data_parallel.judge import ring_errors

    def stopped(r, n):
        return {"type": "StoppedWaiting", "message": "stopped", "pending": [f"send {r}", "send_forward", None,
                                                                            (r + 1) % n]}
    problems = []
    for n, label in ((2, "n = 2"), (3, "n = 3")):
        problems += ring_errors(failed_case(n, {r: stopped(r, n) for r in range(n)}, label), "q19", label)
    not_run = {r: {"type": "NotRun", "message": "not run: 2 earlier cases of q19 deadlocked or timed out"}
               for r in range(4)}
    problems += ring_errors(failed_case(4, not_run, "n = 4"), "q19", "n = 4")
    assert counts(problems) == (1, 1), problems
    cause, caused = "\n".join(render(problems)).split(CONSEQUENCES)
    assert "Every rank of the ring sent first" in cause and "(n = 3)" in cause and "not run" in caused


def test_a_position_passed_as_a_global_rank_is_one_cause_on_every_rank_it_showed():
    from lab_src.judge.summary import counts, render
    from lab_src.topics.data_parallel.judge import ring_errors
    where = [["q19_ring_all_reduce.py", 22, "exchange", "ops = [dist.P2POp(dist.isend, send, right, group=group),"]]
    errors = {0: {"type": "NotInGroup", "message": "dist.P2POp(dist.isend, ...) was given dst=1: ... global rank 1 "
                  "is not in the group", "where": where},
              1: {"type": "NotInGroup", "message": "dist.P2POp(dist.isend, ...) was given dst=1: ... global rank 1 "
                  "is this rank itself", "where": where},
              3: {"type": "NotInGroup", "message": "dist.P2POp(dist.isend, ...) was given dst=0: ... global rank 0 "
                  "is not in the group", "where": where}}
    problems = ring_errors(failed_case(4, errors, "2 x 2"), "q19", "2 x 2")
    assert counts(problems)[0] == 1, problems
    assert "also on ranks 1, 3" in "\n".join(render(problems))


class DictStore:
    """The launch's store, as the size links use it (set, get, check, wait), shared by the ranks of one process."""

    def __init__(self):
        import threading
        self.values, self.changed = {}, threading.Condition()

    def set(self, key, value):
        with self.changed:
            self.values[key] = value.encode() if isinstance(value, str) else value
            self.changed.notify_all()

    def get(self, key):
        return self.values[key]

    def check(self, keys):
        return all(k in self.values for k in keys)

    def wait(self, keys, timeout):
        with self.changed:
            if not self.changed.wait_for(lambda: self.check(keys), timeout.total_seconds()):
                raise TimeoutError(keys)


def test_a_send_of_another_size_than_its_receive_is_held_back_and_named_by_step_and_chunk():
    from lab_src.topics.data_parallel.sizes import SizedLinks, WrongMessageSize
    store, posted = DictStore(), []
    sender = SizedLinks(store, "case", 0, lambda tensor, *a, **k: posted.append(tensor.numel()))
    receiver = SizedLinks(store, "case", 1, None)
    x, y = torch.zeros(10), torch.zeros(10)        # chunks of 3, 3, 2, 2 on a ring of 4
    sender.begin(x, 4)
    receiver.begin(y, 4)
    chunks = torch.tensor_split(x, 4)
    right = sender.send(1, chunks[0], (), {})               # step 1: chunk 0, into a buffer of 3: posted
    receiver.receiving(0, torch.empty(3))
    right.wait()
    assert posted == [3] and sender.stop() is None
    wrong = sender.send(1, chunks[2], (), {})              # step 2: chunk 2 (2 elements) into a buffer of 3
    receiver.receiving(0, torch.empty(3))
    with pytest.raises(WrongMessageSize) as held:
        wrong.wait()
    text = " ".join(str(held.value).split())
    assert posted == [3], "the send of another size never reached gloo"
    assert text.startswith("its send to rank 1, in the reduce-scatter's step 2 of 3, chunk 2 of 4 (elements 6 to 7), "
                           "holds 2 elements (8 bytes); the receive rank 1 posted for it, in the reduce-scatter's step "
                           "2 of 3, a buffer of its own, not a view of the tensor, has room for 3 (12 bytes)"), text
    assert receiver.stop(), "every rank of the case stops waiting"
    sender.close()


def test_the_ring_cases_own_reason_to_stop_keeps_the_checks():
    # the ring kind stops its ranks' waits when a send was held back (sizes.py), and the check's own request to stop
    # (a deadlock the watch found) must still reach them: `wait` asks the innermost check only
    import threading

    from lab_src.pipeline import waiting

    class Never:
        def wait(self):
            threading.Event().wait(30)
    for outer, inner, reason in ((lambda: "the check asks", lambda: None, "the check asks"),
                                 (lambda: None, lambda: "held back", "held back")):
        with waiting.stop_when(outer), waiting.also_stop_when(inner):
            with pytest.raises(waiting.StoppedWaiting, match=reason):
                waiting.wait(Never())


def test_sums_redrawn_from_the_configuration_are_named_where_the_lab_changed_the_inputs():
    from lab_src.topics.data_parallel.inputs import expected_sum as summed
    case = Case(kind="ring", qid="q19", config=CFG, stages=4, settings={"lengths": [1000], "perturb": True})

    def run(total) -> CaseOutcome:
        return CaseOutcome(case, {r: {"group": [0, 1, 2, 3], "position": r, "perturbed": 99 if r == 0 else None,
                                      "runs": [ring_record([0, 1, 2, 3], r, 1000, total, 4)]} for r in range(4)})
    assert not any(judge_run(run(summed(CFG.seed, 1000, 4, perturbed=99)[0].float())).values())
    text = said(judge_run(run(summed(CFG.seed, 1000, 4)[0].float())))
    assert "rank 0: the result is the sum of the inputs as the configuration draws them, not of what the ranks " \
        "held" in text and "also on ranks 1, 2, 3" in text, text
    unseeded = run(summed(CFG.seed, 1000, 4, perturbed=99)[0].float())
    unseeded.obs[0].pop("perturbed")
    assert "lacks the seed of the change the lab made" in said(judge_run(unseeded))


def test_chunks_and_the_prediction_follow_from_the_sizes():
    assert [chunk_of(i, 10, 4) for i in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert [chunk_of(0, 1, 4)] == [0]
    assert SEED_LAYERS == {"fc1": 200_960, "fc2": 32_896, "fc3": 8_256, "fc4": 650}
    assert [ring_bytes(v, 4) for v in SEED_LAYERS.values()] == [1_205_760, 197_376, 49_536, 3_900]


def test_the_prediction_is_read_from_the_answer_and_a_whole_gradient_is_named(tmp_path, reference):
    from grader.hidden.common import Context
    from grader.hidden.q19_ring_all_reduce import prediction_items
    right = Path(reference["q19"]).read_text()
    wrong = tmp_path / "q19.py"
    wrong.write_text(right.replace('"fc1": 1_205_760', '"fc1": 803_840'))
    items = prediction_items(Context(student={"q19": str(wrong)}, reference=reference))
    assert [i.passed for i in items] == [False, True, True, True]
    assert "the whole gradient" in str(items[0].problems[0])


def test_the_check_prints_each_predicted_number_right_or_wrong_beside_the_measurement(tmp_path):
    from lab_src.checks.q19_ring_all_reduce import prediction_line
    answer = tmp_path / "q19.py"
    # fc2 is the whole gradient (wrong), fc4 is within half a percent (right), fc3 is missing, fc_3 is no key
    answer.write_text('def predicted_bytes():\n    return {"fc1": 1_205_760, "fc2": 131_584, "fc4": 3_910, "fc_3": 1}\n')
    text = " ".join(prediction_line(str(answer)).split())
    assert "graded (right within 0.5%)" in text
    assert "fc1 1,205,760 right fc2 131,584 wrong: measured 197,376 fc3 missing" in text, text
    assert "fc4 3,910 right" in text and "not graded: 'fc_3' (the keys are fc1, fc2, fc3, fc4)" in text


def test_a_prediction_of_another_form_is_told_the_keys(tmp_path, reference):
    from grader.hidden.common import Context
    from grader.hidden.q19_ring_all_reduce import prediction_items
    from lab_src.checks.q19_ring_all_reduce import prediction_line
    form = '`return {"fc1": ..., "fc2": ..., "fc3": ..., "fc4": ...}`'
    answer = tmp_path / "q19.py"
    for body in ("return [1_205_760, 197_376, 49_536, 3_900]",                  # a list, not a dict
                 "n = 4\n    return {'fc1': 2 * (n - 1) / n * 803_840}",         # a computation
                 "raise NotImplementedError()"):                                 # the release's stub
        answer.write_text(f"def predicted_bytes():\n    {body}\n")
        line = prediction_line(str(answer))
        assert "could not be read" in line and form in line, line
        items = prediction_items(Context(student={"q19": str(answer)}, reference=reference))
        assert not any(i.passed for i in items) and form in str(items[0].problems[0])


def test_the_opening_figure_ends_with_every_chunk_whole_on_every_rank():
    from lab_src.topics.data_parallel.figure import ring_figure, ring_steps
    for n in (2, 3, 4):
        steps = ring_steps(n)
        assert len(steps) == 2 * (n - 1) + 1
        assert all(c == set(range(n)) for row in steps[-1][1] for c in row)
        after_rs = steps[n - 1][1]          # each rank holds exactly one whole chunk: chunk r + 1
        assert [[c for c in range(n) if after_rs[r][c] == set(range(n))] for r in range(n)] == \
            [[(r + 1) % n] for r in range(n)]
    assert len(ring_figure(4).axes) == 7


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q19")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q19: all checks passed" in out, out
    assert "200,960 fc1 1,205,760 1,205,760 6 200,960" in out
    assert "650 fc4 3,896 to 3,904 3,900 6 652" in out
    assert "fc1 1,205,760 right fc2 197,376 right fc3 49,536 right fc4 3,900 right" in out
    widget = report.timeline()          # the 4-rank run's messages alone: no bubble, no schedule's second view
    svg = widget.frame.value
    assert list(widget.views) == ["measured"] and "message to a higher rank: send → receive" in svg
    assert "idle (bubble)" not in svg and "wrap-around" in svg
    # each call of the ring named above the ranks by its length (issue 55), its span "run", no "step"
    assert svg.count('class="pp-section"') == 8 and ">fc1: 200,960</text>" in svg and ">1,000</text>" in svg
    assert "no compute recorded" in widget.side.value and "Bubble" not in widget.side.value


def grade(reference, tmp_path, answers: dict[str, str]) -> dict[str, tuple[float, list[str]]]:
    """Grade each q19 answer text through the hidden tests, all cases in one launch: {name: (fraction, lines)}."""
    from hidden_grading import grade_answers
    return grade_answers("q19", answers, reference, tmp_path)


# name: (the answer, its fraction of the points, what its feedback must say); parts: sums (6 cases), ring (6),
# prediction (4 layers), a third each
MISTAKES = {
    "reference": (None, 1.0, "16 of 16 hidden checks passed"),
    # right sums, the same bits only for n = 2 (a + b = b + a); every message the whole tensor: (2/6 + 0 + 1) / 3
    "q19_whole_tensor": (answer("q19_whole_tensor"), 0.4444, "not bit for bit what rank 0 holds"),
    # the columns of a grid: ranks 1 and 2 (position 1 of [0, 2] and 0 of [1, 3]) send to themselves
    "q19_global_rank": (answer("q19_global_rank"), 0.8889, "MessageToItself: a send to rank"),
    # every rank sends first with a blocking send: the first two cases deadlock, the rest are not run
    "q19_blocking": (answer("q19_blocking"), 0.3333, "Every rank of the ring sent first, at the same time"),
    # a ring of zeros for the record, the sum redrawn from the case's seed found in a caller's frame: the lab changed
    # the inputs (a seed drawn outside the answer), so the sums are wrong in every case, and the ring carried zeros
    # (20/20 before issue 54): (0 + 0 + 1) / 3
    "q19_redraw_from_seed": (answer("q19_redraw_from_seed"), 0.3333,
                             "the result is the sum of the inputs as the configuration draws them, not of what the "
                             "ranks held"),
}
# what else a mistake's feedback must say
ALSO_SAYS = {"q19_redraw_from_seed": "the ring carried zeros, not the partial sums a ring must carry"}
# forged (issue 54): a ring of zeros for the record, the sum by torch's all_reduce through the recorder's saved
# original: its bytes on the wire, counted outside the ranks, are more than its messages (ring part lost): (1 + 0 + 1) / 3
MISTAKES["q19_zeros_original"] = (answer("q19_zeros_original"), 0.6667,
                                  "that no message of its record carried")
# issue 55: each of these reads as one cause, first, in the lab's words. The all-gather a chunk behind (the right sizes, unfinished chunks passed round): named by phase, step and chunk, the wrong sums its
# consequence; the ring part fails too (0.6667 before issue 55): (0 + 0 + 1) / 3. Each send posted with isend and its
# request let go of: gloo drops it and the neighbour waited until the case's deadline (45 s a case before issue 55);
# the lab keeps the request, names the send, and the sums are that rescue's consequence: (0 + 0 + 1) / 3
MISTAKES["all-gather a chunk behind"] = (None, 0.3333, "in the all-gather, step 1 of")
MISTAKES["isend never waited"] = (None, 0.3333, "and its request let go of without wait()")
ALSO_SAYS["all-gather a chunk behind"] = "What that caused"
ALSO_SAYS["isend never waited"] = "the reduce-scatter's step 1 of"
NEVER_SAYS = ("is not part of group", "<torch.distributed", "case deadline")
WRONG_EDITS = {
    "all-gather a chunk behind": [
        ("""        received = torch.empty_like(chunks[(me - step) % n])
        exchange(chunks[(me + 1 - step) % n], received)
        chunks[(me - step) % n].copy_(received)""",
         """        received = torch.empty_like(chunks[(me - step - 1) % n])
        exchange(chunks[(me - step) % n], received)
        chunks[(me - step - 1) % n].copy_(received)""")],
    "isend never waited": [
        ("""        ops = [dist.P2POp(dist.isend, send, group=group, group_peer=right),
               dist.P2POp(dist.irecv, recv, group=group, group_peer=left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()""",
         """        dist.isend(send, group=group, group_dst=right)
        dist.recv(recv, group=group, group_src=left)""")],
}
# Valid answers written otherwise keep every point: isend / irecv waited for at once, and global ranks (dst=,
# src=) from the group's positions
VALID = {
    "isend and irecv": [
        ("""        ops = [dist.P2POp(dist.isend, send, group=group, group_peer=right),
               dist.P2POp(dist.irecv, recv, group=group, group_peer=left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()""",
         """        works = [dist.isend(send, group=group, group_dst=right), dist.irecv(recv, group=group, group_src=left)]
        for work in works:
            work.wait()""")],
    "global ranks": [
        ("dist.P2POp(dist.isend, send, group=group, group_peer=right)",
         "dist.P2POp(dist.isend, send, dist.get_global_rank(group, right) if group else right, group=group)"),
        ("dist.P2POp(dist.irecv, recv, group=group, group_peer=left)",
         "dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, left) if group else left, group=group)")],
    # the chunks taken the other way round (rank me sends chunk step - me), the all-gather received in place
    "chunks the other way, received in place": [
        ("mine = chunks[(me - step - 1) % n]", "mine = chunks[(step + 1 - me) % n]"),
        ("exchange(chunks[(me - step) % n], received)", "exchange(chunks[(step - me) % n], received)"),
        ("""        received = torch.empty_like(chunks[(me - step) % n])
        exchange(chunks[(me + 1 - step) % n], received)
        chunks[(me - step) % n].copy_(received)""",
         """        exchange(chunks[(n - 1 - me + step) % n], chunks[(n - me + step) % n])""")],
    # torch.chunk's split (ceil-sized chunks, fewer than n when short), padded with empty views to n chunks
    "torch.chunk": [
        ("torch.tensor_split(tensor.view(-1), n)",
         "torch.chunk(tensor.view(-1), n) + (tensor.view(-1)[:0],) * (n - len(torch.chunk(tensor.view(-1), n)))")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q19"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in [*WRONG_EDITS.items(), *VALID.items()]:
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    # a launch stops trying an exercise after two of its cases deadlocked (harness/runner.py): the blocking ring last
    texts = dict(sorted(texts.items(), key=lambda kv: kv[0] == "q19_blocking"))
    graded = grade(reference, tmp_path, texts)
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        assert got == pytest.approx(fraction, abs=1e-4), (name, lines)
        assert says in " ".join("\n".join(lines).split()), (name, lines)   # messages wrap at 110 columns
        assert ALSO_SAYS.get(name, "") in " ".join("\n".join(lines).split()), (name, lines)
        assert not any(never in " ".join("\n".join(lines).split()) for never in NEVER_SAYS), (name, lines)
    for name in VALID:
        assert graded[name][0] == 1.0, (name, graded[name][1])


def test_the_study_times_the_ring_and_gloo_and_fits_the_model(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks.ring_study import ring_study
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        study = ring_study(n=2, lengths=(1, 4096, 262_144), repeats=2)
    finally:
        del os.environ["LAB_ANSWERS"]
    assert sorted(study.ring) == sorted(study.gloo) == [1, 4096, 262_144]
    assert all(t > 0 for t in [*study.ring.values(), *study.gloo.values()])
    alpha, beta = study.fit()
    out = capsys.readouterr().out
    assert "ring all-reduce on 2 ranks" in out and "busbw" in out and "262,144" in out
    # the notebook asks the student to fit alpha and beta: the table printed before that says nothing of the fit
    assert "alpha" not in out and "model" not in out
    assert study.busbw(262_144, 1.0) == study.algbw(262_144, 1.0) * 2 * (2 - 1) / 2

    def legend(fig):
        return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not any("fit" in t or "model" in t for t in legend(study.figure()))      # the times alone
    fig = study.figure(alpha, beta)
    assert len(fig.axes) == 1 and any(t.startswith("your model") for t in legend(fig)) \
        and any(t.startswith("the lab's fit") for t in legend(fig))
    study.table(alpha, beta)
    assert "the model with alpha" in capsys.readouterr().out


def test_the_timeline_names_each_call_of_the_ring_by_its_length():
    """Issue 55, item 3: the check's timeline held 8 calls of the ring unlabelled ("find the 2(n - 1) ring steps of
    the largest length"): each call's messages, found from each rank's record of it, named by length and layer."""
    from lab_src.topics.data_parallel.figure import calls
    from lab_src.pipeline.trace import Event
    lengths = [SEED_LAYERS["fc1"], 5]
    out = outcome(lengths)
    events = []
    for k, length in enumerate(lengths):          # each rank's 2(n - 1) sends and receives per call, in time
        for r in range(4):
            for step in range(6):
                t = k + 0.01 * step + 0.001 * r
                events += [Event(r, "send_forward", None, (r + 1) % 4, None, 4, t, t + 0.002),
                           Event(r, "recv_forward", None, (r - 1) % 4, None, 4, t, t + 0.003)]
    events.sort(key=lambda e: (e.t_start, e.rank))
    found = calls(out, events)
    assert [words for words, _ in found] == ["fc1: 200,960", "5"]
    for k, (_, idx) in enumerate(found):
        assert len(idx) == 4 * 12 and {int(events[i].t_start) for i in idx} == {k}
    out.obs = {}                                  # a stopped run: no record to split its messages by
    assert calls(out, events) == []


def test_the_graders_saved_run_is_drawn_as_the_checks_ring_not_as_a_pipeline(tmp_path, monkeypatch):
    """The ring kind declares its view (Kind.view): the grader's saved run of q19 (grader/trusted.py save_timeline,
    drawn by the feedback's timeline cell) names its calls and draws no schedule, as the visible check does; it was
    saved as a pipeline's run ("4 stages, 1 micro-batches", a bubble against a schedule that never ran)."""
    from grader.trusted import save_timeline
    from lab_src.pipeline.trace import Event
    from lab_src.topics.data_parallel.figure import COMPUTE_FREE
    from lab_src.views.saved import load_view
    out = outcome([SEED_LAYERS["fc4"]])
    events = [Event(r, kind, None, (r + d) % 4, None, 4, 0.01 * s, 0.01 * s + 0.002)
              for s in range(6) for r in range(4) for kind, d in (("send_forward", 1), ("recv_forward", -1))]
    monkeypatch.setattr(CaseOutcome, "events", lambda self, recovered=False: list(events))
    save_timeline("q19", [out], [], tmp_path)
    view = load_view(tmp_path / "q19.json")
    assert view["compute_free"] == COMPUTE_FREE and "micro-batches" not in view["title"], view["title"]
    assert [words for words, _ in view["sections"]] == ["fc4: 650"] and len(view["sections"][0][1]) == 48


# Mistakes that stop a case's waits, each graded in a launch of its own (a launch stops trying an exercise after two of
# its cases were stopped: harness/worker.py). Positions passed as global ranks (dst=, src=): the lab's NotInGroup
# before torch's ValueError (which named the group by its address), on the grid's columns only: (5/6 + 5/6 + 1) / 3.
# A reduce-scatter or an all-gather a chunk off, its receive the size of the chunk it should have sent: gloo aborted
# the receiving process ("a rank exited during the case", exit code -6) or waited to the deadline; the lab holds the
# send back and names it; the first two cases stop, the rest are not run, as before: (0 + 0 + 1) / 3
STOPPING = {
    "positions as global ranks": (
        [("dist.P2POp(dist.isend, send, group=group, group_peer=right)", "dist.P2POp(dist.isend, send, right, group=group)"),
         ("dist.P2POp(dist.irecv, recv, group=group, group_peer=left)", "dist.P2POp(dist.irecv, recv, left, group=group)")],
        0.8889, "NotInGroup: dist.P2POp(dist.isend, ...) was given dst=1: dst= (a P2POp's peer) is a global rank"),
    "reduce-scatter a chunk ahead": (
        [("exchange(chunks[(me - step) % n], received)\n        mine += received",
          "exchange(chunks[(me - step + 1) % n], received)\n        mine += received")],
        0.3333, "WrongMessageSize: its send to rank 1, in the reduce-scatter's step 1 of 1,"),
    "all-gather a chunk behind, received as sent": (
        [("        exchange(chunks[(me + 1 - step) % n], received)\n        chunks[(me - step) % n].copy_(received)",
          "        exchange(chunks[(me - step) % n], received)\n        chunks[(me - step) % n].copy_(received)")],
        0.3333, "in the all-gather's step 1 of"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STOPPING))
def test_a_mistake_that_stops_the_case_is_one_cause_said_first(name, reference, tmp_path, no_leftovers):
    reference = {k: str(v) for k, v in reference.items()}
    text = Path(reference["q19"]).read_text()
    edits, fraction, says = STOPPING[name]
    for old, new in edits:
        assert old in text, (name, old)
        text = text.replace(old, new)
    got, lines = grade(reference, tmp_path, {name: text})[name]
    said = " ".join("\n".join(lines).split())
    assert got == pytest.approx(fraction, abs=1e-4), lines
    assert says in said, lines
    assert not any(never in said for never in NEVER_SAYS + ("exit code", "a rank exited")), lines
    causes = said.split("What that caused")[0]
    assert causes.count("[q19]") == 1, lines          # one cause, said once, whatever the cases it showed in

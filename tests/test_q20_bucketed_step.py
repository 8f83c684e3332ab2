"""q20: gradient buckets reduced during the 1F1B backward, on a data x pipeline grid.

Fast: the opening figure puts each stage's rings in its last backward; the prediction's numbers follow from the
rule. Multi-process: the reference passes the visible check (its plans, its rings in lane 1 of each rank, drawn);
every cohort mistake and two valid answers written otherwise, graded through the hidden tests in one launch, get
their points and their messages.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from grader.cohort.answers import answer

pytestmark = pytest.mark.q20


def test_the_opening_figure_puts_each_stages_rings_in_its_last_backward():
    from lab_src.topics.data_parallel.figure import bucket_events, buckets_figure
    events = bucket_events(4, 8, 3)
    for r in range(4):
        last = max((e for e in events if e.rank == r and e.kind == "backward"), key=lambda e: e.t_start)
        rings = sorted((e for e in events if e.rank == r and e.lane == 1), key=lambda e: e.t_start)
        assert len(rings) == 3 and rings[0].t_start > last.t_start
        assert all(a.t_end <= b.t_start for a, b in zip(rings, rings[1:]))      # one reducing thread
    assert buckets_figure(4, 8, 3).axes


def test_a_bucket_closed_where_it_would_meet_the_cap_exactly_is_named():
    from lab_src.topics.data_parallel.buckets import mlp_params, plan_problems
    from lab_src.topics.data_parallel.records import MLP_EXACT_CAP, SEED_MLP
    params = [(n, b, True) for n, b in mlp_params(SEED_MLP)]
    names = [n for n, _, _ in params][::-1]         # fc4.bias, fc4.weight, fc3.bias, fc3.weight, fc2.bias, ...
    rule = [names[:4], names[4:5], names[5:6], names[6:7], names[7:]]
    assert sum(b for n, b, _ in params if n in rule[0]) == MLP_EXACT_CAP and not plan_problems(params, rule, MLP_EXACT_CAP)
    strict = [names[:3], names[3:5], names[5:6], names[6:7], names[7:]]
    text = " ".join(plan_problems(params, strict, MLP_EXACT_CAP))
    assert text.startswith("\"within cap_bytes\" read as strictly below the cap: bucket 0 (2,856 B)"), text


def test_the_predictions_numbers_follow_from_the_rule():
    from grader.hidden.q20_bucketed_step import mlp_buckets
    assert [mlp_buckets(c) for c in (1 << 20, 1 << 19, 1 << 16)] == [1, 2, 4]


def test_the_check_prints_each_predicted_count_right_or_wrong_beside_the_plan(tmp_path):
    from lab_src.checks.q20_bucketed_step import mlp_lines
    from lab_src.harness.case import Case, CaseOutcome
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.data_parallel.judge_buckets import mlp_plan_problems
    first = ["fc4.bias", "fc4.weight", "fc3.bias", "fc3.weight", "fc2.bias"]
    plans = {str(1 << 20): [first + ["fc2.weight", "fc1.bias", "fc1.weight"]],          # the rule's: 1 bucket
             str(1 << 19): [first + ["fc2.weight", "fc1.bias"], ["fc1.weight"]],        # the rule's: 2
             str(1 << 16): [first, ["fc2.weight"], ["fc1.bias", "fc1.weight"]]}         # fc1's two over the cap
    out = CaseOutcome(Case(kind="buckets", qid="q20", config=LabConfig(), stages=4), {0: {"mlp_plans": plans}})
    answer = tmp_path / "q20.py"
    answer.write_text('def predicted_buckets():\n    return {"1MiB": 1, "512KiB": 3, "64KiB": 4}\n')
    lines, problems = mlp_lines(out, str(answer), mlp_plan_problems)
    text = " ".join(" ".join(lines).split())
    assert "graded: the number of buckets, exactly" in text
    assert "cap 1MiB: 1 bucket (971,048 B); you predicted 1: right" in text, text
    assert "you predicted 3: wrong, the rule makes 2" in text
    assert "cap 64KiB: 3 buckets" in text and "you predicted 4: not judged here until this plan follows the rule" in text
    assert len(problems) == 1
    answer.write_text("def predicted_buckets():\n    return [1, 2, 4]\n")
    text = " ".join(" ".join(mlp_lines(out, str(answer), mlp_plan_problems)[0]).split())
    assert 'could not be read' in text and '`return {"1MiB": ..., "512KiB": ..., "64KiB": ...}`' in text, text


def early_outcome(monkeypatch, armed_at_start: bool):
    """A 2 x 2 grid's record (m = 4, tied embeddings, one step) in which stage 0 (and, `armed_at_start`, stage 1 too)
    launched a bucket before its last backward began: stage 0's gradients miss the later micro-batches, and so does
    the tied gradient the last stage sums with it; one process's gradients are ones."""
    import torch

    from lab_src.harness.case import Case, CaseOutcome
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.data_parallel import judge_buckets
    cfg = LabConfig(num_stages=2, num_layers=4, num_microbatches=4, global_batch_size=16, dp_size=2, seed=20,
                    tie_embeddings=True)
    ones = {"embed.tokens.weight": torch.ones(3), "blocks.0.w": torch.ones(3), "blocks.1.w": torch.ones(3),
            "head.proj.weight": torch.ones(3)}
    monkeypatch.setattr(judge_buckets, "baseline_grads", lambda case: [ones])
    backwards = [[mb, 10.0 * mb, 10.0 * mb + 5] for mb in range(4)]          # the last backward: 30 to 35
    obs = {}
    for r in range(4):
        first = r % 2 == 0
        grads = ({n: torch.full((3,), 0.5) for n in ("embed.tokens.weight", "blocks.0.w")} if first else
                 {"blocks.1.w": torch.ones(3), "head.proj.weight": torch.full((3,), 0.5)})
        launch = 1.0 if first or armed_at_start else 31.0
        obs[r] = {"steps": [{"grads": grads, "launches": [[launch, 12, 0.1]], "backwards": backwards,
                             "tied_sums": [[36.0, 3, True]]}]}
    return CaseOutcome(Case(kind="buckets", qid="q20", config=cfg, stages=4, settings={"cap": 40_000, "steps": 1}), obs)


@pytest.mark.parametrize("armed_at_start", [False, True])
def test_an_early_launch_is_the_one_cause_and_the_wrong_gradients_are_said_under_it(monkeypatch, armed_at_start):
    from lab_src.judge.problems import stamped
    from lab_src.judge.summary import CONSEQUENCES, counts, render
    from lab_src.topics.data_parallel.judge_buckets import judge_run
    found = judge_run(early_outcome(monkeypatch, armed_at_start))
    problems = [p for part in found.values() for p in stamped(part, "q20", "2 x 2")]
    assert counts(problems) == (1, 2), problems             # one cause, its two consequences
    text = "\n".join(render(problems))
    cause, caused = text.split(CONSEQUENCES)
    assert "launched a bucket before its last backward (micro-batch 3's) began" in cause.splitlines()[0]
    assert ("also on ranks 1, 2, 3" if armed_at_start else "also on rank 2") in cause
    assert "the tied embedding's gradient" not in cause and "differ from one process's" not in cause
    assert "differ from one process's over the global batch" in caused
    assert "the tied embedding's gradient (head.proj.weight) differs" in caused or armed_at_start
    assert "summed once, after the buckets" not in text


def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps({k: str(v) for k, v in reference.items()}))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q20")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q20: all checks passed" in out, out
    assert "0 0 0 4: 38,272 / 29,568 / 35,840 / 8,192 4/4 backward 3" in out and "tied embeddings" in out
    assert "cap 512KiB: 2 buckets (168,232 / 802,816 B); you predicted 2: right" in out
    events = report.views[0]["events"]
    lane = [e for e in events if e.lane == 1]
    assert {e.rank for e in lane} == {0, 1, 2, 3} and all(e.kind.startswith(("send", "recv")) for e in lane)
    # the ring's messages go to the other replica of the same stage, never along the pipeline
    assert all(e.peer == (e.rank + 2) % 4 for e in lane)
    widget = report.timeline()
    assert "its lane 1" in widget.frame.value and "dp 1, pp 1" in widget.frame.value


# name: (the answer, its fraction of the points, what its feedback must say); parts: values (4 cases), plan (4 cases
# and the seed's MLP under 3 caps), rings (4), placement (4), prediction (3), a fifth each. The last stage never
# armed: values right only on 1 x 4, no ring and no overlap on any last stage: (1/4 + 1 + 0 + 0 + 1) / 5
MISTAKES = {
    "reference": (None, 1.0, "22 of 22 hidden checks passed"),
    "q20_forward_order": (answer("q20_forward_order"), 0.8, "the buckets follow the declaration order"),
    "q20_armed_last_forward": (answer("q20_armed_last_forward"), 0.7,
                               "launched a bucket before its last backward (micro-batch 3's) began, after 2 of its 4"),
    "q20_average_twice": (answer("q20_average_twice"), 0.85, "your gradients are 1/2 of the reference's: averaged twice"),
    "q20_every_microbatch": (answer("q20_every_microbatch"), 0.6,
                             "16 launches for 4 buckets: every bucket was reduced once per micro-batch"),
    "q20_launch_in_finish": (answer("q20_launch_in_finish"), 0.8, "nothing of the reduction overlapped the backward"),
    # the tied case's values fail on its first and last stage, everything else passes: (3/4 + 1 + 1 + 1 + 1) / 5
    "q20_tied_before_average": (answer("q20_tied_before_average"), 0.95,
                                "while its bucket was still being reduced, and finish() then wrote the bucket's"),
    "q20_last_stage_unarmed": (answer("q20_last_stage_unarmed"), 0.45,
                               "On the last stage 1F1B has no cool-down"),
    # "within cap_bytes" read as strictly below: only the seed's MLP under 35,624 B, whose first bucket meets the cap
    # exactly, shows it (the first case's plan item; 20/20 before issue 54): (1 + 6/7 + 1 + 1 + 1) / 5
    "q20_cap_strict": (answer("q20_cap_strict"), 0.9714,
                       "\"within cap_bytes\" read as strictly below the cap: bucket 0 (2,856 B) was closed before "
                       "fc3.weight (32,768 B), which fills it to exactly the cap of 35,624 B"),
}
# Two more wrong answers of no student: the replicas launching in different orders (named before any ring runs),
# and finish() averaging with torch.distributed's all_reduce instead of launching (no ring, no overlap)
# forged (issue 54): zeros launched on time, the real average by an unrecorded all-reduce in finish(): its bytes on the
# wire are more than its messages (rings part lost); every bucket launched in finish(), the record's launch times
# rewritten to when the buckets filled: the journal read during the run shows no launch in the last backward
MISTAKES["q20_zeros_allreduce"] = (answer("q20_zeros_allreduce"), 0.85, "that no message of its record carried")
MISTAKES["q20_finish_retimed"] = (answer("q20_finish_retimed"), 0.8,
                                  "the launch times in the record were written after the fact")
MISTAKES["order differs"] = (None, 0.5571, "BucketMismatch: launch 0 of the step carries different buckets")
MISTAKES["collective"] = (None, 0.6, "the reducer called a collective of torch.distributed (all_reduce)")
WRONG_EDITS = {
    "order differs": [("""        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            names = self.buckets[self.next]""", """        order = list(range(len(self.buckets)))[::-1] if self.dp.rank % 2 else list(range(len(self.buckets)))
        while self.next < len(self.buckets) and self.ready[order[self.next]] == len(self.buckets[order[self.next]]):
            names = self.buckets[order[self.next]]""")],
    "collective": [("            self.launched.append((names, buffer, self.dp.launch(buffer)))",
                    "            self.launched.append((names, buffer, None))"),
                   ("""            handle.wait()
            buffer /= self.dp.size""", """            torch.distributed.all_reduce(buffer, group=self.dp.group)
            buffer /= self.dp.size""")],
}
# Valid answers written otherwise keep every point: the gradients written back through torch.split, each divided
# on its own; the reducer armed by counting the stage's backwards
VALID = {
    "split": [
        ("""            buffer /= self.dp.size
            offset = 0
            for n in names:
                grad = self.params[n].grad
                grad.copy_(buffer[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()""",
         """            pieces = torch.split(buffer, [self.params[n].numel() for n in names])
            for n, piece in zip(names, pieces):
                self.params[n].grad.copy_(piece.view_as(self.params[n]) / self.dp.size)""")],
    "counted": [
        ("""    def backward(mb, grad):
        if mb == m - 1:""", """    done = []

    def backward(mb, grad):
        done.append(mb)
        if len(done) == m:""")],
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from hidden_grading import grade_answers
    reference = {k: str(v) for k, v in reference.items()}
    right = Path(reference["q20"]).read_text()
    texts = {name: text if text is not None else right for name, (text, _, _) in MISTAKES.items()}
    for name, edits in [*WRONG_EDITS.items(), *VALID.items()]:
        texts[name] = right
        for old, new in edits:
            assert old in texts[name], (name, old)
            texts[name] = texts[name].replace(old, new)
    graded = grade_answers("q20", texts, reference, tmp_path)
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        assert got == pytest.approx(fraction, abs=1e-4), (name, lines)
        assert says in " ".join("\n".join(lines).split()), (name, lines)   # messages wrap at 110 columns
    for name in VALID:
        assert graded[name][0] == 1.0, (name, graded[name][1])

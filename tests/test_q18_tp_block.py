"""q18: tensor parallelism, the whole block, dropout's streams, training to one process's curve.

Fast: dropout's definition (off changes nothing; the unsharded block's masks are the shards' own draws put
together), the judge on observations made from the unsharded block's own numbers (a right rank passes; a
wrong dropout output is read for its cause from the ranks' data), the byte counts, the figures.
Multi-process (slow, one launch each): the reference passes the visible check; the reference and each cohort
mistake, graded through the hidden tests in one launch, get their points and messages.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from grader.cohort.answers import answer
from lab_src.harness.case import Case, CaseOutcome
from lab_src.pipeline import dropout
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.model import build_piece
from lab_src.topics.tensor_parallel import runtime as tpmod
from lab_src.topics.tensor_parallel.judge_block import expected, judge_part

pytestmark = pytest.mark.q18

CFG = LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64", seed=3)


def test_dropout_off_changes_nothing_and_keys_stay():
    assert LabConfig().key() == "ce49551697" and "dropout" not in LabConfig().to_dict()
    x = tpmod.block_inputs(CFG)["x"]
    plain = build_piece(CFG, "blocks.0")
    on = build_piece(CFG.replace(dropout=0.3, dropout_shards=2), "blocks.0")
    on.eval()                                    # eval mode: nothing dropped, no stream touched
    assert torch.equal(plain(x), on(x)) and on.streams is None


def test_the_single_process_masks_are_the_shards_own_draws():
    """A block of t shards draws its attention mask as t per-shard blocks, then two shared masks: what rank r
    draws from shard r's stream and the shared stream, element for element."""
    b, heads, s, h, p = 2, 4, 16, 32, 0.2
    like = torch.zeros((), dtype=torch.float64)
    streams = dropout.Streams(3, "blocks.0", 2)
    whole = streams.attention_mask((b, heads, s, s), p, like)
    for r in range(2):
        own = dropout.keep(dropout.stream(3, "blocks.0", shard=r), (b, heads // 2, s, s), p, like)
        assert torch.equal(whole[:, 2 * r:2 * r + 2], own)
    shared = dropout.stream(3, "blocks.0")
    dropout.keep(shared, (b, s, h), p, like)
    assert torch.equal(dropout.keep(streams.shared, (b, s, h), p, like), dropout.keep(dropout.stream(3, "blocks.0"),
                                                                                     (b, s, h), p, like))
    assert not torch.equal(whole[:, :2], whole[:, 2:])      # the shards' masks differ


RECORDED_SKIP = ("full_params",)


def observed(part: str, t: int = 2, cfg: LabConfig = CFG, change=None) -> CaseOutcome:
    obs = {}
    for r, want in enumerate(expected(part, cfg, t)):
        got = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in want.items() if k not in RECORDED_SKIP}
        if change is not None:
            change(r, got)
        obs[r] = {"tp_block": {part: got}}
    return CaseOutcome(Case(kind="tp_block", qid="q18", config=cfg, stages=t), obs)


def said(found: dict) -> str:
    return " ".join(" ".join(str(p) for p in problems) for problems in found.values())


@pytest.mark.parametrize("part", ["block", "dropout"])
@pytest.mark.parametrize("t", [2, 4])
def test_what_the_unsharded_block_says_passes(part, t):
    assert not any(judge_part(part, observed(part, t)).values())


def test_expected_shards_put_back_together_are_the_unsharded_gradients():
    want = expected("block", CFG, 2)
    assert want[0]["qkv_weight_shape"] == [48, 32] and want[0]["proj_weight_shape"] == [32, 16]
    rows = torch.cat([tpmod.heads_rows(32, 4, r, 2) for r in range(2)])
    assert sorted(rows.tolist()) == list(range(96))
    assert want[0]["fwd"] == [["all_reduce", 2 * 16 * 32 * 8, [0, 1]]] * 2 == want[1]["bwd"]


def test_a_wrong_dropout_output_is_read_for_its_cause():
    def per_rank(r, got):
        got["out"] = got["out"] + 0.01 * (r + 1)      # the ranks disagree: the shared stream seeded per rank
        got["attn_norm_weight_after"] = got["attn_norm_weight_after"] + 1e-3 * r
    found = judge_part("dropout", observed("dropout", change=per_rank))
    text = " ".join(said(found).split())
    assert "The output differs between the ranks: outside the sharded region" in text
    assert "the attention's LayerNorm's weight differs between the ranks after one AdamW step" in text

    def same_wrong(r, got):
        got["out"] = got["out"] + 0.01                 # the ranks agree, but not with one process
    text = " ".join(said(judge_part("dropout", observed("dropout", change=same_wrong))).split())
    assert "It is the same on every rank, but not the single process's: the masks inside the sharded region" in text


def test_an_output_dropped_in_evaluation_mode_is_named_once_the_rest_is_right():
    """The dropout part's forward in evaluation mode must drop nothing: the training mode's masks applied there
    are named as such; the block part, which runs no evaluation forward, is not judged on it; and a wrong
    training output keeps its own message (the evaluation is judged only once the rest is right)."""
    def dropped(r, got):
        got["eval_out"] = got["out"].clone()           # the training mode's output: masks drawn in eval mode too
    text = " ".join(said(judge_part("dropout", observed("dropout", change=dropped))).split())
    assert "in evaluation mode (module.eval()), the output of the block with dropout 0.2 differs" in text
    assert "The masks must be drawn only while self.training is true" in text
    assert not any(judge_part("block", observed("block", change=lambda r, got: got.pop("eval_out"))).values())

    def both(r, got):
        got["eval_out"], got["out"] = got["out"].clone(), got["out"] + 0.01
    text = " ".join(said(judge_part("dropout", observed("dropout", change=both))).split())
    assert "evaluation mode" not in text and "It is the same on every rank, but not the single process's" in text


def test_three_column_layers_for_q_k_v_are_named_a_round_too_many():
    def three(r, got):
        got["bwd"] = got["bwd"] + got["bwd"]
    text = " ".join(said(judge_part("block", observed("block", change=three))).split())
    assert "one copy before one qkv layer is enough" in text


def test_a_curve_that_is_not_the_changed_models_is_named_as_computed_outside_the_run():
    """A hidden training changes stage 0's embedding by a seed only the run knows (pipeline/perturb.py): the
    changed model's curve passes; the configuration's own model's curve (what an answer computes for itself)
    is named as not the run's; a record without the seed is named as rewritten."""
    from lab_src.topics.tensor_parallel.judge_train import judge_training, single_process
    from lab_src.topics.training.digits import DIGITS
    cfg, steps, lr, seed = DIGITS.replace(num_stages=1), 3, 1e-2, 12345

    def outcome(losses, perturbed=seed):
        obs = {r: {"grid": [2, 1], "losses": list(losses)} for r in range(2)}
        if perturbed is not None:
            obs[0]["perturbed"] = perturbed
        settings = {"t": 2, "steps": steps, "lr": lr, "perturb": True}
        return CaseOutcome(Case(kind="tp_train", qid="q18", config=cfg, stages=2, settings=settings), obs)
    changed, unchanged = single_process(cfg, steps, lr, seed), single_process(cfg, steps, lr)
    assert max(abs(a - b) for a, b in zip(changed, unchanged)) > 1e-3
    assert not any(judge_training(outcome(changed), steps, lr, unchanged=unchanged).values())
    found = judge_training(outcome(unchanged), steps, lr, unchanged=unchanged)
    text = " ".join(" ".join(str(p) for p in found["curves"]).split())
    assert len(found["curves"]) == 2 and "one process's training of the model as the configuration builds it" in text
    assert "The curve was computed outside the run" in text and "masks" not in text
    found = judge_training(outcome(changed, perturbed=None), steps, lr, unchanged=unchanged)
    assert "lacks the seed of the change the lab made" in " ".join(str(p) for p in found["curves"])


def test_the_byte_counts():
    from lab_src.topics.tensor_parallel.traffic import PREDICTION, expected_bytes
    assert expected_bytes(PREDICTION, 2, 1) == {"tensor_parallel": 8_388_608, "pipeline": 0}
    assert expected_bytes(PREDICTION, 1, 2) == {"tensor_parallel": 0, "pipeline": 524_288}
    assert expected_bytes(PREDICTION, 2, 2) == {"tensor_parallel": 8_388_608, "pipeline": 1_048_576}


def test_the_figures_draw_from_the_model():
    from lab_src.topics.tensor_parallel.block_figure import tp_block_figure
    from lab_src.topics.tensor_parallel.curves import curves_figure
    texts = [t.get_text() for t in tp_block_figure(4).axes[0].texts]
    assert "qkv: heads\n3..3\n(24, 32)" in texts and "proj cols\n(32, 8)" in texts
    fig = curves_figure([{"label": "t = 2", "single": [2.0, 1.9], "curves": {0: [2.0, 1.9000001]}}])
    assert "tolerance (q13): 1e-5" in [t.get_text() for t in fig.axes[1].get_legend().get_texts()]


# ---- real runs -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_reference_passes_the_visible_check(reference, in_tmp, no_leftovers, capsys):
    from lab_src.checks import check
    (in_tmp / "map.json").write_text(json.dumps(reference))
    os.environ["LAB_ANSWERS"] = str(in_tmp / "map.json")
    try:
        report = check("q18")
    finally:
        del os.environ["LAB_ANSWERS"]
    out = " ".join(capsys.readouterr().out.split())
    assert report.ok and "q18: all checks passed" in out, out
    assert "the block with dropout 0.2: matches the unsharded block; LayerNorms after a step: identical on every rank" \
        in out
    assert "tensor_parallel (t = 2): 8,388,608; you predicted 8,388,608" in out
    assert "pipeline (p = 2): 524,288; you predicted 524,288" in out
    assert "t = 2 x p = 2: the largest relative difference from one process over 20 steps:" in out
    widget = report.timeline()          # the animated timeline, as q17's; the static figure while autograding
    assert "The parts ran one after another: block, dropout;" in widget.side.value and "<svg" in widget.frame.value
    # issue 41: each call named from the parts' records, the evaluation-mode forward of the dropout part too
    assert "<li>block, forward</li><li>block, forward</li><li>block, backward</li>" in widget.side.value
    assert "<li>dropout, eval</li><li>dropout, eval</li><li>dropout, backward</li>" in widget.side.value
    assert report.curves().axes[1].get_legend() is not None


def grade(reference, tmp_path, answers: dict[str, str]) -> dict[str, tuple[float, list[str]]]:
    """Grade each q18 answer text through the hidden tests, all cases in one launch: {name: (fraction, lines)}."""
    from hidden_grading import grade_answers
    return grade_answers("q18", answers, reference, tmp_path)


# name: (the answer, its fraction of the points, what its feedback must say); five parts, a fifth each:
# block (2 items), dropout (2), replicated (4), training (2), prediction (2)
MISTAKES = {
    "reference": (None, 1.0, "12 of 12 hidden checks passed"),
    # dropout fails at t = 2 and 4, the t = 2 training too; the ranks agree: (1 + 0 + 1 + 1/2 + 1) / 5
    "q18_mask_shared_inside": (answer("q18_mask_shared_inside"), 0.7,
                               "It is the same on every rank, but not the single process's"),
    # dropout fails, its LayerNorms differ between ranks, the t = 2 training fails: (1 + 0 + 2/4 + 1/2 + 1) / 5
    "q18_norm_seeded_per_rank": (answer("q18_norm_seeded_per_rank"), 0.6, "The output differs between the ranks"),
    # the job's world is 4 ranks (the 4-rank cases share the launch): every case on 2 ranks refuses the
    # world's all-reduce (the block, dropout and replicated items at t = 2, the t = 2 and t x p trainings);
    # t = 4, where the world is the tensor-parallel group, passes: (1/2 + 1/2 + 2/4 + 0 + 1) / 5
    "q18_world_group": (answer("q18_world_group"), 0.5, "but the tensor-parallel group is ranks [0, 1]"),
    # masks drawn in evaluation mode too: the dropout part fails on 2 and 4 ranks, the rest passes: (1 + 0 + 1 + 1 + 1) / 5
    # shards seeded from the global rank: wrong only on two groups side by side, judged in the t = 2 dropout item
    "q18_global_rank_seed": (answer("q18_global_rank_seed"), 0.9, "not the global ranks (dist.get_rank())"),
    "q18_drops_in_eval": (answer("q18_drops_in_eval"), 0.8,
                          "in evaluation mode (module.eval()), the output of the block with dropout 0.2 differs"),
    # a forgery (issue 45): the reference's block, but the recorded losses overwritten with one process's curve
    # computed in the rank from the configuration; every hidden training changes the embedding once built, so
    # both trainings fail and the rest passes: (1 + 1 + 1 + 0 + 1) / 5
    "q18_forged_curve": (answer("q18_forged_curve"), 0.8,
                         "The curve was computed outside the run and written over the run's own"),
    # issue 41, one cause named once: qkv cut without grouping by heads fails the block without dropout (t = 2, 4);
    # the dropout part and both trainings follow from it and are said under it, never blamed on the (right)
    # streams; replicated and prediction pass: (0 + 0 + 1 + 0 + 1) / 5
    "q18_qkv_not_by_heads": (answer("q18_qkv_not_by_heads"), 0.4,
                             "What that caused (it follows from the problem above: fix that first): [q18] rank 0: "
                             "the output of the block with dropout 0.2"),
    # the replicated LayerNorms' gradients all-reduced: the block and dropout parts fail (their LayerNorm gradients
    # and their backward's extra rounds, named by the LayerNorm's size, not as q, k and v copies); the LayerNorms
    # stay equal across ranks; the trainings fail, their curves 4e-4 from one process's (AdamW's step would hide
    # a gradient scaled by t but for its eps, which q18's trainings set to 1e-4: tensor_parallel/records.py
    # ADAM_EPS): (0 + 0 + 1 + 0 + 1) / 5
    "q18_norm_grads_reduced": (answer("q18_norm_grads_reduced"), 0.4,
                               "4 of them reduce 256 bytes, the size of a LayerNorm's weight or bias"),
}


@pytest.mark.slow
def test_each_mistake_gets_its_points_and_its_message(reference, tmp_path, no_leftovers):
    from pathlib import Path
    texts = {name: text if text is not None else Path(reference["q18"]).read_text()
             for name, (text, _, _) in MISTAKES.items()}
    graded = grade(reference, tmp_path, texts)
    for name, (_, fraction, says) in MISTAKES.items():
        got, lines = graded[name]
        assert got == pytest.approx(fraction, abs=1e-4), (name, lines)
        assert says in " ".join("\n".join(lines).split()), (name, lines)   # messages wrap at 110 columns


def test_the_experiment_launches_nothing_under_validate_or_after_a_failed_check_and_autograding_draws_nothing(
        monkeypatch, capsys):
    from lab_src import grading
    from lab_src.checks import tp_seeds
    from lab_src.checks.common import CheckReport
    from lab_src.checks.q18_tp_block import curves
    monkeypatch.setattr("lab_src.checks.common.run_cases", lambda *a, **k: pytest.fail("the experiment launched"))
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    assert tp_seeds.seed_policies() is None
    assert "skipped under Validate" in capsys.readouterr().out
    monkeypatch.delenv("NBGRADER_EXECUTION")
    monkeypatch.setitem(grading._checked, "q18", "CheckFailed: q18: FAILED, 1 problem\n[q18]: still the stub")
    assert tp_seeds.seed_policies() is None
    assert "the check above did not pass: make it pass first" in capsys.readouterr().err
    assert curves(CheckReport("q18", None, [], [], [], skipped=True)) is None      # what autograding hands back


@pytest.mark.slow
def test_validate_of_the_released_q18_runs_the_check_and_skips_the_experiment(reference, tmp_path, no_leftovers):
    import shutil
    import subprocess
    import sys
    import time

    from lab_src.registry import EXERCISES
    from tests.test_validate import ROOT
    notebook = ROOT / "notebooks" / EXERCISES["q18"].assignment / EXERCISES["q18"].notebook
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id == "q18_answer":
            cell["source"] = "%%answer q18\n" + open(reference["q18"]).read()
        if grade_id == "q18_prediction":
            cell["source"] = "(a) the ranks agree, one process does not; (b) the LayerNorms drift apart."
    (tmp_path / notebook.name).write_text(json.dumps(nb, indent=1))
    (tmp_path / "answers").mkdir()
    for qid in EXERCISES["q18"].needs:
        shutil.copyfile(reference[qid], tmp_path / "answers" / EXERCISES[qid].answer_file)
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\nc.Execute.timeout = 300\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "LAB_ANSWERS", "LAB_ANSWERS_DIR")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "validate", notebook.name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    print(f"nbgrader validate q18: {time.monotonic() - started:.1f} s\n{out}")
    assert "Success! Your notebook passes all the tests." in out
    assert not list((tmp_path / "runs").glob("q18-seeds-*")), "the experiment launched under Validate"


@pytest.mark.slow
@pytest.mark.parametrize("late_s", [5, 11])
def test_a_rank_late_to_a_collective_waits_its_kinds_timeout_then_ends_its_case(reference, tmp_path, no_leftovers,
                                                                                late_s):
    """Ranks late to an all-reduce (ranks 2 and 3 of t = 4 asleep in their first forward, as ranks starved of CPU
    on a loaded machine are) under a launch timeout of 2 s: a tensor-parallel case waits 4 times that
    (limits.COLLECTIVE_TIMEOUT_FACTOR, 8 s), so 5 s late costs nothing (at the launch's own 2 s it failed the
    reference: the full test run's q18 at t = 4), and 11 s late times the peers' all-reduce out. The feedback
    then names the timeout and the collective, never a deadlock: the group is unusable after a failed
    collective, so the case ends there (comm/collectives.py CollectiveGaveUp) instead of running its next part."""
    from pathlib import Path

    from hidden_grading import grade_answer

    from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
    text = Path(reference["q18"]).read_text().replace("import copy\n", "import copy\nimport time\n_LATE = []\n")
    late = ("        a = self.proj(attn.transpose(1, 2).reshape(b, s, h // self.tp.size))\n")
    assert late in text
    text = text.replace(late, "        if self.tp.size == 4 and self.tp.rank >= 2 and not _LATE:\n            _LATE.append(1)\n"
                              f"            time.sleep({late_s})\n" + late)
    launch_timeout_s = 2
    verdict = grade_answer("q18", text, reference, tmp_path, timeout_s=launch_timeout_s)
    said = " ".join(" ".join(verdict["messages"]).split())
    assert late_s > launch_timeout_s         # late past the launch's own timeout either way
    if late_s < launch_timeout_s * COLLECTIVE_TIMEOUT_FACTOR:
        assert verdict["fraction"] == 1, said
        return
    assert verdict["fraction"] < 1, said
    assert "waited in all_reduce over ranks [0, 1, 2, 3] until the timeout" in said, said
    assert "will not join" not in said, said


def test_an_answer_that_raises_on_some_ranks_is_named_before_the_deadlock_it_leaves(reference, tmp_path, no_leftovers):
    """Issue 41's rule, one cause with its consequences under it: a block whose streams were written for two ranks
    raises IndexError on ranks 2 and 3 at t = 4 (the part's exception is kept as an observation and the ranks go
    on to the case's end), while ranks 0 and 1 wait in the all-reduce that 2 and 3 never reach. The report names
    the IndexError and its line first; the deadlock is what it caused, never "an `if` on the rank"."""
    from pathlib import Path

    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from lab_src.harness.limits import GRADING_CASE_DEADLINE_S, GRADING_RECV_TIMEOUT_S
    from lab_src.harness.runner import run_cases
    from lab_src.judge.failures import case_problems
    text = Path(reference["q18"]).read_text()
    right = "self.own = dropout.stream(block.seed, block.name, shard=tp.rank)"
    assert right in text
    path = tmp_path / "q18_tp_block.py"
    path.write_text(text.replace(right, "self.own = [dropout.stream(block.seed, block.name, shard=j) "
                                        "for j in range(2)][tp.rank]"))
    ctx = Context(student={**reference, "q18": str(path)}, reference=reference)
    case = next(c for c in hidden_tests("q18").cases(ctx) if c.label == "t = 4, float64, seed 11")
    run = run_cases([case], tmp_path / "run", case_deadline_s=GRADING_CASE_DEADLINE_S,
                    timeout_s=GRADING_RECV_TIMEOUT_S)
    problems = case_problems(run.outcomes[0])
    causes = [p for p in problems if not p.consequence]
    assert [p.rank for p in causes] == [2, 3], problems
    assert all("raised IndexError" in p.message and "q18_tp_block.py line" in p.message for p in causes), problems
    assert problems[-1].consequence and "never joined" in problems[-1].message, problems
    assert "an `if` on the rank" not in " ".join(p.message for p in problems)

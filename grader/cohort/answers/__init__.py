"""The sample cohort's answers: `answer(name)` is the source of a qNN answer cell (or of a cell a student adds).

Most are a reference answer with one realistic mistake in it, declared as that edit in ../mistakes.py and
built from the reference answer in solutions/ each time (`answer("q16_no_last_w")`: q16's reference without
its last W's). The files here are the answers that are not such an edit, whole:

- kernel_patches.py: no answer at all, but a cell that a cheating student adds before the answers (it patches
  subprocess, assert_close and the checks);
- attacks on the grader, programs of their own rather than a misconception (they keep a copy of the answer
  they hide in, as the student handed them in): q02_kill_fork_server.py (kills the fork server),
  q05_fill_disk.py (writes 1.5 GB), q06_escape.py (tries every way out of the sandbox), q08_borrow.py (runs
  another file's afab_step), q08_rebuilt_from_seed.py and q12_forged_events.py (forge the records the
  grader judges by);
- answers written in a way of their own, not an edit of the reference: q02_assert.py (asserts), q05_numpy_ints.py
  (numpy), q05_wrong_signature.py, q08_whole_model.py (no pipeline at all), q08_one_f_one_b.py and
  q12_afab_order.py (the other exercise's schedule), q15_contiguous.py (chunks dealt out contiguously,
  rewritten around that), and q14_per_parameter.py, a right answer (one all-reduce per parameter) that
  q14's mistakes are edits of (`q14_answer` below, and q14_summed, q14_no_tied).

students.py says who hands in which; the tests grade the same answers, and a few more of the same kind that
no student of the cohort hands in (q08_no_requires_grad, q11_float32, ...).

The files are read as text and run only inside a student's submission: never import them (q06_escape.py
tries to break out of the grading sandbox the moment it runs).
"""
from __future__ import annotations

from pathlib import Path

from ...reference import reference_text
from ..mistakes import MISTAKES, replaced

FOLDER = Path(__file__).resolve().parent


def answer(name: str) -> str:
    """The source of answer `name`, as the answer cell holds it (ending with a newline): the mistake `name` of
    mistakes.py made in its reference answer, or answers/`name`.py."""
    if name in MISTAKES:
        mistake = MISTAKES[name]
        return mistake.text(answer(mistake.base) if mistake.base else reference_text(mistake.qid), name)
    path = FOLDER / f"{name}.py"
    if name.startswith("_") or not path.is_file():
        raise KeyError(f"no cohort answer {name!r} in {FOLDER} or grader/cohort/mistakes.py")
    return path.read_text()


def names() -> list[str]:
    """Every answer's name: the mistakes' and the files'."""
    return sorted([*MISTAKES, *(p.stem for p in FOLDER.glob("*.py") if not p.name.startswith("_"))])


# the parts of q14_per_parameter.py that a q14 answer may write differently: {part: (its place, as written)}
Q14_PARTS = {
    "dp_set": ("dp_sets = [grid.new_group({})", "[d * pp + p for d in range(dp)]"),
    "stage_cfg": ("PipelineStage({},", "cfg"),
    "loader": ("data = iter({})", "make_dataloader(cfg, mbs, dp_rank=dp_rank)"),
    "tied_reduce": ("{}", 'grid.all_reduce(stage.tied_embedding.grad, tied[dp_rank], "tied")'),
    "dp_reduce": ("{}", 'grid.all_reduce(p.grad, dp_sets[pp_rank], "dp", op="avg")'),
}


def q14_answer(**wrong: str) -> str:
    """A right q14 answer (q14_per_parameter.py) with the parts named in `wrong` written as given: the realistic
    q14 mistakes tests/test_q14_dp_pp_step.py grades beside the cohort's two (q14_summed, q14_no_tied)."""
    edits = [(Q14_PARTS[part][0].format(Q14_PARTS[part][1]), Q14_PARTS[part][0].format(new))
             for part, new in wrong.items()]
    return replaced(answer("q14_per_parameter"), edits, f"q14_answer({', '.join(wrong)})")

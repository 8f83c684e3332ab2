"""The sample cohort's answers, one file each: `qNN_<mistake>.py` is the source of a qNN answer cell (the
reference with that mistake in it, or a student's own way of writing it); `kernel_patches.py` is a whole
cell a student adds. students.py says who hands in which; the tests grade the same files, and a few more
answers of the same kind that no student of the cohort hands in (q08_no_requires_grad, q11_float32, ...).

The files are read as text and run only inside a student's submission: never import them (q06_escape.py
tries to break out of the grading sandbox the moment it runs).
"""
from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).resolve().parent


def answer(name: str) -> str:
    """The source of answers/`name`.py, as the answer cell holds it (ending with a newline)."""
    path = FOLDER / f"{name}.py"
    if name.startswith("_") or not path.is_file():
        raise KeyError(f"no cohort answer {name!r} in {FOLDER}")
    return path.read_text()


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
    q14 mistakes tests/test_q14_dp_pp_step.py grades beside the cohort's two (q14_summed.py, q14_no_tied.py)."""
    text = answer("q14_per_parameter")
    for part, new in wrong.items():
        place, right = Q14_PARTS[part]
        assert text.count(place.format(right)) == 1, place.format(right)
        text = text.replace(place.format(right), place.format(new))
    return text

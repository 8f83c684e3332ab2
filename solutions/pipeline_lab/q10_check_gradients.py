# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Q10 · Does each stage hold the baseline's gradients?
#
# *Exercise q10 of the pipeline-parallelism lab · 10 points*
#
# Outputs can match while gradients are wrong: a loss scaled by the wrong factor, or gradients that never
# reached the first stages, do not change the forward pass at all. So check every gradient, on every
# stage.
#
# Each stage holds only its own layers. `stage.named_parameters()` uses the full model's names
# (`blocks.5.up.weight`), so a stage's parameter can be found in the baseline by name. Compare only what
# this stage owns; the baseline has entries for every layer of the model.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q10`
# is yours: running it defines your function here *and* saves it to `answers/q10_check_gradients.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `check_gradients(stage, baseline_grads)` where `baseline_grads` maps parameter names to the
# baseline's gradients:
#
# - for every parameter of `stage`, compare its `.grad` with the baseline's using
#   `torch.testing.assert_close`;
# - a parameter without a gradient (`.grad is None`) is an error too: raise `AssertionError` with a
#   message that names it;
# - return the list of names you checked.

# %% nbgrader={"grade": false, "grade_id": "q10_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q10
import torch


def check_gradients(stage, baseline_grads):
    """Compare the gradient of every parameter this stage owns with the baseline's."""
    ### BEGIN SOLUTION
    checked = []
    for name, param in stage.named_parameters():
        if param.grad is None:
            raise AssertionError(f"stage {stage.pp_rank}: {name} has no gradient")
        torch.testing.assert_close(param.grad, baseline_grads[name], msg=lambda m: f"{name}: {m}")
        checked.append(name)
    return checked
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Your Q8 step runs on four `torchrun` ranks; each rank then calls your `check_gradients` three times: on
# its real gradients (must pass and name exactly the parameters the stage owns), against a baseline with
# one gradient changed, and with one of its gradients removed (both must raise `AssertionError`).

# %%
report = check("q10")

# %% nbgrader={"grade": true, "grade_id": "q10_hidden", "locked": true, "schema_version": 3, "solution": false, "task": false, "points": 10}
# Hidden tests of q10 (10 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q10")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q10")
### END HIDDEN TESTS

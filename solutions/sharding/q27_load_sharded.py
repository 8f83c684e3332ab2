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
# # Q27 · A checkpoint of the sharded training state that loads on another number of ranks
#
# *Exercise q27 of the pipeline-parallelism lab · 20 points*
#
# After q21, no rank holds the whole training state: rank r of n keeps AdamW's two moments for its shard of the
# flat parameters only. A checkpoint of that state should not gather it onto one rank first (that rank would need
# the memory q21 saved), and it should not be written n times either. So each rank writes its own shard. That
# creates the real difficulty: the job that resumes rarely runs on the same number of ranks. A node fails, or the
# scheduler gives you more GPUs. The m new ranks have **other shards** than the n old ones, because
# `torch.tensor_split` cuts N elements differently over m. New rank j needs a slice of one old rank's file, or
# slices of two.
#
# The figure shows a state of N = 1,000,000 elements saved on 4 ranks and loaded on 3. Above are the old shards,
# one file each. Below are the new shards. Which old files does each new shard need, and how much of each? The same
# picture comes back after your check with the answer drawn in.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.topics.checkpoint.figure import reshard_figure

reshard_figure(total=1_000_000, old=4, new=3, slices=False)

# %% [markdown]
# ## Predict first
#
# The checkpoint holds three tensors of N = 1,000,000 float32 elements: the parameters, `exp_avg` and
# `exp_avg_sq`. It was saved on 4 ranks and is loaded on 3. For **new rank 1**: **how many bytes must it read**
# (its slices of the three tensors, no metadata: `"bytes_rank1"`)? **How many old ranks' files does it open**
# (`"files_rank1"`)? And **how many bytes would it read if it read each of those files whole**
# (`"whole_files_rank1"`)? Write the three numbers in `predicted_reads()` before you write the load, as
#
#     return {"bytes_rank1": ..., "files_rank1": ..., "whole_files_rank1": ...}
#
# They are graded and must be right within half a percent. The check prints each number, right or wrong, beside the
# figure it is judged against.
#
# <details><summary><b>Hint</b>: where the shards begin (open it if you are stuck)</summary>
#
# `torch.tensor_split` cuts N into k shards of N // k elements, and gives the first N % k of them one element more.
# Write down where new shard 1 begins and ends, then where each old shard does. The files it opens are those whose
# ranges meet its range.
# </details>

# %% [markdown]
# ## Your task
#
# Write two functions in the answer cell.
#
# **`save_sharded(params, state, dp, folder)`** is called by every rank of the n ranks of `dp` at once, after q21's
# steps. It gets the model's parameters (whole, as q21 keeps them), q21's `state` of this rank
# (`{"step", "exp_avg", "exp_avg_sq"}`, the moments of shard `dp.rank` of the flat parameters) and `folder`, a
# `pathlib.Path` that every rank sees.
#
# - Each rank writes **only its own shard**: of the flat parameters, and of both moments. No element is written by
#   two ranks. The grader measures the folder itself. It must hold the state once (3 N e bytes for N elements of
#   e bytes each), plus at most 4 KiB of metadata per rank.
# - Each rank writes **the metadata that places its shard in the whole**: N, the shard's offset and length, the
#   dtype, which tensor is where in its files, and the step count. A load on other ranks has nothing else to go
#   on.
# - Write **raw bytes**, so that a load can read a slice without reading the rest. `torch.save` writes a zip that
#   is read whole.
#
# **`load_sharded(folder, dp)`** is called by every rank of the m ranks of `dp` (m may differ from n). It returns
# this rank's state for shard `dp.rank` of N over m: `{"step": int, "params", "exp_avg", "exp_avg_sq"}`, three 1-D
# tensors of the saved dtype.
#
# - Each returned tensor holds **exactly the saved elements** of the new shard, compared bit for bit. A load
#   moves bytes and computes nothing.
# - Each rank **reads only its slices**: from the files of the old shards its new shard overlaps, and only the
#   overlapping part, plus the metadata. The lab counts the bytes each process reads (its I/O counters:
#   `/proc/self/io`). Read with `file.seek` and `readinto`, `os.pread` or `np.fromfile(..., offset=, count=)`.
#   The counters do not see a memory map (`np.memmap`, `torch.from_file`).
# - The lab all-gathers the returned `"params"` into the model's whole parameters, hands the rest to q21's
#   `sharded_adamw_step`, and takes the next step. That step must equal the same step taken from the saved state
#   handed over in memory, bit for bit.
#
# The whole contract is in `help(lab_src.exercises.load_sharded)`. The grader saves on 4 ranks and loads on 2, 3
# and 4. It also saves on 2 and on 3 and loads on 4. Its state has N = 105,913 elements, which divide by neither 3
# nor 4, in float32 and in float64.
#
# <details><summary><b>Hint</b>: a tensor's bytes, and bytes into a tensor (open it if you are stuck)</summary>
#
# `t.contiguous().view(torch.uint8).numpy()` is a tensor's bytes, ready for `file.write`. In the other direction,
# `out[a:b].view(torch.uint8).numpy()` is a writable buffer over a slice of a tensor: `f.readinto(buffer)` fills
# it in place. Keep the three tensors one after another in one file per rank. The metadata can go in a small JSON
# file beside it.
# </details>
#
# <details><summary><b>Hint</b>: the overlap (open it if you are stuck)</summary>
#
# New rank j's range is [a, b). Old shard i covers [a_i, a_i + l_i), read from its metadata. The two overlap on
# [max(a, a_i), min(b, a_i + l_i)) when that range is not empty. In old file i, tensor k's element x lies at byte
# (k l_i + x - a_i) e.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q27_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q27
import json
from pathlib import Path

import torch


def predicted_reads():
    """N = 1,000,000 float32 elements saved on 4 ranks, loaded on 3: new rank 1's bytes, files, whole files."""
    # return {"bytes_rank1": ..., "files_rank1": ..., "whole_files_rank1": ...} with a number for each
    ### BEGIN SOLUTION
    # new shard 1 of 3: [333,334, 666,667), 333,333 elements, x 3 tensors x 4 B; old shards 1 and 2 (250,000 each)
    return {"bytes_rank1": 3_999_996, "files_rank1": 2, "whole_files_rank1": 6_000_000}
    ### END SOLUTION


def save_sharded(params, state, dp, folder):
    ### BEGIN SOLUTION
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    sizes = [s.numel() for s in torch.tensor_split(flat, dp.size)]
    offset = sum(sizes[:dp.rank])
    shards = {"params": flat[offset:offset + sizes[dp.rank]], "exp_avg": state["exp_avg"],
              "exp_avg_sq": state["exp_avg_sq"]}
    folder = Path(folder)
    with open(folder / f"shard{dp.rank}.bin", "wb") as f:      # the tensors one after another, as listed
        for t in shards.values():
            f.write(t.detach().contiguous().view(torch.uint8).numpy())
    meta = {"total": flat.numel(), "offset": offset, "length": sizes[dp.rank], "dtype": str(flat.dtype),
            "tensors": list(shards), "step": int(state["step"]), "file": f"shard{dp.rank}.bin"}
    (folder / f"shard{dp.rank}.json").write_text(json.dumps(meta))
    ### END SOLUTION


def load_sharded(folder, dp):
    ### BEGIN SOLUTION
    folder = Path(folder)
    metas = sorted((json.loads(p.read_text()) for p in folder.glob("shard*.json")), key=lambda m: m["offset"])
    total, dtype = metas[0]["total"], getattr(torch, metas[0]["dtype"].split(".")[-1])
    base, extra = divmod(total, dp.size)
    start = dp.rank * base + min(dp.rank, extra)
    end = start + base + (1 if dp.rank < extra else 0)
    out = {name: torch.empty(end - start, dtype=dtype) for name in metas[0]["tensors"]}
    size = dtype.itemsize
    for meta in metas:
        lo, hi = max(start, meta["offset"]), min(end, meta["offset"] + meta["length"])
        if lo >= hi:
            continue
        with open(folder / meta["file"], "rb") as f:
            for k, name in enumerate(meta["tensors"]):
                f.seek((k * meta["length"] + lo - meta["offset"]) * size)
                f.readinto(out[name][lo - start:hi - start].view(torch.uint8).numpy())
    return {"step": metas[0]["step"], **out}
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check trains the lab's model for two of q21's steps on 4 ranks, saves the state, and loads it on 3. It then
# saves on 2 and loads on 3, in float64. Each model has a parameter count that divides by neither. Per rank it
# prints the bytes your save wrote and your load read, beside the shard's and the slices'. It prints the bytes on
# disk beside the state's, whether the loaded state is the saved one bit for bit, and whether the next step equals
# the one taken from the state handed over in memory. Then it prints your prediction.

# %%
report = check("q27")

# %% [markdown]
# ## What your load did
#
# The first case again, with what each new rank's process read written beside its slices and beside the old
# files it opens, read whole. How close is your load to its slices? What would a load that reads every file whole
# cost on 64 ranks?

# %%
from lab_src.checks.q27_load_sharded import reads_figure

reads_figure(report)

# %% nbgrader={"grade": true, "grade_id": "q27_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q27 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q27")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q27")
### END HIDDEN TESTS

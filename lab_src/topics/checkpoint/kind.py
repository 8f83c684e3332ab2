"""Rank side of q27 (save_sharded and load_sharded): a checkpoint of q21's sharded training state, saved on n ranks and
loaded on m (the case runs on max(n, m) ranks; ranks 0..n-1 save, ranks 0..m-1 load).

    1. ranks 0..n-1 (a data-parallel group of n): the lab's model, whole on every rank (q21 keeps the parameters
       whole), `steps` steps: each replica's loss on its rows of one global batch, its backward, q21's
       `sharded_adamw_step` (the reference's in grading); then the answer's `save_sharded(params, state, dp, folder)`;
       then one step more in memory: the uninterrupted run
    2. every rank: the lab hands the saved shards over in memory (an all-gather of its own), so that each loading
       rank holds the state it should load; where a saving rank's answer raised (it left the case), the others end
       their part here instead, since it would never join that all-gather
    3. ranks 0..m-1 (a data-parallel group of m): a model built afresh (its parameters are the initial ones), the
       answer's `load_sharded(folder, dp)`; then two steps from there, each the replica's loss on its rows, its
       backward and q21's step: from the state handed over in memory (the parameters written in, the moments of the
       shard and the step), and from what load_sharded returned (the parameters gathered from the returned shards'
       'params' by the lab, the rest handed to q21's step)

Recorded (plain values, never a verdict): what each saving rank held when save_sharded was called, the bytes its
process wrote during the call (/proc/self/io `wchar`), the uninterrupted step's loss and parameters, what each loading
rank's load returned, the bytes its process read during the call (`rchar`: what read() and its kin returned; a memory
map is not counted) and the two continued steps' losses and parameters. The judge measures the folder itself. The
kind is `wire`: around each call the rank stops at a fence (harness/fence.py) until the launching process has read
its I/O counters from outside it (harness/wire.py `WireCount.io_between`); the judge takes those counts where they
were read, and the rank's own record only where no watch ran.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import torch

from lab_src import answers, exercises
from lab_src.comm import collectives as coll
from lab_src.comm.mesh import Mesh
from lab_src.harness import fence, observe
from lab_src.harness.wire import process_io
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline.data import make_dataloader
from lab_src.pipeline.model import build_model
from lab_src.topics.checkpoint.records import FENCES, TENSORS, shard_bounds

FOLDER_PREFIX = "checkpoint-c"


class DataParallelGroup:
    """What the answer is given of its data-parallel group: `group` (a process group), `size` (n), `rank` (this
    rank's position in it, 0..n-1), `ranks` (the group's global ranks, in position order). q21's own."""

    def __init__(self, group, ranks: list[int], rank: int):
        self.group, self.ranks = group, list(ranks)
        self.size, self.rank = len(self.ranks), self.ranks.index(rank)

    def __repr__(self) -> str:
        return f"DataParallelGroup(size={self.size}, rank={self.rank}, ranks={self.ranks})"


def io_counters() -> dict[str, int]:
    """This process's I/O counters (/proc/self/io): rchar, wchar (bytes read() and write() passed), syscr, syscw;
    {} where they cannot be read.

    In the grading sandbox a rank runs under a uid it changed to (setpriv), which leaves the process not dumpable:
    its /proc/self files then belong to root and /proc/self/io cannot be read (the first grading of the cohort read
    nothing there). A process may make itself dumpable again (prctl PR_SET_DUMPABLE), which gives /proc/self back to
    its own uid; the sandbox's processes are all the same student's, so this opens nothing they could not reach."""
    counters = process_io("self")
    if not counters and os.access("/proc/self/io", os.F_OK) and _make_dumpable():
        counters = process_io("self")
    return counters


def _make_dumpable() -> bool:
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0) == 0     # PR_SET_DUMPABLE, 1
    except (OSError, AttributeError):
        return False


def save_function():
    """save_sharded, defined in the answer cell beside load_sharded."""
    qid = exercises.load_sharded.exercise.id
    fn = answers.load(qid)
    if fn is None:
        raise answers.StubCalled(answers.stub_message(qid))
    save = getattr(fn, "__globals__", {}).get("save_sharded")
    if not callable(save):
        raise answers.AnswerError(f"{qid}: your answer cell must define save_sharded beside load_sharded (see the "
                                  f"contract of load_sharded)")
    qid_notebook = exercises.load_sharded.exercise.notebook

    def called(*args, **kwargs):
        try:
            return save(*args, **kwargs)
        except NotImplementedError as e:
            if str(e):
                raise
            raise answers.StubCalled(f"{qid} save_sharded() is still the stub from the release (raise "
                                     f"NotImplementedError()): replace it with your code in {qid_notebook}") from None
    return called


def flat_of(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def write_flat(params, flat: torch.Tensor) -> None:
    """The flat vector's pieces into the parameters, in order."""
    with torch.no_grad():
        for p, piece in zip(params, flat.split([p.numel() for p in params])):
            p.copy_(piece.reshape(p.shape))


def _clone(t):
    return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else observe.plain(t)


def gather_flat(shard: torch.Tensor, group, size: int) -> torch.Tensor:
    """The lab's all-gather (unrecorded: not the answer's traffic) of every rank's 1-D shard, whatever their lengths,
    concatenated in the group's order."""
    gather = coll.lab("all_gather")
    length = torch.tensor([shard.numel()], dtype=torch.long)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    gather(lengths, length, group=group)
    lengths = [int(x) for x in lengths]
    longest = max(lengths + [1])
    padded = torch.zeros(longest, dtype=shard.dtype)
    padded[:shard.numel()] = shard.reshape(-1)
    pieces = [torch.empty_like(padded) for _ in range(size)]
    gather(pieces, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(pieces, lengths)])


def rows_of(batch: torch.Tensor, replicas: int, index: int) -> torch.Tensor:
    """Replica `index`'s rows of the global batch (equal shares: the global batch divides by n and by m)."""
    if batch.shape[0] % replicas:
        raise ValueError(f"a q27 case's global batch ({batch.shape[0]}) divides by its n and m ({replicas})")
    return batch.tensor_split(replicas)[index]


def one_step(model, params, rows, dp, state, lr) -> float:
    """A replica's loss on its rows, its backward, q21's sharded AdamW step; the loss."""
    for p in params:
        p.grad = None
    loss = model(rows).mean()
    loss.backward()
    with torch.no_grad():
        exercises.sharded_adamw_step(params, dp, state, lr)
    return float(loss.detach())


def run(case: Case, ctx, group, tracer, obs) -> None:
    settings = settings_of(case)
    obs["part"] = "setup"
    try:
        with coll.bounded(range(case.stages)):
            mesh = Mesh.of(case, ctx, whole=group)
            mesh.add("save", [list(range(settings.save))]).add("load", [list(range(settings.load))])
            try:
                _run(case, ctx, settings, mesh, group, obs)
                observe.finish_messages(None, group, tracer)
            finally:
                mesh.destroy()
    finally:
        observe.record_instrumentation(obs, tracer)


def _run(case, ctx, settings, mesh, group, obs) -> None:
    cfg = case.config
    rank, n, m = ctx.rank, settings.save, settings.load
    save = save_function()
    folder = Path.cwd() / f"{FOLDER_PREFIX}{case.index}"
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        obs["folder"] = str(folder)
    batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
    observe.barrier(group)

    # 1. train on n ranks, save, and go on in memory
    saved = None
    if rank < n:
        model = build_model(cfg, ctx.device)
        params = list(model.parameters())
        total = sum(p.numel() for p in params)
        obs["elements"], obs["element_size"] = total, params[0].element_size()
        save_group, save_ranks = mesh.entry("save")
        dp = DataParallelGroup(save_group, save_ranks, rank)
        rows = rows_of(batch, n, dp.rank)
        state: dict = {}
        for k in range(settings.steps):
            obs["part"] = f"q21's step {k} before the save"
            one_step(model, params, rows, dp, state, settings.lr)
        start, end = shard_bounds(total, n, dp.rank)
        saved = {"step": state.get("step"), "params": flat_of(params)[start:end].clone(),
                 "exp_avg": _clone(state.get("exp_avg")), "exp_avg_sq": _clone(state.get("exp_avg_sq"))}
        obs["saved"] = saved
        obs["part"] = "save"
        before = io_counters()              # (which makes the process dumpable: its counters readable from outside)
        fence.here(FENCES["save"][0])       # the launching process reads this process's I/O counters here ...
        t0 = time.perf_counter()
        save(params, state, dp, folder)
        obs["save_seconds"] = time.perf_counter() - t0
        fence.here(FENCES["save"][1])       # ... and here (judge.py takes those before the record below)
        after = io_counters()
        if "wchar" in before and "wchar" in after:
            obs["written"] = after["wchar"] - before["wchar"]
        obs["part"] = "the uninterrupted step after the save"
        loss = one_step(model, params, rows, dp, state, settings.lr)
        obs["uninterrupted"] = {"loss": loss, "params": flat_of(params).clone()}
    left = observe.barrier(group)
    if left:
        # a saving rank's answer raised (its error is the case's verdict): the handover below is a collective of
        # every rank, which the ranks that left would never join, and which the deadlock watch does not see
        obs["part"] = f"skipped: rank{'s' if len(left) > 1 else ''} {', '.join(map(str, left))} left the case"
        return
    if rank == 0:
        obs["listing"] = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
                          if p.is_file()}

    # 2. the saved state, handed over in memory by the lab (every rank of the case takes part)
    obs["part"] = "the lab's handover"
    dtype = cfg.torch_dtype
    whole = {}
    for name in TENSORS:
        mine = saved[name].to(dtype).reshape(-1) if saved is not None and isinstance(saved.get(name), torch.Tensor) \
            else torch.zeros(0, dtype=dtype)
        whole[name] = gather_flat(mine, group, case.stages)
    step = torch.tensor([int(saved["step"]) if saved is not None and isinstance(saved.get("step"), int) else -1])
    coll.lab("broadcast")(step, src=0, group=group)

    # 3. load on m ranks, and go on twice: from the state handed over, and from what the load returned
    if rank < m:
        model = build_model(cfg, ctx.device)
        params = list(model.parameters())
        total = sum(p.numel() for p in params)
        obs["elements"], obs["element_size"] = total, params[0].element_size()
        fresh = flat_of(params).clone()
        load_group, load_ranks = mesh.entry("load")
        dp = DataParallelGroup(load_group, load_ranks, rank)
        rows = rows_of(batch, m, dp.rank)
        obs["part"] = "load"
        before = io_counters()
        fence.here(FENCES["load"][0])
        t0 = time.perf_counter()
        loaded = exercises.load_sharded(folder, dp)
        obs["load_seconds"] = time.perf_counter() - t0
        fence.here(FENCES["load"][1])
        after = io_counters()
        if "rchar" in before and "rchar" in after:      # else not counted (judge.py says so)
            obs["reads"] = after["rchar"] - before["rchar"]
            obs["read_calls"] = after["syscr"] - before["syscr"]
        if isinstance(loaded, dict):
            obs["loaded"] = {**{str(k): _clone(v) for k, v in loaded.items()},
                             "types": {str(k): type(v).__name__ for k, v in loaded.items()}}
        else:
            obs["loaded"] = {"returned": repr(loaded)[:200]}

        obs["part"] = "the step from the state handed over in memory"
        start, end = shard_bounds(total, m, dp.rank)
        write_flat(params, whole["params"])
        handed_state = {"step": int(step), "exp_avg": whole["exp_avg"][start:end].clone(),
                        "exp_avg_sq": whole["exp_avg_sq"][start:end].clone()}
        loss = one_step(model, params, rows, dp, handed_state, settings.lr)
        obs["handed"] = {"loss": loss, "params": flat_of(params).clone()}

        obs["part"] = "the step from what load_sharded returned"
        got = loaded if isinstance(loaded, dict) else {}
        shard = got.get("params")
        # every loading rank takes part in the gather, whatever its own load returned
        has = torch.tensor([1 if isinstance(shard, torch.Tensor) else 0])
        coll.lab("all_reduce")(has, op=torch.distributed.ReduceOp.MIN, group=load_group)
        continued: dict = {}
        if int(has):
            flat = gather_flat(shard.detach().to(dtype).reshape(-1), load_group, m)
            if flat.numel() == total:
                write_flat(params, flat)
                continued["params_from"] = "load"
            else:
                write_flat(params, fresh)
                continued["params_from"] = f"the returned shards add up to {flat.numel():,} elements, not {total:,}"
        else:
            write_flat(params, fresh)
            continued["params_from"] = "fresh"
        rest = {k: v for k, v in got.items() if k != "params"}
        # q21's step is a ring over the m ranks: a state it cannot step on some ranks only would leave the others
        # waiting, so every loading rank first says whether its own is one q21's step takes
        unusable = usable_problem(rest, end - start, dtype)
        bad = torch.tensor([1 if unusable else 0])
        coll.lab("all_reduce")(bad, group=load_group)
        if unusable:
            continued["skipped"] = unusable
        elif int(bad):
            continued["skipped"] = "another loading rank's state was not one q21's step can take"
        else:
            try:
                loss = one_step(model, params, rows, dp, rest, settings.lr)
                continued.update(loss=loss, params=flat_of(params).clone())
            except (answers.StubCalled, answers.AnswerError):
                raise
            except Exception as e:  # noqa: BLE001 - q21's step on the loaded state raising is an observation
                continued["raised"] = f"{type(e).__name__}: {e}"[:400]
        obs["continued"] = continued
    obs["part"] = "done"


def usable_problem(state: dict, length: int, dtype) -> str | None:
    """Why q21's step cannot take `state` (the rest of what load_sharded returned) on this rank, or None."""
    for name in ("exp_avg", "exp_avg_sq"):
        t = state.get(name)
        if not isinstance(t, torch.Tensor):
            return f"its {name!r} is {type(t).__name__}, not a tensor"
        if t.reshape(-1).shape[0] != length or t.dtype != dtype:
            return (f"its {name!r} has {t.numel():,} elements of {t.dtype}; this rank's shard has {length:,} of "
                    f"{dtype}")
    step = state.get("step")
    try:
        int(step)
    except (TypeError, ValueError, RuntimeError):
        return f"its 'step' is {step!r}, not a whole number"
    return None

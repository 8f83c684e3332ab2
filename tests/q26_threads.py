"""q26's ranks simulated by threads of this process (no torch.distributed): the kind's steps (topics/mixed_precision/
kind.py, the same order of calls) with a data-parallel group whose collectives meet at a barrier, so that the judge
can be tested on the reference and on wrong answers without launching processes. The gathers, reduce-scatters and
all-reduces are noted as MixedGroup notes them (bytes and elements of the tensors that travel)."""
from __future__ import annotations

import threading
import types

import torch

from lab_src.harness.case import Case
from lab_src.topics.mixed_precision import model as lab_model
from lab_src.topics.mixed_precision.records import MixedSettings
from lab_src.topics.mixed_precision.records import shard_bounds


class _Meeting:
    def __init__(self, n: int):
        self.n, self.slots, self.barrier = n, [None] * n, threading.Barrier(n, timeout=60)

    def exchange(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = t.detach().clone()
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got


class ThreadGroup:
    def __init__(self, meeting: _Meeting, rank: int):
        self.meeting, self.size, self.rank = meeting, meeting.n, rank
        self.by_length: dict[int, tuple[str, int]] = {}
        self.gathers, self.scatters, self.reduces = [], [], []

    def all_gather(self, shard):
        layer, total = self.by_length[shard.numel()]
        parts = self.meeting.exchange(self.rank, shard)
        full = torch.cat(parts)
        self.gathers.append([layer, full.numel() * full.element_size(), full.numel()])
        return full

    def reduce_scatter(self, flat):
        parts = self.meeting.exchange(self.rank, flat)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        start, end = shard_bounds(flat.numel(), self.size, self.rank)
        self.scatters.append([flat.numel() * flat.element_size(), flat.numel()])
        return total[start:end].clone()

    def all_reduce(self, t):
        parts = self.meeting.exchange(self.rank, t)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        t.detach().copy_(total.view_as(t))
        self.reduces.append([t.numel() * t.element_size(), t.numel()])
        return t


_BUILD = threading.Lock()


def _copy(t):
    return t.detach().float().clone() if isinstance(t, torch.Tensor) else None


def run_case(answer_text: str, cfg, n: int, settings: dict):
    """An outcome-like object of a "mixed_precision" case run by `answer_text` on n threads."""
    ns: dict = {}
    exec(compile(answer_text, "<q26 answer>", "exec"), ns)  # noqa: S102 - an answer under test
    s = MixedSettings(**settings)
    meeting = _Meeting(n)
    obs = {r: {} for r in range(n)}
    errors = []

    def rank(me: int):
        try:
            _rank(ns, cfg, s, ThreadGroup(meeting, me), obs[me])
        except BaseException as e:          # noqa: BLE001 - reported to the test
            errors.append(e)
            meeting.barrier.abort()

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        torch.set_num_threads(before)
    if errors:
        raise errors[0]
    case = Case(kind="mixed_precision", qid="q26", config=cfg, stages=n, settings=dict(settings), label="threads",
                step="", schedule="")
    return types.SimpleNamespace(case=case, obs=obs, wire=None, wire_failed=True, failure=None, wire_unseen=None)  # no wire on threads


def _rank(ns, cfg, s, dp, obs):
    dtype = lab_model.DTYPES[s.dtype]
    obs["position"] = dp.rank
    layers, modules = {}, []
    with _BUILD:                  # torch's global generator, which blocks() seeds, is shared by the threads
        built = lab_model.blocks(cfg, s)
    for block in built:
        total = sum(p.numel() for p in block.parameters())
        start, end = shard_bounds(total, dp.size, dp.rank)
        dp.by_length.setdefault(end - start, (block.name, total))
        modules.append(ns["mixed_precision_layer"](block, dp, dtype))
        layers[block.name] = [total, end - start]
    obs["layers_flat"] = layers
    shards = [m.shard for m in modules]
    optimizer = torch.optim.SGD(shards, lr=s.lr)
    scaler = ns["LossScaler"](dp, growth_interval=s.growth_interval) if s.scaled else None
    obs["steps"] = []
    for k in range(s.steps):
        optimizer.zero_grad(set_to_none=True)
        dp.gathers, dp.scatters, dp.reduces = [], [], []
        record = {"before": [_copy(x) for x in shards], "shard_dtype": str(shards[0].dtype).replace("torch.", "")}
        x, target = lab_model.batch(cfg, s, k, dp.rank)
        h = x
        for m in modules:
            h = m(h)
        loss = lab_model.loss_of(h, target)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        record["grad"] = [_copy(x.grad) for x in shards]
        record["grad_dtype"] = str(shards[0].grad.dtype).replace("torch.", "")
        if k == s.inject_step and dp.rank == s.inject_rank:
            with torch.no_grad():
                shards[0].grad.view(-1)[0] = float("inf")
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
            record["scale"] = float(scaler.get_scale())
        else:
            optimizer.step()
            record["scale"] = None
        record.update(after=[_copy(x) for x in shards], loss=float(loss.detach()), gathers=list(dp.gathers),
                      scatters=list(dp.scatters), reduces=list(dp.reduces))
        obs["steps"].append(record)

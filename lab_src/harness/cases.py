"""What one rank does for one check case, by kind. Each function fills `obs` (a dict of plain values and
tensors) with what it observed; it never decides pass or fail. The process that launched the run
reads the observations and judges them, so nothing a rank does can write a verdict.

Kinds:
    pipeline  the step function the case names (q08's afab_step, ...) with its comparisons' raw material
    comm      the four point-to-point operations (q07) in the order of the case's schedule, carrying
              labelled dummy tensors, no compute
    layout    each rank's stage: micro-batch size (q02), activation shape (q03), layers (q05), and
              whether it needs the dataloader (q06), tried by feeding the stage accordingly
    shapes    the activation shape (q03) tried on the embedding, a block and the head
    baseline  the unsharded baseline (q04), run on every rank
    units     exercise functions called on given arguments (rank 0 only)
    seeds     what the seed does to weights on different ranks (q01 demo)
    grid      the student's step on a data x pipeline grid of all the case's ranks (q14, grid_case.py)
    p2p       q11's raw torch.distributed operations in the order of the case's schedule (harness/p2p_case.py)
    interleaved  an interleaved step (q15) on a rank holding several model chunks (harness/interleaved.py)
    train     the student's training loop around the step, on the digits (q13; harness/train.py)

A pipeline case also counts, per rank, the activation memory its step holds (harness/memory.py): every
event carries it, and obs["memory"] has the peak, beside the process's peak resident set size so far
(meaningful for the first or largest case of a launch).
"""
from __future__ import annotations

import operator

import torch
import torch.distributed as dist

from lab_src import exercises
from lab_src.harness import interleaved
from lab_src.harness.case import Case
from lab_src.harness.grid_case import run_grid
from lab_src.harness.memory import counting, peak_rss_bytes
from lab_src.harness.p2p_case import run_p2p
from lab_src.harness.train import run_train
from lab_src.pipeline import data, model, trace, waiting
from lab_src.pipeline.baseline import compute_baseline, load_baseline
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.schedules import schedule
from lab_src.pipeline.stage import PipelineStage
from lab_src.registry import DEFAULT_STEP, EXERCISES


def attempt(fn, *args, **kwargs) -> dict:
    """Call `fn`, and describe what happened in plain values."""
    try:
        return {"outcome": "returned", "value": plain(fn(*args, **kwargs))}
    except Exception as e:  # noqa: BLE001 - every failure of student code is an observation
        return {"outcome": "raised", "type": type(e).__name__, "message": str(e)[:800]}


def plain(v):
    """A value reduced to what `torch.load(weights_only=True)` reads back: no arbitrary objects.
    Int-like values (numpy integers, anything with __index__) become ints; numpy bools become bools."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if type(v).__name__ in ("bool_", "bool8"):
        return bool(v)
    if hasattr(v, "__index__") and not isinstance(v, torch.Tensor):
        return operator.index(v)
    if isinstance(v, torch.Size):
        return [int(s) for s in v]
    if isinstance(v, torch.Tensor):
        return {"tensor_shape": list(v.shape), "dtype": str(v.dtype)}
    if isinstance(v, (list, tuple, range)):
        return [plain(x) for x in v][:10_000]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in list(v.items())[:10_000]}
    return {"object": type(v).__name__}


def decode(v):
    """Arguments travel as JSON; {"$cfg": {...}} stands for a LabConfig."""
    if isinstance(v, dict) and "$cfg" in v:
        return LabConfig.from_dict(v["$cfg"])
    if isinstance(v, list):
        return [decode(x) for x in v]
    return v


def _micro_batch_size(cfg: LabConfig) -> int:
    mbs = exercises.check_args(cfg.num_layers, cfg.num_stages, cfg.global_batch_size, cfg.num_microbatches,
                               allow_uneven_layers=not cfg.layers_divide_evenly)
    if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1:
        raise TypeError(f"q02: check_args must return the micro-batch size (an int >= 1), got {mbs!r}")
    return mbs


def _stage(cfg, rank, ctx, group, obs) -> PipelineStage:
    mbs = obs["micro_batch_size"] = _micro_batch_size(cfg)
    stage = PipelineStage(cfg, rank, cfg.num_stages, mbs, ctx.device, group)
    obs["layers"] = stage.layer_ids
    obs["activation_shape"] = list(stage.activation_shape)
    return stage


def _barrier(group) -> None:
    """A barrier of the case's ranks that the check can stop (pipeline/waiting.py)."""
    waiting.barrier(group)


def _finish_messages(stage, group, tracer) -> None:
    """The end of a rank's part of a case: it sends nothing more (journalled for the deadlock watch),
    waits until its messages are delivered (`stage`: None where there is none), then for the other ranks."""
    tracer.finished()
    if stage is not None:
        stage.flush()
    _barrier(group)


def _record_instrumentation(obs: dict, tracer) -> None:
    obs["built"] = list(model.BUILT)
    obs["ran"] = dict(model.RAN)
    obs["dataloaders"] = data.CREATED["dataloaders"]
    obs["events"] = [e.to_row() for e in tracer.events]


def run_pipeline(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    rank, probes = ctx.rank, case.probes
    try:
        stage = _stage(cfg, rank, ctx, group, obs)
        if "noop_ends" in probes:
            obs["probes"] = {"noop_ends": _probe_noop_ends(stage)}
        needs = exercises.needs_dataloader(rank, cfg.num_stages)
        obs["needs_dataloader"] = plain(needs)
        loader = data.make_dataloader(cfg, obs["micro_batch_size"]) if needs else None
        _barrier(group)
        step = exercises.API[case.step]
        with counting(stage, tracer) as saved:
            returned = step(stage, iter(loader) if loader is not None else None, cfg.num_microbatches)
        obs["memory"] = {"peak_saved_bytes": saved.peak, "peak_rss_bytes": peak_rss_bytes()}
        _finish_messages(stage, group, tracer)
        outputs, loss = _unpack_step(returned, obs)
        obs["outputs"] = outputs
        obs["loss"] = loss
        obs["grads"] = {n: (p.grad.detach().cpu().clone() if p.grad is not None else None)
                        for n, p in stage.named_parameters()}
        if case.baseline and ("check_outputs" in probes or "check_gradients" in probes):
            baseline = load_baseline(case.baseline)
            obs.setdefault("probes", {})
            if "check_outputs" in probes:
                obs["probes"]["check_outputs"] = _probe_check_outputs(stage, returned[0], baseline)
            if "check_gradients" in probes:
                obs["probes"]["check_gradients"] = _probe_check_gradients(stage, baseline)
    finally:
        _record_instrumentation(obs, tracer)


def _unpack_step(returned, obs):
    """(outputs, loss) as plain tensors/floats; a malformed return is noted, not raised."""
    try:
        outputs, loss = returned
    except (TypeError, ValueError):
        obs["returned"] = f"the step must return (outputs, loss); it returned {plain(returned)!r}"[:500]
        return None, None
    outs = None
    if isinstance(outputs, (list, tuple)) and all(isinstance(o, torch.Tensor) for o in outputs):
        outs = [o.detach().cpu().clone() for o in outputs]
    else:
        obs["returned"] = f"outputs must be a list of tensors, got {plain(outputs)!r}"[:500]
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        loss = float(loss)
    if loss is not None and not isinstance(loss, (int, float)):
        obs["returned"] = f"loss must be a float or None, got {plain(loss)!r}"[:500]
        loss = None
    return outs, (float(loss) if loss is not None else None)


def _probe_noop_ends(stage) -> dict:
    """The operations that do not apply at the ends of the pipeline must return None without messaging."""
    dummy = torch.zeros(stage.activation_shape, dtype=stage.dtype, device=stage.device)
    ops = []
    if stage.is_first_stage:
        ops += [("recv_forward", None), ("send_backward", dummy)]
    if stage.is_last_stage:
        ops += [("send_forward", dummy), ("recv_backward", None)]
    events = trace.active().events
    start, out = len(events), {}
    for op, tensor in ops:
        before = len(events)
        out[op] = attempt(exercises.pipeline_communicate, op, stage, tensor=tensor, microbatch=0)
        out[op]["messages"] = len(events) - before
    del events[start:]  # probes are not part of the schedule
    return out


def _disturb(t, where: str, sign: float):
    """A copy of `t` with one element moved by `sign` times more than its largest value: the first,
    middle or last element, so that a check reading only part of a tensor misses some of them."""
    out = t.detach().clone()
    flat = out.view(-1)
    k = {"first": 0, "middle": flat.numel() // 2, "last": flat.numel() - 1}[where]
    flat[k] += sign * (0.1 + float(out.abs().max()))
    return out


def _reversed_elements(t):
    """The same values in reverse order: equal sums, means and norms, different tensors."""
    return t.detach().reshape(-1).flip(0).reshape(t.shape).clone()


# Where a disturbance goes: every part of the data, with both signs, and changes that keep sums.
PLACES = (("first", 1.0), ("middle", -1.0), ("last", 1.0), ("first", -1.0), ("last", -1.0))


def _probe_check_outputs(stage, outputs, baseline) -> dict:
    """Run the q09 check on the true outputs, then on wrong ones: one element of the first, middle or
    last micro-batch moved up or down, two micro-batches swapped, one micro-batch's elements reversed."""
    base = baseline["output"].to(stage.device)
    result = {"true": attempt(exercises.check_outputs, outputs, base, stage)}
    if stage.is_last_stage and isinstance(outputs, list) and outputs:
        m = len(outputs)
        for (where, sign), mb in zip(PLACES, (0, m // 2, m - 1, m - 1, 0)):
            wrong = [o.detach().clone() for o in outputs]
            wrong[mb] = _disturb(wrong[mb], where, sign)
            result[f"micro-batch {mb}, {where} element {'+' if sign > 0 else '-'}"] = \
                attempt(exercises.check_outputs, wrong, base, stage)
        if m > 1:
            swapped = [o.detach().clone() for o in outputs]
            swapped[0], swapped[-1] = swapped[-1], swapped[0]
            result[f"micro-batches 0 and {m - 1} swapped"] = attempt(exercises.check_outputs, swapped, base, stage)
        flipped = [o.detach().clone() for o in outputs]
        flipped[m // 2] = _reversed_elements(flipped[m // 2])
        result[f"micro-batch {m // 2} with its elements reversed"] = attempt(exercises.check_outputs, flipped, base, stage)
    return result


def _probe_check_gradients(stage, baseline) -> dict:
    """Run the q10 check on the true gradients, then on a baseline changed in one element of the first,
    middle or last parameter (up or down), with one parameter's elements reversed, and with the first
    or the last parameter's gradient missing."""
    grads = {n: (g.to(stage.device) if g is not None else None) for n, g in baseline["grads"].items()}
    result = {"true": attempt(exercises.check_gradients, stage, grads)}
    owned = [n for n, _ in stage.named_parameters()]
    if owned:
        picks = (owned[0], owned[len(owned) // 2], owned[-1], owned[-1], owned[0])
        for (where, sign), name in zip(PLACES, picks):
            disturbed = dict(grads)
            disturbed[name] = _disturb(grads[name], where, sign)
            result[f"{name}, {where} element {'+' if sign > 0 else '-'}"] = \
                attempt(exercises.check_gradients, stage, disturbed)
        widest = max(owned, key=lambda n: grads[n].numel())
        disturbed = dict(grads)
        disturbed[widest] = _reversed_elements(grads[widest])
        result[f"{widest} with its elements reversed"] = attempt(exercises.check_gradients, stage, disturbed)
        for name in dict.fromkeys((owned[0], owned[-1])):
            param = stage.get_parameter(name)
            saved, param.grad = param.grad, None
            try:
                result[f"missing gradient of {name}"] = attempt(exercises.check_gradients, stage, grads)
            finally:
                param.grad = saved
        result["owned"] = owned
    return result


def run_comm(case: Case, ctx, group, tracer, obs) -> None:
    """Every rank calls the point-to-point operations of the case's schedule, in its order and with the
    no-ops at the ends, sending dummy tensors whose values say who sent them and for which micro-batch;
    each receive records what arrived."""
    cfg = case.config
    try:
        stage = _stage(cfg, ctx.rank, ctx, group, obs)
        obs["probes"] = {"noop_ends": _probe_noop_ends(stage)}
        _barrier(group)
        calls = []
        for step in schedule(case.schedule).messages(ctx.rank, cfg.num_stages, cfg.num_microbatches):
            op, mb = step.op.value, step.microbatch
            tensor = None
            if step.op.is_send:
                label = (1 if step.op.phase == "forward" else -1) * (1000 * (ctx.rank + 1) + mb)
                tensor = torch.full(stage.activation_shape, float(label), dtype=stage.dtype, device=stage.device)
            before = len(tracer.events)
            got = exercises.pipeline_communicate(op, stage, tensor=tensor, microbatch=mb)
            # the micro-batch each message this call sent or received was recorded with
            traced = [e.microbatch for e in tracer.events[before:]]
            calls.append([op, mb, _read_label(got), traced])
        obs["calls"] = calls
        _finish_messages(stage, group, tracer)
    finally:
        _record_instrumentation(obs, tracer)


def _read_label(value):
    """Decode a dummy tensor back to (sender rank, micro-batch, direction); describe anything else."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return {"object": type(value).__name__}
    flat = value.detach().reshape(-1)
    if flat.numel() == 0 or not torch.all(flat == flat[0]):
        return {"tensor_shape": list(value.shape), "uniform": False}
    label = int(flat[0].item())
    sign = 1 if label > 0 else -1
    label = abs(label)
    return {"from": label // 1000 - 1, "mb": label % 1000, "phase": "forward" if sign > 0 else "backward",
            "shape": list(value.shape)}


def run_layout(case: Case, ctx, group, tracer, obs) -> None:
    """Build this rank's stage; with "q06", also feed it what the answer to q06 says it gets: tokens
    from the dataloader when it needs one, else an activation from the previous stage."""
    cfg = case.config
    try:
        stage = _stage(cfg, ctx.rank, ctx, group, obs)
        obs["parameters"] = sum(p.numel() for p in stage.parameters())
        if "q06" in case.calls:
            needs = exercises.needs_dataloader(ctx.rank, cfg.num_stages)
            obs["needs_dataloader"] = plain(needs)
            if needs:
                x = next(iter(data.make_dataloader(cfg, obs["micro_batch_size"]))).to(ctx.device)
            else:
                x = torch.randn(stage.activation_shape, dtype=stage.dtype, device=ctx.device)
            obs["feed"] = attempt(stage.forward, x)
    finally:
        _record_instrumentation(obs, tracer)


def run_shapes(case: Case, ctx, group, tracer, obs) -> None:
    """Without a stage (q05 may not be written yet): rank 0 embeds a micro-batch of tokens, every other
    rank runs one block on a tensor of the answer's activation shape, and the last also runs the head."""
    cfg = case.config
    mbs = obs["micro_batch_size"] = _micro_batch_size(cfg)
    shape = obs["activation_shape"] = plain(exercises.activation_shape(cfg, mbs))
    dtype = cfg.torch_dtype
    if ctx.rank == 0:
        tokens = next(iter(data.make_dataloader(cfg, mbs)))
        obs["embed"] = attempt(model.build_piece(cfg, "embed"), tokens)
    else:
        try:
            x = torch.randn(*shape, dtype=dtype)
        except Exception:  # noqa: BLE001 - the answer's shape is not a shape at all
            obs["block"] = {"outcome": "raised", "type": "TypeError", "message": f"no tensor has the shape {shape!r}"}
            return
        obs["block"] = attempt(model.build_piece(cfg, f"blocks.{ctx.rank % cfg.num_layers}"), x)
        if ctx.rank == cfg.num_stages - 1:
            obs["head"] = attempt(model.build_piece(cfg, "head"), x)


def run_baseline(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    obs.update(compute_baseline(cfg, ctx.device))


def run_units(case: Case, ctx, group, tracer, obs) -> None:
    results = []
    for call in case.calls:
        fn = exercises.API[call["exercise"]]
        results.append(attempt(fn, *decode(call.get("args", [])), **call.get("kwargs", {})))
    obs["results"] = results


def run_seeds(case: Case, ctx, group, tracer, obs) -> None:
    """A demonstration for q01: weights made with the same seed, or a seed that depends on the rank."""
    cfg = case.config
    seed, rank = cfg.seed, ctx.rank

    def fingerprint(t: torch.Tensor) -> list[float]:
        return [round(float(x), 4) for x in t.reshape(-1)[:3]]

    torch.manual_seed(seed)
    same = torch.randn(cfg.hidden_size, cfg.hidden_size // cfg.num_stages)
    torch.manual_seed(seed + rank)
    offset = torch.randn(cfg.hidden_size, cfg.hidden_size // cfg.num_stages)
    block = model.build_piece(cfg, "blocks.3")
    # which samples a data-parallel replica reads first: a shuffle of its own, or its slice of a shared one
    samples = 4 * cfg.global_batch_size
    torch.manual_seed(seed)
    data_same = torch.randperm(samples)[:3]
    shared = torch.randperm(samples, generator=torch.Generator().manual_seed(seed))
    data_split = shared[rank::cfg.num_stages][:3]
    obs.update({"same_seed": fingerprint(same), "rank_seed": fingerprint(offset),
                "block3": fingerprint(block.qkv.weight.detach()),
                "data_same": [int(i) for i in data_same], "data_split": [int(i) for i in data_split]})


# The exercises whose functions the ranks call, by kind of case: a case must carry their answers.
CALLS = {"pipeline": ("check_args", "activation_shape", "distribute_layers", "needs_dataloader"),
         "comm": ("check_args", "activation_shape", "distribute_layers", "pipeline_communicate"),
         "layout": ("check_args", "activation_shape", "distribute_layers"),
         "shapes": ("check_args", "activation_shape"),
         "baseline": ("baseline_step",), "units": (), "seeds": (),
         "grid": ("check_args", "activation_shape", "distribute_layers", "needs_dataloader", "pipeline_communicate",
                  "afab_step"),
         "p2p": ("check_args", "activation_shape", "distribute_layers", "p2p_communicate"),
         "interleaved": ("check_args", "activation_shape", "distribute_layers", "needs_dataloader"),
         "train": ("check_args", "activation_shape", "distribute_layers")}


def exercises_called(kind: str, step: str = DEFAULT_STEP, calls=()) -> set[str]:
    """The exercises a case of `kind` calls on its ranks: those of CALLS, for a pipeline or a training run
    its step and what the step itself uses (the point-to-point operations), for a layout with "q06" the
    dataloader question. The baseline the comparisons need is computed outside, so q04 is not among them."""
    by_function = {e.function: e.id for e in EXERCISES.values() if e.function}
    called = {by_function[f] for f in CALLS[kind]}
    if kind in ("pipeline", "train"):
        called |= {step, *EXERCISES[step].needs} - {by_function["baseline_step"]}
    if kind == "layout" and "q06" in calls:
        called.add(by_function["needs_dataloader"])
    return called


KINDS = {"pipeline": run_pipeline, "comm": run_comm, "layout": run_layout, "shapes": run_shapes,
         "baseline": run_baseline, "units": run_units, "seeds": run_seeds, "p2p": run_p2p, "train": run_train,
         "interleaved": lambda *args: interleaved.run_interleaved(*args)}
KINDS["grid"] = run_grid        # q14: the data x pipeline grid (harness/grid_case.py)

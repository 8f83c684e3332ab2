"""The ideal step of a schedule: what the schedule alone implies, from a simple cost model.

Every layer costs the same forward time and the same backward time; a stage's compute is its number
of layers times that. A message of b bytes keeps its sender busy for b / bandwidth and arrives
`latency` later (a receive waits for it). Nothing else takes time: no Python overhead, no other
process competing for the CPU. Comparing this with the measured run shows how much of the measured
bubble the schedule explains, and how much comes from everything else.

    events = ideal_events(p=4, m=4, activation_bytes=4096)                 # default costs
    events = ideal_events(4, 4, calibrate(measured, 4), activation_bytes=4096)  # compute of a real run
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from lab_src.pipeline import schedules
from lab_src.pipeline.schedules import Schedule
from lab_src.pipeline.trace import Event


@dataclass(frozen=True)
class CostModel:
    forward_s_per_layer: float = 0.5e-3     # a small transformer block on one CPU core
    backward_s_per_layer: float = 1.0e-3    # backward costs about twice the forward
    latency_s: float = 100e-6               # gloo over loopback TCP: a message takes ~0.1 ms
    bandwidth_bytes_per_s: float = 1e9      # ~1 GB/s between processes on one machine
    input_share: float = 0.5                # of a split backward (zero bubble), the part I takes; W the rest

    def transfer_s(self, nbytes: int) -> float:
        return nbytes / self.bandwidth_bytes_per_s

    def describe(self, p: int, num_layers: int | None = None, source: str = "") -> str:
        """One line, e.g. 'forward 2.10 ms, backward 1.80 ms per stage and micro-batch; messages: ...'."""
        link = f"messages: {self.latency_s * 1e6:.0f} µs latency + bytes / {self.bandwidth_bytes_per_s / 1e9:g} GB/s"
        if not self.forward_s_per_layer and not self.backward_s_per_layer:
            return f"no compute; {link}"
        per = "per stage and micro-batch" if num_layers is None else f"per layer ({num_layers} layers on {p} stages)"
        return (f"forward {self.forward_s_per_layer * 1e3:.2f} ms, backward {self.backward_s_per_layer * 1e3:.2f} ms "
                f"{per}{source}; {link}")


def calibrate(events: list[Event], p: int, stage_layers: list[int] | None = None,
              base: CostModel = CostModel()) -> CostModel:
    """`base` with the per-layer compute set to the average of the measured forward and backward boxes.

    `stage_layers` is how many blocks each rank ran (as the run recorded it). Without it, each stage
    counts as one layer: the ideal stages then take the average measured stage time. A run without
    compute (Q7's messages only) gets zero compute; a run stopped before any backward, the backward
    of `base` scaled like its forward.
    """
    layers = sum(stage_layers) if stage_layers else p
    out = base
    for kind, name in (("forward", "forward_s_per_layer"), ("backward", "backward_s_per_layer")):
        boxes = [e for e in events if e.kind == kind]
        m = len({e.microbatch for e in boxes}) or 1
        out = replace(out, **{name: sum(e.duration for e in boxes) / (m * layers)})
    if out.forward_s_per_layer and not out.backward_s_per_layer:
        out = replace(out, backward_s_per_layer=out.forward_s_per_layer * base.backward_s_per_layer
                      / base.forward_s_per_layer)
    return out


def ideal_events(p: int, m: int, cost: CostModel | None = None, *, schedule: str | Schedule = "afab",
                 stage_layers: list[int] | None = None, activation_bytes: int = 0,
                 shape: tuple | None = None) -> list[Event]:
    """The events of one step of `schedule` with p ranks and m micro-batches under `cost`.

    `stage_layers[r]` is the number of blocks rank r computes (default: one each); every message
    carries `activation_bytes` bytes (`shape` only labels them). Times start at 0.
    """
    cost = cost or CostModel()
    sched = schedules.schedule(schedule) if isinstance(schedule, str) else schedule
    layers = list(stage_layers) if stage_layers else [1] * p
    v = sched.chunks_per_rank
    program = {r: sched.program(r, p, m) for r in range(p)}
    next_op = {r: 0 for r in range(p)}
    free_at = {r: 0.0 for r in range(p)}        # when each rank finishes its previous operation
    arrives: dict[tuple, float] = {}            # (src, dst, phase, mb, chunk of the receiver) -> arrival
    events: list[Event] = []
    while any(next_op[r] < len(program[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while next_op[r] < len(program[r]):
                step = program[r][next_op[r]]
                op, mb, chunk, t = step.op, step.microbatch, step.chunk, free_at[r]
                peer = op.peer(r, p, chunk, v)
                if op.is_recv:
                    key = (peer, r, op.phase, mb, chunk)
                    if key not in arrives:
                        break                   # its message has not been sent yet: try another rank
                    end = max(t, arrives[key])
                    events.append(Event(r, op.value, mb, peer, shape, activation_bytes, t, end, chunk))
                elif op.is_send:
                    end = t + cost.transfer_s(activation_bytes)
                    arrives[(r, peer, op.phase, mb, op.peer_chunk(r, p, chunk))] = end + cost.latency_s
                    events.append(Event(r, op.value, mb, peer, shape, activation_bytes, t, end, chunk))
                else:
                    per_layer = cost.forward_s_per_layer if op.phase == "forward" else cost.backward_s_per_layer
                    if op.after is not None and op.after.phase == "backward":      # W, the rest of what I began
                        per_layer *= 1 - cost.input_share
                    elif op.holds == 0 and op.phase == "backward":                  # I, its first part
                        per_layer *= cost.input_share
                    end = t + per_layer * layers[r] / v
                    if end > t:                 # a cost model without compute draws the messages alone
                        events.append(Event(r, op.value, mb, None, None, 0, t, end, chunk))
                free_at[r] = end
                next_op[r] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"the {sched.title} program deadlocked; this is a bug in lab_src.pipeline.schedules")
    return sorted(events, key=lambda e: (e.t_start, e.rank))

"""Visible check of q11 (p2p_communicate): every rank calls the operations in the order of a 1F1B step (the
combined operations of the steady state) and of an AFAB step (the four single ones), sending tensors
labelled with sender and micro-batch, with no compute. Also the notebook's experiment: the same calls
made with blocking sends, which deadlock, and the report that says so.

The messages are the answer's own torch.distributed calls, recorded in the ranks by comm/messages.py.
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from lab_src import answers
from lab_src.checks.common import (
    UNFINISHED,
    VISIBLE,
    CheckReport,
    errors,
    finish,
    indent,
    make_case,
    run_cases,
    run_dir,
    sources,
)
from lab_src.judge.problems import stamped
from lab_src.registry import exercise
from lab_src.topics.p2p.judge import judge_p2p, mutual_sends

CONFIGS = [(VISIBLE.replace(num_microbatches=6, global_batch_size=12), "1f1b"),
           (VISIBLE.replace(num_stages=2, num_layers=4), "1f1b"),
           (VISIBLE.replace(num_stages=2, num_layers=4), "afab")]


def message_table(out) -> str:
    """Each rank's messages in the order they ended, e.g. 'send_forward(mb=0) to rank 1'."""
    rows = []
    for r in sorted(out.obs):
        ops = [e.label() for e in out.events() if e.rank == r]
        rows.append(f"rank {r}: " + ("; ".join(ops) if ops else "(no messages)"))
    return "\n".join(rows)


def check() -> CheckReport:
    srcs = sources("q11")
    problems, lines = [], ["q11 p2p_communicate: every rank calls your operations in the order of a step, "
                           "sending tensors labelled with sender and micro-batch"]
    cases = [make_case("p2p", cfg, srcs, "q11", schedule=sched, probes=["single"] if sched == "afab" else [])
             for cfg, sched in CONFIGS]
    run = run_cases(cases, run_dir("q11"))
    for (cfg, sched), out in zip(CONFIGS, run.outcomes):
        label = f"{cfg.num_stages} stages, {cfg.num_microbatches} micro-batches, in {sched.upper()} order"
        lines.append(f"\n  {label}:")
        errs = stamped(mutual_sends(out.errors()), "q11", label) + errors(out, "q11", label)
        problems += errs
        if not out.failure:
            messages, buffers = judge_p2p(out)
            if any(e.get("type") == "WrongDirection" for e in out.errors().values()):
                # a call that messaged the wrong side: the missing and unexpected messages follow from it
                messages = [replace(m, consequence=True) for m in messages]
            problems += stamped(messages + buffers, "q11", label)
            lines.append(indent(message_table(out)))
        if errs:
            lines.append(UNFINISHED)
    return finish("q11", run, problems, lines)


# The combined operations written with blocking calls, each sending before it receives.
BLOCKING = '''
import torch
import torch.distributed as dist


def p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None):
    next_side = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")
    if stage.is_last_stage if next_side else stage.is_first_stage:
        return None
    peer = stage.pp_rank + (1 if next_side else -1)
    if operation[:4] == "send":
        dist.send(tensor.detach(), group=stage.group, group_dst=peer)      # blocks until the peer receives
    if "recv" not in operation:
        return None
    buffer = torch.empty(stage.activation_shape, dtype=stage.dtype, device=stage.device)
    dist.recv(buffer, group=stage.group, group_src=peer)
    return buffer.requires_grad_(operation.endswith("_recv_forward") or operation == "recv_forward")
'''


class BlockingDemo:
    """What the blocking-sends experiment did: what each rank finished, where each was left waiting (facts
    only: the why is the notebook's written question), and the run, for `timeline()`."""

    def __init__(self, run, text: str, stuck: dict[int, str]):
        self.run, self.text, self.stuck = run, text, stuck

    def timeline(self):
        """The deadlocked run, drawn: the messages that went through, and where each rank waits."""
        from lab_src.views.saved import case_view, draw
        return draw(case_view(self.run.outcomes[0]), "q11: blocking sends in 1F1B order")

    def __repr__(self) -> str:
        return "BlockingDemo(): demo.timeline() draws the run"


def _waiting(errors: dict[int, dict]) -> dict[int, str]:
    """The operation each rank was still in when the run stopped, e.g. 'send_forward(mb=1) to rank 1'."""
    from lab_src.harness.deadlock import describe_op
    out = {}
    for r, e in sorted(errors.items()):
        if e.get("pending"):
            _, kind, mb, peer, *rest = e["pending"]
            out[r] = describe_op(kind, mb, peer, *(rest[:1] or [0]))
    return out


def blocking_demo(timeout_s: float = 3.0) -> BlockingDemo | None:
    """Two ranks call the operations of a 1F1B step with BLOCKING (send first, then receive): the steady
    state deadlocks, the check stops the run as soon as both ranks wait, and the demo says what each rank
    finished and what it was waiting in. It needs the answers q11 builds on (the stages), not q11's own.
    `timeout_s`: the receives' timeout, the last resort."""
    from lab_src.checks.experiments import skipped_under_validate
    if skipped_under_validate("The blocking-sends experiment"):
        return None
    needs = exercise("q11").needs
    srcs = answers.sources(needs)
    missing = [q for q in needs if srcs[q] is None]
    if missing:
        print(answers.stub_message(missing[0], caller="The blocking-sends experiment of q11")
              + (f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""), file=sys.stderr)
        return None
    folder = run_dir("q11-blocking")
    folder.mkdir(parents=True, exist_ok=True)
    answer = Path(folder) / "q11_blocking.py"
    answer.write_text(BLOCKING)
    cfg = VISIBLE.replace(num_stages=2, num_layers=4)
    case = make_case("p2p", cfg, {**srcs, "q11": str(answer.resolve())}, "q11", schedule="1f1b")
    print(f"2 ranks call the operations of a 1F1B step ({cfg.num_microbatches} micro-batches) with blocking "
          f"sends; the run stops as soon as every rank waits for something no rank will do ...", flush=True)
    run = run_cases([case], folder, timeout_s=timeout_s, case_deadline_s=10 * timeout_s + 20)
    out = run.outcomes[0]
    stuck = _waiting(out.errors())
    lines = ["", "What each rank finished before it got stuck:", indent(message_table(out)), "",
             "Where each rank was waiting when the run stopped:"]
    lines += [f"    rank {r}: inside {what}" for r, what in stuck.items()] or \
        ["    (nothing: the run did not deadlock)"]
    text = "\n".join(lines)
    print(text)
    return BlockingDemo(run, text, stuck)

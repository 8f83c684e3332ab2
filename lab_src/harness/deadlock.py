"""The report on a run that did not finish: for each rank, the last operation it completed and the
operation it is still waiting in, read from the journals the ranks wrote as they went.

    rank 0: done with send_forward(mb=3) to rank 1; waits in recv_backward(mb=0) from rank 1
    rank 1: done with F3; waits in recv_forward(mb=4) from rank 0
"""
from __future__ import annotations

from pathlib import Path

from lab_src.pipeline.schedules import Op
from lab_src.harness.runfolder import journal_path, read_journal


def describe_op(kind: str, mb, peer) -> str:
    op = Op.of(kind)
    if op is None:              # a collective: its `peer` is the list of ranks taking part
        return f"{kind} over ranks {peer}"
    if op.is_compute:
        return f"{kind[0].upper()}{mb}"
    return f"{kind}(mb={mb}) {'to' if op.is_send else 'from'} rank {peer}"


def rank_state(journal: Path, case_index: int) -> dict:
    """What one rank's journal says about one case."""
    state = {"started": False, "ended": False, "last_done": None, "pending": None}
    label = str(case_index)
    waiting: list[str] = []     # begun and not ended; posted messages (q11) may be several at once
    for _, tag, payload in read_journal(journal):
        if tag == "C":
            if payload == f"start {case_index}":
                state["started"] = True
            elif payload == f"end {case_index}":
                state["ended"] = True
        elif tag in ("B", "E") and payload and payload[0] == label:
            op = describe_op(*payload[1:4])
            if tag == "B":
                waiting.append(op)
            else:
                state["last_done"] = op
                if op in waiting:
                    waiting.remove(op)
    state["pending"] = " and ".join(waiting) or None
    return state


def report(run_dir: Path, case_index: int, ranks: range, done_ranks=(), exited=None) -> str:
    """One line per rank. `done_ranks` finished their part of the case (they saved observations);
    `exited` maps ranks whose process died to their exit code."""
    lines = []
    for r in ranks:
        s = rank_state(journal_path(run_dir, r), case_index)
        if exited and r in exited:
            last = f" after {s['last_done']}" if s["last_done"] else ""
            lines.append(f"rank {r}: its process exited with code {exited[r]}{last}"
                         + (f", in {s['pending']}" if s["pending"] else ""))
            continue
        if not s["started"]:
            lines.append(f"rank {r}: never started this case")
            continue
        done = f"done with {s['last_done']}" if s["last_done"] else "no operation finished"
        if s["pending"]:
            lines.append(f"rank {r}: {done}; waits in {s['pending']}")
        elif r in done_ranks or s["ended"]:
            lines.append(f"rank {r}: {done}; finished its part and waits for the other ranks")
        else:
            lines.append(f"rank {r}: {done}; busy outside any send, receive, forward or backward "
                         f"(a loop in the code, or waiting at a barrier)")
    return "\n".join(lines)

"""Benchmark: what a student sees when a visible check fails, and how long it takes to see it.

Each wrong answer below is the kind a student really writes. For each, a small notebook is executed in
a real Jupyter kernel (nbclient), in a fresh folder holding the reference answers of the other
exercises and the wrong one, as a student's notebook folder would:

    %load_ext lab_src                  from lab_src.checks import check
    report = check("qNN")              # the check cell: its time and the first lines it shows
    report.timeline()                  # the timeline cell after it: does it draw?

It prints, per wrong answer, the seconds the check cell took (the kernel's own execution times),
the first three non-empty lines the check cell showed (printed text, then any traceback, as the
notebook shows them), the line on which the real cause first appears, how many lines the cell showed
in all, and what the timeline cell gave. With `--tree OLD_CHECKOUT`, every wrong answer is measured
with that checkout's lab_src too, alternating with this one, so that both see the same machine load
(an earlier commit: `git archive <commit> | tar -x -C DIR`).

    python benchmarks/failure_report.py [--only q07-wrong-peer ...] [--tree DIR] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _reference_text(qid: str) -> str:
    from grader.reference import reference_sources
    return Path(reference_sources()[qid]).read_text()


def wrong_peer_q07() -> str:
    from grader.cohort.answers import answer
    return answer("q07_deadlock")


def no_requires_grad_q08() -> str:
    text = _reference_text("q08")
    lines = [ln for ln in text.splitlines() if "requires_grad_()" not in ln]
    text = "\n".join(lines) + "\n"
    # the `else:` branch that held only requires_grad_() now needs a body
    return re.sub(r"(\n(\s*)else:[^\n]*\n)(?!\2\s)", r"\1\2    pass\n", text)


def no_scale_q08() -> str:
    from grader.cohort.answers import answer
    return answer("q08_no_scale")


def printing_q05() -> str:
    text = _reference_text("q05")
    return text.replace("    base, extra", "    print(f'distribute_layers: rank {pp_rank} of {pp_size}')\n"
                                          "    base, extra", 1)


# name -> (exercise, wrong answer's source, words that name the real cause); the right answers give the
# time a check takes under the same load
WRONG = {
    "q07-right": ("q07", lambda: _reference_text("q07"), "all checks passed"),
    "q07-wrong-peer": ("q07", wrong_peer_q07, "wrong peer"),
    "q08-right": ("q08", lambda: _reference_text("q08"), "all checks passed"),
    "q08-no-requires-grad": ("q08", no_requires_grad_q08, "requires_grad"),
    "q08-loss-not-divided": ("q08", no_scale_q08, "number of micro-batches"),
    "q05-print": ("q05", printing_q05, "distribute_layers: rank"),
}


def workspace(folder: Path, qid: str, wrong: str) -> None:
    from grader.reference import reference_sources
    from lab_src.registry import exercise
    refs = reference_sources()
    answers = folder / "answers"
    answers.mkdir(parents=True)
    for q in (*exercise(qid).needs, qid):
        ex = exercise(q)
        if ex.function:
            (answers / ex.answer_file).write_text(wrong if q == qid else Path(refs[q]).read_text())


def cell_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
        elif out["output_type"] in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data:
                parts.append(data["text/plain"] if isinstance(data["text/plain"], str) else "".join(data["text/plain"]))
            kinds = sorted(k for k in data if k != "text/plain")
            if kinds:
                parts.append(f"[{', '.join(kinds)}]")
    return ANSI.sub("", "\n".join(parts))


def seconds(cell) -> float | None:
    ex = cell.get("metadata", {}).get("execution", {})
    try:
        t0 = datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))
        t1 = datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
    except KeyError:
        return None
    return (t1 - t0).total_seconds()


# After the check: how long the deadlocked case waited once every rank was waiting, before it was stopped
# (only a report that records where ranks waited can say; an older one prints nothing).
PROBE = """
try:
    _w = report.run.outcomes[report.failed_case()].waits()
    print("STOPPED_AFTER", max(x.t_end for x in _w) - max(x.t_start for x in _w))
except Exception:
    pass
"""


def measure(name: str, tree: Path = ROOT) -> dict:
    import os

    import nbformat
    from nbclient import NotebookClient
    qid, make, cause = WRONG[name]
    with tempfile.TemporaryDirectory(prefix="pp-lab-fail-") as tmp:
        folder = Path(tmp)
        workspace(folder, qid, make())
        nb = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_code_cell("%load_ext lab_src\nfrom lab_src.checks import check"),
            nbformat.v4.new_code_cell(f'report = check("{qid}")'),
            nbformat.v4.new_code_cell("report.timeline()"),
            nbformat.v4.new_code_cell(PROBE),
        ])
        client = NotebookClient(nb, timeout=300, allow_errors=True, record_timing=True,
                                resources={"metadata": {"path": str(folder)}})
        started = time.monotonic()
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(tree)          # the kernel imports this tree's lab_src
        try:
            client.execute()
        finally:
            os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
        wall = time.monotonic() - started
        check_cell, timeline_cell = nb.cells[1], nb.cells[2]
        probe = [ln for ln in cell_text(nb.cells[3]).splitlines() if ln.startswith("STOPPED_AFTER")]
        text = cell_text(check_cell)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        first_cause = next((i + 1 for i, ln in enumerate(lines) if cause.lower() in ln.lower()), None)
        timeline = cell_text(timeline_cell).strip().splitlines()
        errors = [o for o in check_cell.outputs if o.output_type == "error"]
        shutil.rmtree(folder / "runs", ignore_errors=True)
    return {"wrong_answer": name, "exercise": qid, "tree": str(tree), "check_s": seconds(check_cell), "notebook_s": round(wall, 1),
            "first_lines": lines[:3], "cause_on_line": first_cause, "lines_shown": len(lines),
            "raised": errors[0]["ename"] if errors else None,
            "stopped_after_s": float(probe[0].split()[1]) if probe else None,
            "timeline_cell": (timeline[-1] if timeline else "(no output)")[:160], "shown": text}


def main() -> int:
    sys.path.insert(0, str(ROOT))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(WRONG))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tree", type=Path, help="also measure this checkout (before), alternating with this one")
    ap.add_argument("--show", action="store_true", help="print everything the check cell showed")
    ap.add_argument("--repeat", type=int, default=1, help="measure each this many times (alternating trees)")
    args = ap.parse_args()
    results = []
    trees = [args.tree.resolve(), ROOT] if args.tree else [ROOT]
    for name in args.only or WRONG:
        for tree in trees * args.repeat:
            r = measure(name, tree)
            results.append(r)
            which = "this checkout" if tree == ROOT else str(tree)
            print(f"\n== {name} ({r['exercise']}, {which}): check cell {r['check_s']:.1f} s, {r['lines_shown']} "
                  f"lines shown, the cause first on line {r['cause_on_line']}, raised {r['raised']}"
                  + (f"; the deadlock was stopped {r['stopped_after_s']:.2f} s after every rank waited"
                     if r["stopped_after_s"] is not None else ""))
            for ln in r["first_lines"]:
                print(f"   | {ln[:200]}")
            print(f"   timeline cell: {r['timeline_cell']}")
            if args.show:
                print(r["shown"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.repeat > 1 or args.tree:
        print("\nmedian seconds of the check cell:")
        for name in args.only or WRONG:
            row = []
            for tree in trees:
                times = sorted(r["check_s"] for r in results if r["wrong_answer"] == name and r["tree"] == str(tree))
                row.append(f"{'this checkout' if tree == ROOT else tree.name}: {times[len(times) // 2]:.1f} "
                           f"({', '.join(f'{t:.1f}' for t in times)})")
            print(f"  {name:<22} " + "; ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())

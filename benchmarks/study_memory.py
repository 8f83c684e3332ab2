"""Benchmark: what an ungraded study leaves in a notebook's kernel, and what the study printed, run as a
student runs the notebook.

    .venv/bin/python benchmarks/study_memory.py [--only q12,q15,q16,q19] [--repeat 2] [--wait 0]
    .venv/bin/python benchmarks/study_memory.py --open q11,q12,q13,q14,q15,q16,q19 --wait 130

For each chosen exercise it starts a Jupyter kernel (this Python) in a folder that holds the reference
answers of every exercise, runs the solution notebook's code cells in order (the hidden-test cells left
out), then runs the study cells `--repeat - 1` more times, as a student who runs a study again would. After
each cell it reads the proportional set size (PSS, /proc/<pid>/smaps_rollup) of the kernel and of its
children (the warm launcher, lab_src/harness/warm_launch.py), and prints the study cells' own output with
the load average (`uptime`) before and after each, so that each study sentence of the notebooks can be held
against two runs. With `--wait S` it also reads the last kernel's PSS S seconds after its last cell (past the
warm launcher's idle release, LAB_WARM_IDLE_S). With `--open`, the notebooks named stay open at once, each
run to its end but its studies, and it prints the PSS of them all together. No figure is compared with a
threshold: it prints.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = re.compile(r"\b(\w*study|memory_vs_microbatches|thousand_microbatches|bubble_vs_microbatches|\w*bridge)\(")


def pss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree(pid: int) -> list[int]:
    """`pid`'s descendants (from /proc, children files)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def run_notebook(qid: str, folder: Path, repeat: int, wait: float, keep: list | None = None) -> list[tuple]:
    """Run `qid`'s solution notebook in a new kernel, its studies `repeat` times (0: none); with `keep`, leave the
    kernel running and append (kernel manager, client, pid) to it."""
    import jupytext
    from jupyter_client import KernelManager
    from lab_src.registry import EXERCISES
    ex = EXERCISES[qid]
    src = next(ROOT.glob(f"solutions/*/{ex.notebook}"))
    nb = jupytext.read(src)
    cells = [c.source for c in nb.cells if c.cell_type == "code" and "BEGIN HIDDEN TESTS" not in c.source
             and "require_check" not in c.source]
    km = KernelManager(kernel_name="python3")
    km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    km.start_kernel(cwd=str(folder), env={**os.environ, "MPLBACKEND": "agg"})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    pid = km.provisioner.process.pid
    rows = []

    def run(code: str, label: str, show: bool) -> None:
        text: list[str] = []

        def hook(msg):
            c = msg["content"]
            if msg["msg_type"] == "stream":
                text.append(c["text"])
            elif msg["msg_type"] == "error":
                text.append("ERROR " + c["ename"] + ": " + c["evalue"] + "\n")
        before = load()
        t0 = time.monotonic()
        kc.execute_interactive(code, timeout=1200, output_hook=hook, allow_stdin=False)
        took = time.monotonic() - t0
        kids = tree(pid)
        own, total = pss_mib(pid), pss_mib(pid) + sum(pss_mib(k) for k in kids)
        rows.append((qid, label, took, own, total, len(kids)))
        print(f"[{qid}] {label:<60} {took:6.1f} s  kernel PSS {own:7.0f} MiB, with its {len(kids)} children "
              f"{total:7.0f} MiB", flush=True)
        if show or any(t.startswith("ERROR") for t in text):
            print(f"    load before: {before}\n    load after:  {load()}")
            print("".join("    | " + ln + "\n" for ln in "".join(text).splitlines()[-60:]), flush=True)

    studies = []
    for code in cells:
        first = next((ln for ln in code.splitlines() if ln.strip() and not ln.startswith("#")), "")
        is_study = bool(STUDY.search(code))
        if is_study:
            studies.append(code)
            if not repeat:
                continue
        run(code, ("study: " if is_study else "") + first[:52], is_study)
    for i in range(1, repeat):
        for code in studies:
            first = next((ln for ln in code.splitlines() if ln.strip() and not ln.startswith("#")), "")
            run(code, f"study again ({i + 1}): " + first[:40], True)
    if wait:
        time.sleep(wait)
        kids = tree(pid)
        print(f"[{qid}] {wait:.0f} s later: kernel PSS {pss_mib(pid):.0f} MiB, with its {len(kids)} children "
              f"{pss_mib(pid) + sum(pss_mib(k) for k in kids):.0f} MiB", flush=True)
    if keep is not None:
        keep.append((km, kc, pid))
        return rows
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    return rows


def open_notebooks(qids: list[str], folder: Path, wait: float) -> None:
    """Each of `qids`'s notebooks open in its own kernel, run to its end but its studies (what a study leaves is
    measured above): the PSS of all the kernels and their warm launchers together, at once and `wait` s later."""
    kept: list = []
    for qid in qids:
        run_notebook(qid, folder, 0, 0.0, keep=kept)

    def total() -> tuple[float, float, int]:
        kernels = sum(pss_mib(pid) for _, _, pid in kept)
        kids = [k for _, _, pid in kept for k in tree(pid)]
        return kernels, kernels + sum(pss_mib(k) for k in kids), len(kids)
    kernels, everything, kids = total()
    print(f"{len(qids)} notebooks open: kernels {kernels:.0f} MiB PSS, with their {kids} children "
          f"{everything:.0f} MiB ({everything / 1024:.2f} GiB); {load()}", flush=True)
    if wait:
        time.sleep(wait)
        kernels, everything, kids = total()
        print(f"{wait:.0f} s later: kernels {kernels:.0f} MiB PSS, with their {kids} children {everything:.0f} MiB "
              f"({everything / 1024:.2f} GiB); {load()}", flush=True)
    for km, kc, _ in kept:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="q12,q15,q16,q19")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each study cell (default 2)")
    ap.add_argument("--wait", type=float, default=0.0, help="seconds to wait after the last cell, then read PSS")
    ap.add_argument("--open", default="", help="instead: these notebooks open at once (e.g. q11,q12,q13,q14,q15,q16,q19), "
                                              "their studies left out; the PSS of all of them")
    args = ap.parse_args()
    from grader.reference import reference_sources
    from lab_src.registry import EXERCISES
    print(f"{os.cpu_count()} cores; {load()}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="pp-lab-studies-"))
    try:
        (folder / "answers").mkdir()
        for q, path in reference_sources().items():
            if q in EXERCISES and EXERCISES[q].function:
                shutil.copy(path, folder / "answers" / EXERCISES[q].answer_file)
        rows = []
        if args.open:
            open_notebooks([q for q in args.open.split(",") if q], folder, args.wait)
            return 0
        chosen = [q for q in args.only.split(",") if q]
        for qid in chosen:
            rows += run_notebook(qid, folder, args.repeat, args.wait if qid == chosen[-1] else 0.0)
        print(f"\n{'exercise':<9}{'after the cell':<62}{'kernel PSS':>12}{'with children':>15}")
        for qid, label, _, own, total, _ in rows:
            if label.startswith("study"):
                print(f"{qid:<9}{label:<62}{own:>8.0f} MiB{total:>11.0f} MiB")
        print(load())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

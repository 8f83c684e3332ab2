"""Benchmark: what a visible check costs a student, the old way (a `torchrun` subprocess whose workers
import torch anew, LAB_LAUNCH=torchrun) beside the new one (ranks forked by the kernel's warm launcher
under torch's elastic agent, harness/warm.py), in the same run.

    .venv/bin/python benchmarks/check_latency.py [--repeat 3]

Two "kernels" (Python processes, one per way) live through the run, as a notebook's kernel does: each
has loaded lab_src and imported torch (a notebook's first cells do), and the new one has its warm
launcher started and ready (`%load_ext lab_src` starts it while the student reads). The driver sends
them the same checks in turn, alternating, so that the shared machine's load falls on both alike:

- the q08 check from the call to its report (median of --repeat);
- every check q02..q15 once, on the reference answers (their median);
- a deadlocking q07 answer (q07_deadlock of grader/cohort/mistakes.py): from the call to the report;
- peak memory of one q08 check, as benchmarks/hub_check_cost.py measures it (the summed resident
  memory of the kernel's process tree, sampled every 50 ms), and the proportional set size (PSS), which
  counts a page shared by forked ranks once.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
QIDS = [f"q{n:02d}" for n in range(2, 16)]


def kernel(mode: str) -> int:
    """A kernel: reads `CHECK qid answers-folder` lines, answers `TOOK seconds ok`."""
    import torch  # noqa: F401 - the notebook's cells have imported it

    from lab_src.checks import check
    from lab_src.harness import warm_launch
    out = os.fdopen(os.dup(1), "w", buffering=1)
    if mode == "warm":
        warm_launch.prestart()
        while not any(r.startswith("READY") for r in warm_launch._warm.replies):
            time.sleep(0.05)
    out.write("READY\n")
    for line in sys.stdin:
        _, qid, folder = line.split()
        os.environ["LAB_ANSWERS_DIR"] = folder
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
            started = time.monotonic()
            report = check(qid)
            took = time.monotonic() - started
        out.write(f"TOOK {took:.3f} {int(report.ok)}\n")
    return 0


class Kernel:
    def __init__(self, mode: str, cwd: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "LAB_LAUNCH": mode}
        env.pop("LAB_ANSWERS_DIR", None)
        self.proc = subprocess.Popen([sys.executable, __file__, "--kernel", mode], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1)
        assert self.proc.stdout.readline().strip() == "READY"

    def check(self, qid: str, folder: Path) -> tuple[float, bool]:
        self.proc.stdin.write(f"CHECK {qid} {folder}\n")
        self.proc.stdin.flush()
        _, took, ok = self.proc.stdout.readline().split()
        return float(took), ok == "1"

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def peak_memory(k: Kernel, folder: Path) -> tuple[float, float, int]:
    """(summed RSS MB, summed PSS MB, processes) at the peak of one q08 check in kernel `k`."""
    top = psutil.Process(k.proc.pid)
    peak = {"rss": 0, "pss": 0, "procs": 0}
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                tree = [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
            rss = pss = 0
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    full = p.memory_full_info()
                    rss, pss = rss + full.rss, pss + full.pss
            peak["rss"], peak["pss"] = max(peak["rss"], rss), max(peak["pss"], pss)
            peak["procs"] = max(peak["procs"], len(tree))
            time.sleep(0.05)
    t = threading.Thread(target=sample)
    t.start()
    try:
        k.check("q08", folder)
    finally:
        done.set()
        t.join()
    return peak["rss"] / 2**20, peak["pss"] / 2**20, peak["procs"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kernel")
    args = ap.parse_args()
    if args.kernel:
        return kernel(args.kernel)
    sys.path.insert(0, str(ROOT))
    from grader.cohort.answers import answer
    from grader.reference import reference_sources
    from lab_src.registry import EXERCISES
    print(f"{os.cpu_count()} cores, load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pp-lab-latency-") as tmp:
        tmp = Path(tmp)
        good, bad = tmp / "reference", tmp / "deadlock"
        for folder in (good, bad):
            folder.mkdir()
            for qid, path in reference_sources().items():
                shutil.copyfile(path, folder / EXERCISES[qid].answer_file)
        (bad / EXERCISES["q07"].answer_file).write_text(answer("q07_deadlock"))
        modes = ["torchrun", "warm"]
        t0 = time.monotonic()
        kernels = {m: Kernel(m, tmp) for m in modes}
        print(f"kernels ready in {time.monotonic() - t0:.1f} s", flush=True)
        got: dict[str, dict[str, list]] = {m: {"q08": [], "all": [], "deadlock": []} for m in modes}
        failed = []
        try:
            for _ in range(args.repeat):
                for m in modes:
                    took, ok = kernels[m].check("q08", good)
                    got[m]["q08"].append(took)
                    failed += [] if ok else [(m, "q08")]
            for qid in QIDS:
                for m in modes:
                    took, ok = kernels[m].check(qid, good)
                    got[m]["all"].append((qid, took))
                    failed += [] if ok else [(m, qid)]
            for _ in range(max(2, args.repeat - 1)):
                for m in modes:
                    took, ok = kernels[m].check("q07", bad)
                    got[m]["deadlock"].append(took)
                    failed += [(m, "q07 deadlock passed?")] if ok else []
            memory = {m: peak_memory(kernels[m], good) for m in modes}
        finally:
            for k in kernels.values():
                k.close()
    old, new = got["torchrun"], got["warm"]

    def row(name, a, b, target):
        print(f"{name:<34} {a:>9.2f} {b:>9.2f} {a / b:>7.1f}x   {target}")
    print(f"\n{'':<34} {'torchrun':>9} {'warm':>9} {'ratio':>8}   target")
    row(f"q08 check, s (median of {args.repeat})", statistics.median(old["q08"]), statistics.median(new["q08"]), "<= 2.5 s")
    row("median check q02-q15, s", statistics.median(t for _, t in old["all"]),
        statistics.median(t for _, t in new["all"]), "<= 3 s")
    row("deadlocking q07 to its report, s", statistics.median(old["deadlock"]), statistics.median(new["deadlock"]),
        "<= 2 s")
    row("q08 peak memory, RSS summed, GB", memory["torchrun"][0] / 1024, memory["warm"][0] / 1024, "<= 0.6 GB")
    row("q08 peak memory, PSS summed, GB", memory["torchrun"][1] / 1024, memory["warm"][1] / 1024, "")
    print(f"{'processes at the peak':<34} {memory['torchrun'][2]:>9} {memory['warm'][2]:>9}")
    print(f"\nq08, s: {' '.join(f'{t:.1f}' for t in old['q08'])} / {' '.join(f'{t:.1f}' for t in new['q08'])};  "
          f"deadlock, s: {' '.join(f'{t:.1f}' for t in old['deadlock'])} / {' '.join(f'{t:.1f}' for t in new['deadlock'])}")
    print("per check, s:  " + "  ".join(f"{q} {a:.1f}/{b:.1f}" for (q, a), (_, b) in zip(old["all"], new["all"])))
    if failed:
        print(f"unexpected verdicts: {failed}")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

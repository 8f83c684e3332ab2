"""Benchmark: launches that never start, with and without the hold of harness/elastic.py, in one run.

    .venv/bin/python benchmarks/start_hold.py [launches per way, default 100] [ranks, default 8]

Each launch is what a check or a graded group starts: a process that has imported torch forks torch's
elastic agent (`elastic_launch`, `start_method="fork"`, c10d rendezvous on loopback), which forks the
ranks; each rank joins a gloo group and passes a barrier. The two ways alternate launch by launch:

- *no hold*: a rank connects the moment it is forked, as torch's agent leaves it;
- *hold*: a rank first waits until the agent has forked every rank (`elastic.hold_until_all_forked`).

A launch still running after 15 s is counted as hung and killed. Without the hold, a rank forked while
another thread of the agent was inside glibc's resolver blocks for ever in its first `getaddrinfo`; more
ranks per launch (8 here, 4 in the lab) and a loaded machine make that more likely, so the figure is
the rate of the race, not of a lab check. It prints hung launches per way and the median launch time.
"""
from __future__ import annotations

import datetime
import logging
import mmap
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid

import torch.distributed as dist

from lab_src.harness.elastic import hold_until_all_forked

HANG_S = 15.0
_FLAGS: list[mmap.mmap] = []


def job() -> None:
    if _FLAGS:
        hold_until_all_forked(_FLAGS[0], int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=HANG_S))
    dist.barrier()
    dist.destroy_process_group()


def agent(nproc: int, hold: bool, log_dir: str) -> None:
    """The forked agent of one launch; never returns."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    os.setpgid(0, 0)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    if hold:
        _FLAGS.append(mmap.mmap(-1, nproc))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", run_id=uuid.uuid4().hex, max_restarts=0,
                          monitor_interval=0.02, start_method="fork", logs_specs=DefaultLogsSpecs(log_dir=log_dir))
    try:
        elastic_launch(config, job)()
        os._exit(0)
    except BaseException:       # noqa: BLE001 - the launch failed; its status says so
        os._exit(1)


def launch(nproc: int, hold: bool, log_dir: str) -> tuple[str, float]:
    """One launch: ('ok' | 'failed' | 'hung', seconds)."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        agent(nproc, hold, log_dir)
    while time.perf_counter() - t0 < HANG_S:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return ("ok" if os.waitstatus_to_exitcode(status) == 0 else "failed"), time.perf_counter() - t0
        time.sleep(0.005)
    os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung", time.perf_counter() - t0


def main() -> None:
    launches = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    nproc = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    outcomes: dict[str, list[tuple[str, float]]] = {"no hold": [], "hold": []}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as log_dir:
        for i in range(launches):
            for way in (("no hold", "hold") if i % 2 == 0 else ("hold", "no hold")):
                outcomes[way].append(launch(nproc, way == "hold", log_dir))
            if (i + 1) % 25 == 0:
                print(f"  {i + 1} launches each: " + ", ".join(
                    f"{w} {sum(o == 'hung' for o, _ in r)} hung" for w, r in outcomes.items()), flush=True)
    print(f"{launches} launches of {nproc} ranks each way, alternating; load {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"{'':10} {'hung':>6} {'failed':>7} {'median s (started ones)':>24}")
    for way, rows in outcomes.items():
        hung = sum(o == "hung" for o, _ in rows)
        failed = sum(o == "failed" for o, _ in rows)
        started = [t for o, t in rows if o == "ok"]
        median = statistics.median(started) if started else float("nan")
        print(f"{way:10} {hung:>6} {failed:>7} {median:>24.2f}")


if __name__ == "__main__":
    main()

"""Starting 4 ranks from a process that has imported torch: torch's elastic agent (what torchrun runs)
against a bare os.fork with the same environment. Each rank joins a gloo group and all-reduces once.

    .venv/bin/python benchmarks/agent_vs_fork.py [repeats]
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
import uuid

import torch
import torch.distributed as dist


def job() -> None:
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    dist.destroy_process_group()


def agent(n: int) -> float:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=n, rdzv_backend="c10d",
                       rdzv_endpoint="127.0.0.1:0", run_id=uuid.uuid4().hex, max_restarts=0,
                       monitor_interval=0.01, start_method="fork")
    t0 = time.perf_counter()
    elastic_launch(cfg, job)()
    return time.perf_counter() - t0


def bare(n: int) -> float:
    t0 = time.perf_counter()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for r in range(n):
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            job()
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return time.perf_counter() - t0


if __name__ == "__main__":
    import logging
    logging.disable(logging.WARNING)
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    a = [agent(4) for _ in range(k)]
    b = [bare(4) for _ in range(k)]
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"elastic agent, 4 ranks: median {statistics.median(a):.3f} s  ({', '.join(f'{x:.2f}' for x in a)})")
    print(f"bare fork,     4 ranks: median {statistics.median(b):.3f} s  ({', '.join(f'{x:.2f}' for x in b)})")
    print(f"agent costs {statistics.median(a) - statistics.median(b):+.3f} s per launch")

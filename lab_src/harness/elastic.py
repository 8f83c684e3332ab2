"""Start the ranks of one launch as `torchrun` does, from a process that has already imported torch.

A launch is one forked child, the *agent*: it runs torch's elastic agent, the code `torchrun` itself
runs (`torch.distributed.launcher.api.elastic_launch`, standalone c10d rendezvous on loopback,
`start_method="fork"`), which forks the ranks. Every rank therefore sees torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID, ...) and runs
`harness/worker.py`'s main, without importing torch again. Used by the warm launcher of the visible
checks (harness/warm.py) and by the grader's fork server in the sandbox (harness/zygote.py).

The agent is a process group of its own and dies with its parent (PR_SET_PDEATHSIG); the ranks die
with the agent (worker.py). A rank waits until the agent has forked every rank of the launch before it
connects to anything (`hold_until_all_forked`): the agent serves the ranks' connections from other
threads, and a fork taken while one of them holds glibc's resolver lock leaves the child blocked for
ever in its first `getaddrinfo` (docs/architecture.md, "Starting ranks"). No process here touches CUDA
before the ranks are forked: a rank that gets a GPU initialises CUDA itself (harness/groups.py).
"""
from __future__ import annotations

import ctypes
import importlib
import json
import mmap
import os
import signal
import sys
import time
import traceback
import uuid

from lab_src.harness import limits
from lab_src.harness.records import ENDED_WITHOUT_RETURNING

MONITOR_INTERVAL_S = 0.02
_CLOSE_IN_RANK: list[int] = []      # descriptors of the agent that a rank closes before anything else
_FORKED: list[mmap.mmap] = []       # one byte per local rank, shared by the agent and the ranks it forks


def preload() -> None:
    """Import what a rank runs (torch, the agent, the worker and every case kind), never student code."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")    # is_available() without CUDA's init
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.distributed.launcher.api  # noqa: F401
    # what torch imports on a process's first autograd.grad given grad_outputs (sympy, ~1 s of CPU): here, not in
    # a rank's first split case (pipeline/split.py warm_up), where on a loaded machine it held that rank so long
    # (over the 15 s its peers wait at the case's barrier) that only its error was seen (the full test run:
    # untouched's q16 read "rank 3: StubCalled" in the first 4-stage case instead of ranks 0, 1, 2, 3)
    import torch.fx.experimental.symbolic_shapes  # noqa: F401

    from lab_src import topics
    from lab_src.harness import groups, kinds, runfolder, worker  # noqa: F401
    from lab_src.pipeline import data, model, trace, waiting  # noqa: F401
    kinds.runners()
    for recorder in topics.recorders():
        importlib.import_module(recorder)


def die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except OSError:
        pass


def hold_until_all_forked(flags: mmap.mmap, local_rank: int, nproc: int,
                          limit_s: float = limits.FORKED_LIMIT_S) -> bool:
    """Mark this rank forked in `flags` (shared memory the agent made before forking) and wait until all
    `nproc` ranks are; return whether they were within `limit_s`.

    Why: a child of fork() keeps only the thread that forked, and every lock another thread held at that
    instant stays held in the child. The agent forks its ranks one after the other while other threads
    of it (the rendezvous store's server, the keep-alive timer) work for the ranks already started; if
    one of them is inside glibc's resolver at the instant of a fork, that rank blocks for ever in its
    first `getaddrinfo` (TCPStore's connect), and the others wait for it at the store. Measured: 17 of
    200 launches of 4 ranks hung without this hold, none with it (benchmarks/start_hold.py).
    Once every rank has been forked the agent forks nothing more, so no rank connects before then."""
    flags[local_rank] = 1
    deadline = time.monotonic() + limit_s
    while flags[:nproc].count(1) < nproc:
        if time.monotonic() > deadline:
            return False        # a sibling never came: the launch fails at its store and says so
        time.sleep(0.001)
    return True


def _rank(spec_path: str) -> int:
    """A rank's entrypoint, in a process the agent forked, with torchrun's environment set."""
    for fd in _CLOSE_IN_RANK:
        try:
            os.close(fd)
        except OSError:
            pass
    if _FORKED:
        hold_until_all_forked(_FORKED[0], int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        import torch
        torch.set_num_threads(int(threads))
    from lab_src.harness import worker
    code = worker.main(spec_path)
    if code:
        sys.stdout.flush()
        os._exit(code)
    return code


def run_ranks(spec_path: str, nproc: int, log_dir: str, run_id: str | None = None) -> dict[int, int]:
    """Run `nproc` ranks of the worker on `spec_path` under the elastic agent, in this process; return
    {rank: exit status} (0 for every rank of a launch that succeeded; after a failure, each rank's own
    status: -15 for a rank the agent stopped because another failed, as torchrun does)."""
    import logging

    import torch
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    assert not torch.cuda.is_initialized(), "CUDA must start in the ranks, after the fork"
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, rdzv_backend="c10d",
                          rdzv_endpoint="127.0.0.1:0", run_id=run_id or uuid.uuid4().hex, max_restarts=0,
                          monitor_interval=MONITOR_INTERVAL_S, start_method="fork",
                          logs_specs=DefaultLogsSpecs(log_dir=log_dir))
    seen = _record_exit_codes()
    _notice_ranks_that_end_without_returning()
    try:
        elastic_launch(config, _rank)(spec_path)
    except ChildFailedError as e:
        codes = {int(r): f.exitcode for r, f in e.failures.items()}
        ended = {r for r, c in codes.items() if c == ENDED_WITHOUT_RETURNING}
        codes.update(seen)
        codes.update(dict.fromkeys(ended, ENDED_WITHOUT_RETURNING))
        return codes
    return {r: 0 for r in range(nproc)}


def _notice_ranks_that_end_without_returning() -> None:
    """Make torch's agent end a launch whose every rank's process has ended while some of them never returned
    from the entrypoint: torch waits for a return value from each, so a rank whose process an answer ended
    with status 0 (os._exit(0) as its cell loads) would keep the launch waiting for ever, and the check would
    say only that the ranks never started. Those ranks fail with ENDED_WITHOUT_RETURNING instead, at once."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext, RunProcsResult
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
    if getattr(MultiprocessContext._poll, "lab_notices_early_ends", False):
        return
    poll = MultiprocessContext._poll

    def poll_or_ended(self):
        result = poll(self)
        procs = self._pc.processes if result is None and self._pc is not None else []
        if not procs or any(p.exitcode is None for p in procs):
            return result
        missing = [r for r in range(self.nprocs) if r not in self._return_values]
        failures = {r: ProcessFailure(local_rank=r, pid=procs[r].pid, error_file=self.error_files[r],
                                      exitcode=procs[r].exitcode or ENDED_WITHOUT_RETURNING) for r in missing}
        self.close()
        return RunProcsResult(failures=failures, stdouts=self.stdouts, stderrs=self.stderrs)

    poll_or_ended.lab_notices_early_ends = True
    MultiprocessContext._poll = poll_or_ended


def _record_exit_codes() -> dict[int, int]:
    """The exit status of every rank, as the agent reaps them all when a launch ends.

    torch's agent names only the first failed rank it polls (`ChildFailedError.failures`); when two ranks
    have ended by then (rank 2 crashed, rank 1's receive from it failed), which one is named is a race.
    The agent closes every rank before it returns, so its process context holds each rank's own status
    then; this process is the agent's and nothing else runs in it, so the hook is local to one launch."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    seen: dict[int, int] = {}
    close = MultiprocessContext._close

    def close_and_record(self, *args, **kwargs):
        close(self, *args, **kwargs)
        for rank, proc in enumerate(self._pc.processes if self._pc else []):
            if proc.exitcode is not None:
                seen[rank] = proc.exitcode

    MultiprocessContext._close = close_and_record
    return seen


def start(spec_path: str, nproc: int, *, run_dir: str, log_path: str, env: dict | None = None,
          run_id: str | None = None) -> tuple[int, int]:
    """Fork the agent of one launch; return (its pid, which is also its process group, and the
    descriptor its ranks' exit statuses arrive on: read it with `collect`)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, read_end
    code = 70
    try:
        os.setpgid(0, 0)
        die_with_parent()
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, write_end)             # the parent's pipes stay out of the ranks' reach
        os.closerange(write_end + 1, 1 << 16)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        _CLOSE_IN_RANK[:] = [write_end]
        _FORKED[:] = [mmap.mmap(-1, max(nproc, 1))]     # anonymous and shared: the ranks inherit it
        os.environ.update(env or {})
        os.chdir(run_dir)
        codes = run_ranks(spec_path, nproc, os.path.join(run_dir, "elastic"), run_id)
        os.write(write_end, json.dumps(codes).encode())
        code = 0
    except BaseException:   # noqa: BLE001 - whatever happened, this process ends here
        traceback.print_exc()
    finally:
        os._exit(code)


def collect(pid: int, read_end: int) -> tuple[int, dict[int, int]]:
    """Wait for the agent `pid`; return (its exit status, {rank: exit status} where it said)."""
    _, raw = os.waitpid(pid, 0)
    os.set_blocking(read_end, False)
    try:
        data = os.read(read_end, 1 << 16)
    except BlockingIOError:
        data = b""
    finally:
        os.close(read_end)
    try:
        codes = {int(r): int(c) for r, c in json.loads(data).items()} if data else {}
    except ValueError:
        codes = {}
    return os.waitstatus_to_exitcode(raw), codes

"""Launch `torchrun --standalone` with a deadline, and leave no process behind.

torchrun starts each worker in a session of its own, so killing torchrun's process group misses the
workers, and `subprocess.run(timeout=...)` (SIGKILL to torchrun alone) orphans them. Instead every
process of a launch carries an environment tag, ``LAB_RUN_TAG``; when the launch ends, however it
ends, every process with the tag gets SIGTERM, then SIGKILL. Workers also ask the kernel to kill
them if torchrun dies first (Linux `PR_SET_PDEATHSIG`).

`--standalone` lets torchrun pick a free port, so launches may overlap.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from lab_src.harness import runfolder

TAG = "LAB_RUN_TAG"


@dataclass
class Launch:
    returncode: int | None         # torchrun's exit status; None when we stopped it
    stopped: str | None            # why we stopped it ("deadline", or the watchdog's reason)
    wall_s: float
    launcher_log: str              # torchrun's own output (tail)
    rank_logs: dict[int, str] = field(default_factory=dict)   # each worker's stdout+stderr (tail)
    leftovers: int = 0             # tagged processes still alive when the launch ended, then killed

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.stopped is None


def tail(path: Path, limit: int = 16_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return (f"[... {size - limit} earlier bytes not shown]\n" if size > limit else "") + text


def tagged_processes(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get(TAG) == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def kill_tagged(tag: str, grace_s: float = 1.0) -> int:
    """SIGTERM every process carrying `tag`, then SIGKILL what is left. Returns how many there were."""
    procs = tagged_processes(tag)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


def torchrun_command(nproc: int, module: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "-m", module, *args]


def launch(nproc: int, module: str, args: list[str], *, run_dir: Path, deadline_s: float,
           watchdog=None, env: dict | None = None, poll_s: float = 0.05, sandboxed: bool = False) -> Launch:
    """Run `torchrun ... -m module args` in `run_dir`; stop it at `deadline_s` or when `watchdog()`
    returns a reason (a string). Workers write their own logs to run_dir/rank<r>.log.

    `sandboxed`: inside bubblewrap (harness/sandbox.py), whose only writable folder is `run_dir`; the
    launch then ends by killing the sandbox's PID namespace, which takes every process in it along,
    whatever session or environment it gave itself."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    own = {**(env or {}), TAG: tag, "LAB_RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": os.environ.get("LAB_OMP_THREADS", "1")}
    cmd = torchrun_command(nproc, module, args)
    if sandboxed:
        from lab_src.harness import sandbox
        sandbox.prepare(run_dir)
        own = {k: v for k, v in own.items() if k != "PYTHONPATH"}     # the sandbox sets its own
        cmd, full_env = sandbox.wrap(cmd, writable=run_dir, env=own), dict(os.environ)
    else:
        full_env = {**os.environ, **own}
    log_path = run_dir / "torchrun.log"
    started = time.monotonic()
    stopped = None
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=full_env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                if time.monotonic() - started > deadline_s:
                    stopped = f"deadline of {deadline_s:.0f} s"
                elif watchdog is not None:
                    stopped = watchdog()
                if stopped:
                    break
                time.sleep(poll_s)
        finally:
            # however we leave (normal end, deadline, KeyboardInterrupt in a notebook), nothing survives
            if proc.poll() is None:
                try:
                    # bwrap dies at once, and its namespace with it (--die-with-parent on its init)
                    os.killpg(proc.pid, signal.SIGKILL if sandboxed else signal.SIGTERM)
                except ProcessLookupError:
                    pass
            leftovers = kill_tagged(tag)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    wall = time.monotonic() - started
    rank_logs = {r: tail(p) for r, p in runfolder.rank_logs(run_dir).items()}
    return Launch(None if stopped else proc.returncode, stopped, wall, tail(log_path), rank_logs, leftovers)

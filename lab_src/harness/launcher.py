"""Launch `torchrun --standalone` with a deadline, and leave no process behind.

torchrun starts each worker in a session of its own, so killing torchrun's process group misses the
workers, and `subprocess.run(timeout=...)` (SIGKILL to torchrun alone) orphans them. Instead every
process of a launch carries an environment tag, ``LAB_RUN_TAG``; when the launch ends, however it
ends, every process with the tag gets SIGTERM, then SIGKILL. Workers also ask the kernel to kill
them if torchrun dies first (Linux `PR_SET_PDEATHSIG`).

`--standalone` lets torchrun pick a free port, so launches may overlap.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from lab_src.harness import runfolder
from lab_src.harness.records import exit_text

TAG = "LAB_RUN_TAG"


@dataclass
class Launch:
    returncode: int | None         # torchrun's exit status; None when we stopped it
    stopped: str | None            # why we stopped it ("deadline", or the watchdog's reason)
    wall_s: float
    launcher_log: str              # torchrun's own output (tail)
    rank_logs: dict[int, str] = field(default_factory=dict)   # each worker's stdout+stderr (tail)
    leftovers: int = 0             # tagged processes still alive when the launch ended, then killed
    exit_codes: dict[int, int] = field(default_factory=dict)  # rank -> exit status, where known
    groups_done: int = 0           # for a grouped launch: how many groups completed
    sandbox_ended: int | None = None   # the sandbox's exit status, where it ended by itself (its processes killed)

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
           watchdog=None, env: dict | None = None, poll_s: float = 0.05) -> Launch:
    """Run `torchrun ... -m module args` in `run_dir`; stop it at `deadline_s` or when `watchdog()`
    returns a reason (a string). Workers write their own logs to run_dir/rank<r>.log. (The grader's
    sandboxed launches go through `launch_groups` instead.)"""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    full_env = {**os.environ, **(env or {}), TAG: tag, "LAB_RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": os.environ.get("LAB_OMP_THREADS", "1")}
    cmd = torchrun_command(nproc, module, args)
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
                    os.killpg(proc.pid, signal.SIGTERM)
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


def _received_diag(ours, ready: bool):
    """The fork server's sock_diag socket, from the pair's end it writes to (None, and why, where it sent none)."""
    import socket
    if not ready:
        ours.close()
        return None, "the sandbox did not start"
    ours.settimeout(5)
    try:
        _msg, fds, _flags, _addr = socket.recv_fds(ours, 16, 1)
    except OSError as e:
        return None, f"the fork server sent no sock_diag socket ({e})"
    finally:
        ours.close()
    if not fds:
        return None, "the fork server sent no sock_diag socket"
    return socket.socket(fileno=fds[0]), ""


def launch_groups(groups: list[tuple[Path, int]], *, run_dir: Path, deadline_s: float, make_watchdog,
                  before_group=None, after_group=None, env: dict | None = None, poll_s: float = 0.05,
                  on_diag=None) -> Launch:
    """Run groups of cases one after the other in one sandbox, through the fork server
    (harness/zygote.py): torch is imported once, and each group's ranks are forked fresh.

    `groups`: (spec file, number of ranks) per group. `before_group(i)` is called just before group i
    starts (write its inputs), `after_group(i)` once it has ended and the sandbox holds no process of it
    but the fork server (delete its inputs). `make_watchdog(i, nproc)` gives group i's watchdog, which
    may stop the launch with a reason, as in `launch`. A stopped launch kills the sandbox and runs no
    further group; `groups_done` says how far it got. `on_diag(socket or None, why)`: given the sock_diag socket
    of the sandbox's network namespace, which the fork server opens before any answer is loaded and hands out
    (harness/wire.py), once it is ready.
    """
    from lab_src.harness import sandbox
    run_dir = Path(run_dir)
    sandbox.prepare(run_dir)
    own = {**(env or {}), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("LAB_OMP_THREADS", "1")}
    own.pop("PYTHONPATH", None)
    import socket
    ours = theirs = None
    extra = []
    if on_diag is not None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        extra = ["--diag-fd", str(theirs.fileno())]
    cmd = sandbox.wrap([sys.executable, "-m", "lab_src.harness.zygote", *extra], writable=run_dir, env=own)
    log_path = run_dir / "zygote.log"
    started = time.monotonic()
    stopped, done, codes, ended = None, 0, {}, None
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=run_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True, text=True, bufsize=1,
                                pass_fds=(theirs.fileno(),) if theirs is not None else ())
        if theirs is not None:
            theirs.close()
        replies: list[str] = []
        reader = threading.Thread(target=lambda: replies.extend(proc.stdout), daemon=True)
        reader.start()

        def wait_for(prefix: str, watchdog) -> str | None:
            nonlocal stopped, ended
            while True:
                for line in list(replies):
                    if line.startswith(prefix):
                        replies.remove(line)
                        return line
                if proc.poll() is not None and not reader.is_alive():
                    stopped = stopped or f"the sandbox ended (status {proc.returncode})"
                    ended = proc.returncode if ended is None else ended
                    return None
                if time.monotonic() - started > deadline_s:
                    stopped = f"deadline of {deadline_s:.0f} s"
                elif watchdog is not None:
                    stopped = watchdog()
                if stopped:
                    return None
                time.sleep(poll_s)
        try:
            ready = wait_for("READY", None) is not None
            if on_diag is not None:
                on_diag(*_received_diag(ours, ready))
            if ready:
                for i, (spec, nproc) in enumerate(groups):
                    if before_group:
                        before_group(i)
                    proc.stdin.write(f"GROUP {spec} {nproc}\n")
                    proc.stdin.flush()
                    line = wait_for("DONE", make_watchdog(i, nproc))
                    if line is None:
                        break
                    codes = {int(r): c for r, c in json.loads(line.split(" ", 1)[1]).items()}
                    if after_group:
                        after_group(i)
                    done += 1
                    if any(codes.values()):
                        stopped = "a rank exited during the group (" + ", ".join(
                            f"rank {r}: {exit_text(c)}" for r, c in sorted(codes.items()) if c) + ")"
                        break
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)   # the sandbox, and every process in it, end here
            except ProcessLookupError:
                pass
            proc.wait()
    wall = time.monotonic() - started
    rank_logs = {r: tail(p) for r, p in runfolder.rank_logs(run_dir).items()}
    agents = tail(run_dir / "torchrun.log", 8000)      # the elastic agents' own output (harness/elastic.py)
    return Launch(0 if not stopped else None, stopped, wall, tail(log_path, 8000) + agents, rank_logs, 0, codes, done,
                  ended)


def worker_env(extra: dict | None = None) -> dict:
    """Environment for worker processes: the lab_src that this process uses must be the one they import."""
    here = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH", "")] if p)
    env = {"PYTHONPATH": path, "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}
    env.update(extra or {})
    return env


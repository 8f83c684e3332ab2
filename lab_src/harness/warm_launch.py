"""The launching side of the warm launcher (harness/warm.py): one warm process per kernel, started in the
background when the notebook loads lab_src (`%load_ext lab_src`) or at the first check, and the launch of
a visible check through it, with the deadline and watchdog of `launcher.launch`.

    LAB_LAUNCH=torchrun     # the old way instead: a `torchrun --standalone` subprocess per check

If the warm process dies (killed, out of memory), the check running reports it, and the next check
starts a new one. It holds about 260 MB (torch imported; 187–193 MiB of proportional memory, PSS), and a hub
user may have eight notebooks open: a warm process that has started nothing for IDLE_S (2 minutes) goes
(`_release_if_idle`, under the launch lock, so never during a launch), and the next check starts a new one in
about 3 s. At 5 minutes, seven notebooks each checked or studied within 5 minutes held seven launchers,
about 1.3 GiB on top of their kernels (benchmarks/README.md, "What a study leaves in the kernel").
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
from pathlib import Path

from lab_src.harness import runfolder
from lab_src.harness.launcher import Launch, tail, worker_env


def use_warm() -> bool:
    return os.environ.get("LAB_LAUNCH", "warm") != "torchrun"


class WarmProcess:
    """A running `python -m lab_src.harness.warm`, and the lines it has answered."""

    def __init__(self, env: dict):
        self.pythonpath, self.owner = env.get("PYTHONPATH", ""), os.getpid()
        full = {**os.environ, **env, "LAB_WARM_PARENT": str(os.getpid()), "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": os.environ.get("LAB_OMP_THREADS", "1"), "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "lab_src.harness.warm"], env=full,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     start_new_session=True, text=True, bufsize=1)
        self.replies: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.replies.append(line)

    def take(self, prefix: str) -> str | None:
        for line in list(self.replies):
            if line.startswith(prefix):
                self.replies.remove(line)
                return line
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def death(self) -> str:
        code = self.proc.poll()
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"ended (status {code})"
        return (f"the warm launcher that starts the ranks (pid {self.proc.pid}) was {how} during the check; "
                f"the next check starts a new one")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


_warm: WarmProcess | None = None
_lock = threading.Lock()
# seconds without a launch after which the warm process goes (0: never): LAB_WARM_IDLE_S
IDLE_S = float(os.environ.get("LAB_WARM_IDLE_S", "120"))
_idle_timer: threading.Timer | None = None
_last_used = 0.0


def _arm_idle() -> None:
    """(Re)start the countdown after which an unused warm process goes."""
    global _idle_timer, _last_used
    _last_used = time.monotonic()
    if _idle_timer is not None:
        _idle_timer.cancel()
    if IDLE_S > 0:
        _idle_timer = threading.Timer(IDLE_S, _release_if_idle)
        _idle_timer.daemon = True
        _idle_timer.start()


def _release_if_idle() -> None:
    global _warm
    with _lock:         # a launch in progress holds it: the countdown fired during it waits, then finds it used
        if time.monotonic() - _last_used < IDLE_S * 0.99:
            return
        if _warm is not None and _warm.owner == os.getpid():
            _warm.stop()
            _warm = None


def warm_process(env: dict) -> WarmProcess:
    """This process's warm launcher, started now if there is none alive (for the same PYTHONPATH)."""
    global _warm
    if _warm is not None and _warm.owner != os.getpid():      # a forked copy of this process: not ours
        _warm = None
    if _warm is None or not _warm.alive() or _warm.pythonpath != env.get("PYTHONPATH", ""):
        if _warm is not None:
            _warm.stop()
        _warm = WarmProcess(env)
    return _warm


def warm_pid() -> int | None:
    """The pid of this process's warm launcher, if it has one alive."""
    return _warm.proc.pid if _warm is not None and _warm.owner == os.getpid() and _warm.alive() else None


def prestart() -> None:
    """Start the warm launcher in the background (it imports torch while the student reads)."""
    if not use_warm():
        return
    with _lock:
        warm_process(worker_env())
    _arm_idle()


def launch(nproc: int, spec_path: Path, *, run_dir: Path, deadline_s: float, watchdog=None,
           env: dict | None = None, poll_s: float = 0.02) -> Launch:
    """Run the worker on `spec_path` in `nproc` ranks forked by the warm launcher; as `launcher.launch`
    (stop at `deadline_s` or when `watchdog()` gives a reason; nothing survives the launch)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env or {})
    log_path = run_dir / "torchrun.log"
    log_path.unlink(missing_ok=True)
    with _lock:
        started = time.monotonic()
        warm = warm_process(env)
        job = {"spec": str(spec_path), "nproc": nproc, "run_dir": str(run_dir), "log": str(log_path),
               "run_id": uuid.uuid4().hex,
               # what a torchrun subprocess would get: this process's environment now (LAB_BACKEND set in
               # the notebook after the warm launcher started, say), less what only matters at import
               "env": {k: v for k, v in {**os.environ, **env}.items() if not k.startswith("PYTHON")}
               | {"LAB_RUN_DIR": str(run_dir)}}
        stopped, agent, done = None, None, None
        global _last_used
        _last_used = time.monotonic()       # in use: a countdown that fires now finds it so
        try:
            warm.proc.stdin.write("LAUNCH " + json.dumps(job) + "\n")
            warm.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        try:
            while done is None:
                line = warm.take("STARTED")
                if line:
                    agent = int(line.split()[1])
                line = warm.take("DONE")
                if line:
                    done = json.loads(line.split(" ", 1)[1])
                    break
                if not warm.alive() and not warm.reader.is_alive() and not any(
                        r.startswith("DONE") for r in warm.replies):
                    stopped = warm.death()
                    break
                if time.monotonic() - started > deadline_s:
                    stopped = f"deadline of {deadline_s:.0f} s"
                elif watchdog is not None:
                    stopped = watchdog()
                if stopped:
                    break
                time.sleep(poll_s)
        finally:
            if done is None and warm.alive():
                # a deadline, the watchdog, or an interrupt in the notebook: end the agent and its ranks;
                # the warm process then clears what is left and answers
                if agent is not None:
                    try:
                        os.killpg(agent, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                until = time.monotonic() + 5
                while done is None and warm.alive() and time.monotonic() < until:
                    line = warm.take("DONE")
                    done = json.loads(line.split(" ", 1)[1]) if line else None
                    time.sleep(poll_s)
                if done is None:
                    warm.stop()
        _arm_idle()             # still under the lock: a countdown waiting for it finds the process just used
    wall = time.monotonic() - started
    codes = {int(r): c for r, c in (done or {}).get("codes", {}).items()}
    status = None if stopped else (0 if done and done["status"] == 0 and not any(codes.values()) else 1)
    rank_logs = {r: tail(p) for r, p in runfolder.rank_logs(run_dir).items()}
    return Launch(status, stopped, wall, tail(log_path), rank_logs, (done or {}).get("swept", 0), codes)

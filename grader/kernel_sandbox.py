"""The kernels nbgrader starts to execute submitted notebooks, run in the grading sandbox.

nbgrader's `Execute` step (an nbclient `NotebookClient`) starts one kernel per notebook with the
kernel manager named in the course config (grader/course.py):

    c.Execute.kernel_manager_class = "grader.kernel_sandbox.SandboxedKernelManager"

The kernel runs the student's cells, so it gets what the hidden tests' workers get
(lab_src/harness/sandbox.py): the system, the environment and `lab_src` read-only, the notebook's own
folder (autograded/<student>/<assignment>/) writable, no network, no other process, an unprivileged uid
as root. It talks to nbgrader over ZeroMQ's `ipc` transport: Unix sockets in a short folder of its own
under /tmp (a socket path must stay under 108 bytes), bound into the sandbox at the same path, with
the connection file beside them. The grader's timeline pictures of this student are bound read-only.

Interrupts (a cell past its timeout) travel as a control message, not a signal: the kernel is in a
PID namespace of its own, where nbgrader's signal could not reach it.

Kernels start from a fork server (lab_src/harness/kernel_zygote.py): one sandbox per student's
nbgrader run, in which torch, matplotlib and ipykernel are imported once and each notebook's kernel is
forked (about 1.5 s of CPU saved per notebook, a third of autograding). When autograding names the
student's whole autograded folder (SHARED, set by grader/autograde.py), one fork server serves every
assignment of the student: its sandbox's writable folder is autograded/<student>/, and each kernel is
forked into its own notebook's folder (its working directory and HOME, owned by the sandbox's uid; the
student's folder itself stays the grader's, read-only to the kernels). Without it, one per notebook folder. nbgrader's kernel manager
holds a small stand-in process per kernel (grader/kernel_shim.py) that lives and dies with it. The
sandbox is the one each kernel had before (same binds, same uid); when a kernel ends, every other
process left in it is killed. Where the fork server cannot start, each kernel gets a sandbox of its own.

With `--unsafe-no-sandbox` (LAB_UNSAFE_NO_SANDBOX=1 in nbgrader's environment) the kernel starts as
nbgrader would start it; grading has refused already where no sandbox can start.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

from lab_src.grading import GRADER_TIMELINES
from lab_src.harness import limits, sandbox

UNSAFE = "LAB_UNSAFE_NO_SANDBOX"
NO_ZYGOTE = "LAB_KERNEL_NO_FORK_SERVER"      # "1": a sandbox of its own per kernel (benchmarks compare the two)
SHARED = "LAB_KERNEL_STUDENT_FOLDER"         # autograded/<student>/: one fork server for all its assignments
# What the kernel's environment keeps of nbgrader's: that it is grading, and where the grader's pictures are.
PASSED = ("NBGRADER_EXECUTION", GRADER_TIMELINES, "NBGRADER_VALIDATING")


SHIM = Path(__file__).with_name("kernel_shim.py")


class KernelZygote:
    """One fork server in a sandbox, for the kernels of the notebook folders in `folder` (see the module's
    docstring): `folder` itself, or a student's autograded folder that holds one folder per assignment."""

    def __init__(self, folder: Path, env: dict, pictures: tuple):
        self.dir = Path(tempfile.mkdtemp(prefix="ppz-", dir="/tmp"))    # short: socket paths < 108 bytes
        self.socket = self.dir / "z"
        if os.geteuid() == 0:
            uid = sandbox.grading_uid(folder)
            os.chown(self.dir, uid, uid)
        cmd = sandbox.wrap([sys.executable, "-m", "lab_src.harness.kernel_zygote", str(self.socket)],
                           writable=folder, env=env, read_only=pictures, also_writable=(self.dir,))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], limits.KERNEL_ZYGOTE_READY_S)
        if not ready or self.proc.stdout.readline().strip() != b"READY":
            self.close()
            raise RuntimeError(f"the kernels' fork server did not start within {limits.KERNEL_ZYGOTE_READY_S} s")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kernel_dir(self) -> Path:
        """A folder for one kernel's sockets and connection file, inside the one bound into the sandbox."""
        return Path(tempfile.mkdtemp(prefix="k", dir=self.dir))

    def close(self) -> None:
        try:
            self.proc.stdin.close()              # the server kills what is left in its sandbox and ends
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_zygotes: dict[tuple, KernelZygote | None] = {}      # None: it could not start, and is not tried again


def sandbox_home(folder: Path) -> Path:
    """The writable folder of the fork server's sandbox for a kernel in `folder`: the student's autograded
    folder that autograding names (SHARED) when `folder` lies inside it, else `folder` itself."""
    shared = os.environ.get(SHARED)
    if shared and Path(shared).resolve() in folder.parents:
        return Path(shared).resolve()
    return folder


def zygote_for(folder: Path, env: dict, pictures: tuple, log) -> KernelZygote | None:
    """The running fork server for kernels in `folder` with `env`, started if needed; None if it cannot start."""
    key = (str(folder), tuple(sorted(env.items())), pictures)
    if key in _zygotes and (_zygotes[key] is None or _zygotes[key].alive()):
        return _zygotes[key]
    try:
        _zygotes[key] = KernelZygote(folder, env, pictures)
    except (OSError, RuntimeError) as e:
        log.warning("the kernels' fork server could not start (%s): each kernel gets a sandbox of its own", e)
        _zygotes[key] = None
    return _zygotes[key]


@atexit.register
def _close_zygotes() -> None:
    for z in filter(None, _zygotes.values()):
        z.close()
    _zygotes.clear()


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels run in the grading sandbox (see the module's docstring)."""

    _socket_dir: Path | None = None

    @property
    def sandboxed(self) -> bool:
        return os.environ.get(UNSAFE) != "1"

    async def _async_pre_start_kernel(self, **kw):
        if not self.sandboxed:
            return await super()._async_pre_start_kernel(**kw)
        folder = Path(kw.get("cwd") or os.getcwd()).resolve()
        env = {**os.environ, **(kw.get("env") or {})}          # what the kernel's environment would be made of
        passed = {k: env[k] for k in PASSED if env.get(k)}
        passed.update(MPLBACKEND="agg", IPYTHONDIR="/tmp/ipython", MPLCONFIGDIR="/tmp/matplotlib")
        pictures = (env[GRADER_TIMELINES],) if env.get(GRADER_TIMELINES) and Path(env[GRADER_TIMELINES]).is_dir() else ()
        home = sandbox_home(folder) if os.environ.get(NO_ZYGOTE) != "1" else folder
        sandbox.prepare(folder)
        if home != folder and os.geteuid() == 0:    # the notebook's folder is written by the sandbox's uid
            uid = sandbox.grading_uid(home)
            os.chown(folder, uid, uid)
        zygote = zygote_for(home, passed, pictures, self.log) if os.environ.get(NO_ZYGOTE) != "1" else None
        if zygote is None and home != folder:       # a sandbox of its own: the folder is its own again
            home = folder
            sandbox.prepare(folder)
        self._socket_dir = zygote.kernel_dir() if zygote else Path(tempfile.mkdtemp(prefix="ppk-", dir="/tmp"))
        self.transport = "ipc"
        self.ip = str(self._socket_dir / "k")
        self.connection_file = str(self._socket_dir / "kernel.json")
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        if os.geteuid() == 0:            # the kernel's own uid must read the connection file and make its sockets
            uid = sandbox.grading_uid(home)
            for path in (self._socket_dir, Path(self.connection_file)):
                os.chown(path, uid, uid)
        if zygote:
            request = json.dumps({"connection_file": self.connection_file, "cwd": str(folder),
                                  "env": {**passed, "HOME": str(folder)}})
            return [sys.executable, "-I", "-S", str(SHIM), str(zygote.socket), request], kw
        cmd = sandbox.wrap(cmd, writable=folder, env=passed, read_only=pictures, also_writable=(self._socket_dir,))
        return cmd, kw

    pre_start_kernel = _async_pre_start_kernel

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if self._socket_dir is not None and not restart:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    cleanup_resources = _async_cleanup_resources

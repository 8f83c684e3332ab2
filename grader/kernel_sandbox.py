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

With `--unsafe-no-sandbox` (LAB_UNSAFE_NO_SANDBOX=1 in nbgrader's environment) the kernel starts as
nbgrader would start it; grading has refused already where no sandbox can start.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

from lab_src.grading import GRADER_TIMELINES
from lab_src.harness import sandbox

UNSAFE = "LAB_UNSAFE_NO_SANDBOX"
# What the kernel's environment keeps of nbgrader's: that it is grading, and where the grader's pictures are.
PASSED = ("NBGRADER_EXECUTION", GRADER_TIMELINES, "NBGRADER_VALIDATING")


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
        sandbox.prepare(folder)
        self._socket_dir = Path(tempfile.mkdtemp(prefix="ppk-", dir="/tmp"))
        self.transport = "ipc"
        self.ip = str(self._socket_dir / "k")
        self.connection_file = str(self._socket_dir / "kernel.json")
        if self.kernel_spec is not None:
            self.kernel_spec.interrupt_mode = "message"
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        if os.geteuid() == 0:            # the kernel's own uid must read the connection file and make its sockets
            uid = sandbox.grading_uid(folder)
            for path in (self._socket_dir, Path(self.connection_file)):
                os.chown(path, uid, uid)
        env = kw.get("env") or {}
        passed = {k: env[k] for k in PASSED if env.get(k)}
        passed.update(MPLBACKEND="agg", IPYTHONDIR="/tmp/ipython", MPLCONFIGDIR="/tmp/matplotlib")
        pictures = [env[GRADER_TIMELINES]] if env.get(GRADER_TIMELINES) and Path(env[GRADER_TIMELINES]).is_dir() else []
        cmd = sandbox.wrap(cmd, writable=folder, env=passed, read_only=tuple(pictures),
                           also_writable=(self._socket_dir,))
        return cmd, kw

    pre_start_kernel = _async_pre_start_kernel

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if self._socket_dir is not None and not restart:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    cleanup_resources = _async_cleanup_resources

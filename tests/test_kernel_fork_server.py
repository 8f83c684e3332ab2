"""The kernels nbgrader starts come from a fork server in the grading sandbox (grader/kernel_sandbox.py,
lab_src/harness/kernel_zygote.py): each behaves as a kernel of its own, a cell past its time is
interrupted, a kernel killed from outside ends, what a kernel leaves behind dies with it, and
nothing outlives the grading process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from lab_src.harness import sandbox

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot start a sandbox here")

# Runs as its own process, as nbgrader does: starts kernels with the course's kernel manager, runs cells
# in them, and prints what it saw, one line per fact.
DRIVER = textwrap.dedent('''
    import asyncio, json, os, signal, sys, time
    from grader.kernel_sandbox import SandboxedKernelManager, _zygotes

    SLEEPERS = ("import os; print(sum(open(f'/proc/{p}/comm').read().strip() == 'sleep' "
                "for p in os.listdir('/proc') if p.isdigit()))")
    MINE = "import os; open('mine', 'w').write('1'); print(os.getuid(), os.environ.get('NBGRADER_EXECUTION'), os.getcwd())"
    LEAVE = "import subprocess, time; subprocess.Popen(['sleep', '300'], start_new_session=True); time.sleep(0.5); "

    async def run(km, code, timeout=30):
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        msg_id = kc.execute(code)
        out, error = [], None
        while True:
            msg = await kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                error = msg["content"]["ename"]
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        kc.stop_channels()
        return "".join(out).strip(), error

    async def main(folder, student):
        os.environ["NBGRADER_EXECUTION"] = "autograde"
        first = SandboxedKernelManager()
        await first.start_kernel(cwd=folder)
        print("FIRST", json.dumps(await run(first, MINE)))
        # a process left behind, in a session of its own
        print("LEFT", json.dumps(await run(first, LEAVE + SLEEPERS)))
        print("SAME-ZYGOTE", len(_zygotes))
        await first.shutdown_kernel(now=False)
        second = SandboxedKernelManager()
        await second.start_kernel(cwd=folder)
        print("SECOND", json.dumps(await run(second, SLEEPERS)))
        kc = second.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        kc.execute("import time; time.sleep(120)")
        await asyncio.sleep(2)
        started = time.monotonic()
        await second.interrupt_kernel()
        while True:
            msg = await kc.get_iopub_msg(timeout=30)
            if msg["msg_type"] == "error":
                print("INTERRUPTED", msg["content"]["ename"], round(time.monotonic() - started, 1))
                break
        kc.stop_channels()
        print("ALIVE", await second.is_alive())
        shim = second.provisioner.process
        os.kill(shim.pid, signal.SIGKILL)          # what nbgrader does to a kernel that will not stop
        for _ in range(100):
            if not await second.is_alive():
                break
            await asyncio.sleep(0.1)
        print("KILLED", not await second.is_alive())
        await second.shutdown_kernel(now=True)
        third = SandboxedKernelManager()
        await third.start_kernel(cwd=folder)
        print("THIRD", json.dumps(await run(third, "print(open('mine').read())")))
        await third.shutdown_kernel(now=False)
        print("ZYGOTES", len(_zygotes))
        # autograding a student's several assignments: one fork server, each kernel in its own folder
        os.environ["LAB_KERNEL_STUDENT_FOLDER"] = student
        for sub in ("a", "b"):
            km = SandboxedKernelManager()
            await km.start_kernel(cwd=os.path.join(student, sub))
            print("SHARED-" + sub, json.dumps(await run(km, MINE + "; print(os.environ['HOME']); "
                                                         "print(os.access('..', os.W_OK))")))
            await km.shutdown_kernel(now=False)
        print("ZYGOTES-SHARED", len(_zygotes))

    asyncio.run(main(sys.argv[1], sys.argv[2]))
''')


def processes_in(folder: Path) -> list[str]:
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        if (p.info["cwd"] or "").startswith(str(folder.resolve())):
            found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}")
    return found


def test_kernels_forked_in_the_sandbox_behave_as_kernels_of_their_own(tmp_path, no_leftovers):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    student = tmp_path / "autograded" / "ada"          # two assignments' folders of one student
    for sub in ("a", "b"):
        (student / sub).mkdir(parents=True)
    root = Path(__file__).resolve().parents[1]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(folder), str(student)], cwd=tmp_path,
                          capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    uid, execution, cwd = json.loads(lines["FIRST"])[0].split()
    if os.geteuid() == 0:
        assert int(uid) == sandbox.grading_uid(folder)
    assert execution == "autograde" and cwd == str(folder.resolve())
    assert lines["SAME-ZYGOTE"] == "1"
    assert json.loads(lines["LEFT"])[0] == "1" and json.loads(lines["SECOND"])[0] == "0", \
        "the first kernel's leftover process died with it"
    assert lines["INTERRUPTED"].split()[0] == "KeyboardInterrupt" and float(lines["INTERRUPTED"].split()[1]) < 10
    assert lines["ALIVE"] == "True" and lines["KILLED"] == "True"
    assert json.loads(lines["THIRD"])[0] == "1", "the folder is the notebooks' own, kernel after kernel"
    for sub in ("a", "b"):        # one fork server for the student's folder; each kernel in its own
        uid, execution, cwd, home, parent_writable = " ".join(json.loads(lines[f"SHARED-{sub}"])[0].split()).split()
        assert cwd == home == str((student / sub).resolve()) and (student / sub / "mine").exists()
        if os.geteuid() == 0:     # the sandbox's uid owns the notebook folders, not the student's folder
            assert int(uid) == sandbox.grading_uid(student) and parent_writable == "False"
    assert lines["ZYGOTES-SHARED"] == "2"
    assert time.monotonic() - started < 120
    assert processes_in(folder) == [] and processes_in(student) == []


def test_a_fork_server_that_cannot_start_is_tried_once_and_said(monkeypatch, tmp_path):
    """Where the fork server cannot start, every kernel gets a sandbox of its own: the failure is logged
    once, and the next kernels do not wait for another try."""
    import logging

    from grader import kernel_sandbox
    tries = []

    def broken(*args):
        tries.append(args)
        raise RuntimeError("the kernels' fork server did not start within 120 s")
    monkeypatch.setattr(kernel_sandbox, "KernelZygote", broken)
    monkeypatch.setattr(kernel_sandbox, "_zygotes", {})
    log = logging.getLogger("test-kernel-fork-server")
    records = []
    log.addHandler(type("Keep", (logging.Handler,), {"emit": lambda self, r: records.append(r.getMessage())})())
    for _ in range(3):
        assert kernel_sandbox.zygote_for(tmp_path, {"NBGRADER_EXECUTION": "autograde"}, (), log) is None
    assert len(tries) == 1
    assert records == ["the kernels' fork server could not start (the kernels' fork server did not start within "
                       "120 s): each kernel gets a sandbox of its own"]

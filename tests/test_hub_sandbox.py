"""The grading sandbox as a hub's instructor runs it: as an ordinary Unix user, not root.

Under root, lab_src/harness/sandbox.py drops each launch to a uid of its own; an instructor's account
cannot, so bubblewrap makes an unprivileged user namespace instead (`--unshare-all`). This runs the
probe of tests/test_sandbox.py that way, as `nobody`, with the hub's single-user environment (a Python
every user can run, hub/setup.sh): what the process inside reaches, its limits, its namespace, and
that nothing outlives it. tests/test_hub.py autogrades as the instructor through the same path.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from test_sandbox import PROBE

from conftest import ROOT

DRIVER = textwrap.dedent('''
    import json, os, subprocess, sys
    from pathlib import Path
    from lab_src.harness import sandbox
    folder, readable, writable, sleep = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    out = {"available": sandbox.available()}
    run = folder / "run"
    sandbox.prepare(run)
    (run / "probe.py").write_text((folder / "probe.py").read_text())
    cmd = sandbox.wrap([sys.executable, "probe.py", readable, writable, sleep], writable=run,
                       env={"LAB_RUN_TAG": "probe"})
    out["bwrap_args"] = cmd[:3]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out["rc"], out["stderr"] = proc.returncode, proc.stderr[-2000:]
    out["probe"] = json.loads((run / "result.json").read_text()) if proc.returncode == 0 else None
    ns = sandbox.wrap([sys.executable, "-c", "import os; print(os.readlink('/proc/self/ns/user'))"], writable=run)
    out["userns_inside"] = subprocess.run(ns, capture_output=True, text=True, timeout=60).stdout.strip()
    out["userns_outside"] = os.readlink("/proc/self/ns/user")
    print(json.dumps(out))
''')


def test_the_sandbox_of_an_unprivileged_grader():
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user (setpriv)")
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is missing (scripts/system_deps.sh installs it)")
    sys.path.insert(0, str(ROOT / "hub"))
    from localhub import build_environment
    python = build_environment() / "venv" / "bin" / "python"
    user = pwd.getpwnam("nobody")
    folder = Path(tempfile.mkdtemp(prefix="pp-lab-userns-"))
    try:
        os.chmod(folder, 0o755)
        os.chown(folder, user.pw_uid, user.pw_gid)
        secret = folder / "secret.txt"            # the grader's own file: readable by the user, not inside
        secret.write_text("the reference")
        (folder / "probe.py").write_text(PROBE)
        for p in (secret, folder / "probe.py"):
            os.chown(p, user.pw_uid, user.pw_gid)
        inside = "/opt/pp-lab/lab_src/registry.py"
        sleep = f"300.{uuid.uuid4().int % 10**9}"        # the probe leaves `sleep <this>` behind: ours alone
        readable = [ROOT / "solutions" / "pipeline_lab" / "q08_afab_step.ipynb", ROOT / "grader" / "trusted.py",
                    secret, inside]
        writable = ["/opt/pp-lab/lab_src/pwned.py", folder / "pwned", "/tmp/ok.txt", folder / "run" / "ok.txt"]
        assert os.access(readable[0], os.R_OK) and (readable[0].stat().st_mode & 0o004), \
            "the solutions are world-readable outside: only the sandbox can hide them"
        proc = subprocess.run(
            ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--reset-env", "--",
             "env", f"PATH={python.parent}:/usr/bin:/bin", f"PYTHONPATH={ROOT}", f"HOME={folder}",
             f"TMPDIR={folder}", "LANG=C.UTF-8", str(python), "-c", DRIVER, str(folder),
             ",".join(map(str, readable)), ",".join(map(str, writable)), sleep],
            cwd=folder, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["available"], "bubblewrap could not start a sandbox as an unprivileged user"
        assert "--unshare-all" in out["bwrap_args"], out["bwrap_args"]
        assert out["rc"] == 0, out["stderr"]
        probe = out["probe"]
        assert probe["uid"] == user.pw_uid
        assert probe["read"] == {str(readable[0]): False, str(readable[1]): False, str(secret): False, inside: True}
        # the grader's folder, writable by the user outside: inside, only a scratch copy of its path exists
        # (bubblewrap builds the run folder's parents in the sandbox's own root), so nothing reaches it
        assert not (folder / "pwned").exists()
        assert {k: v for k, v in probe["write"].items() if k != str(writable[1])} == \
            {writable[0]: False, "/tmp/ok.txt": True, str(writable[3]): True}
        assert probe["network"] is False
        assert 0 < probe["forks"] < 512, "the process limit holds"
        assert out["userns_inside"] and out["userns_inside"] != out["userns_outside"], out
        # the probe's `sleep`, in a session of its own, dies with the sandbox's PID namespace
        deadline = time.monotonic() + 10
        while True:
            left = [p.pid for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[:2] == ["sleep", sleep]]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert not left, f"a process outlived the unprivileged sandbox: {left}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)

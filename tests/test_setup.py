"""README's commands on a machine that lacks the system packages they use.

Every command README names installs what its own path needs (scripts/system_deps.sh, one table), or, where it
cannot (not root, no apt-get), says once, before any work, what is missing and the one command that installs it.
These tests hide the tools from the command (a PATH of links to the machine's programs, less the hidden ones,
apt-get among them) and run the real command: `make demo` then stops in a second or two with that message,
instead of running the pipeline and failing every student's grading on it.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

DEPS = ROOT / "scripts" / "system_deps.sh"
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def tools_of(command: str) -> list[str]:
    out = subprocess.run([str(DEPS), "--list", command], capture_output=True, text=True, check=True).stdout
    return out.split()


def path_without(folder: Path, hidden: set[str]) -> str:
    """A PATH that finds every program of this machine but `hidden` (links in `folder`), then the venv."""
    folder.mkdir(parents=True, exist_ok=True)
    for d in BIN_DIRS:
        if not os.path.isdir(d) or os.path.islink(d):
            continue
        for name in os.listdir(d):
            target = os.path.join(d, name)
            if name in hidden or (folder / name).exists() or not os.access(target, os.X_OK) \
                    or os.path.isdir(target):
                continue
            (folder / name).symlink_to(target)
    return f"{ROOT / '.venv' / 'bin'}:{folder}"


def run_until(cmd: list[str], env: dict, *, work_started: str, timeout: float = 90) -> tuple[int | None, str, float]:
    """Run `cmd` from the checkout; stop it (its whole process group) as soon as its output shows that the
    work began (`work_started`), or after `timeout`. Returns (exit status or None when stopped, output, s)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, stopped = [], False
    try:
        for line in proc.stdout:
            lines.append(line)
            if work_started in line or time.monotonic() - started > timeout:
                stopped = True
                break
        if not stopped:     # its output ended: it is exiting (or closed its output and goes on: stop it then)
            try:
                proc.wait(max(1.0, timeout - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                pass
    finally:
        code = proc.poll()
        if code is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
            code = None
        proc.stdout.close()
    return code, "".join(lines), time.monotonic() - started


@pytest.fixture
def hidden_env(tmp_path):
    def make(*hidden: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAB_", "PYTEST", "MAKE"))}
        env["PATH"] = path_without(tmp_path / "bin", {*hidden, "apt-get"})
        return env
    return make


def readme_make_targets() -> set[str]:
    """The Makefile's targets that README names (`make demo`, `sudo make hub`, ...)."""
    defined = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    return defined & set(re.findall(r"\bmake ([a-z][a-z-]*)\b", (ROOT / "README.md").read_text()))


def test_every_make_command_readme_names_runs_the_set_up_of_its_own_tools():
    """Each `make X` of README (dry run: the commands make would run) calls scripts/system_deps.sh X, directly
    or through the one script it runs; and the table names a tool for each command whose path needs one."""
    targets = readme_make_targets()
    assert {"demo", "test", "hub", "train", "benchmark"} <= targets, targets
    for target in sorted(targets):
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True).stdout
        scripts = re.findall(r"(scripts/[\w.]+\.sh)", dry)
        text = dry + "".join((ROOT / s).read_text() for s in scripts if s != "scripts/system_deps.sh")
        assert re.search(rf"scripts/system_deps\.sh {target}\b", text), \
            f"make {target} never runs `scripts/system_deps.sh {target}` (it runs: {dry.strip()[:300]})"
    # the grading commands run every student's code in bubblewrap; the hub needs its proxy (npm) and grading
    assert "bwrap" in tools_of("demo") and "bwrap" in tools_of("grade") and "bwrap" in tools_of("benchmark")
    assert {"bwrap", "npm"} <= set(tools_of("hub"))
    assert {"bwrap", "chromium", "slurmctld", "slurmd", "sbatch", "munged", "npm"} <= set(tools_of("test"))


def test_make_demo_without_bubblewrap_says_so_once_before_any_work(hidden_env):
    """The fresh machine of issue 39: no bubblewrap, and here no way to install it (apt-get hidden too)."""
    code, out, took = run_until(["make", "demo"], hidden_env(*tools_of("demo")),
                                work_started="1. The reference pipeline")
    assert "1. The reference pipeline" not in out, f"make demo started its work without bubblewrap:\n{out[-2000:]}"
    assert code == 2, f"make demo exited {code} after {took:.0f} s:\n{out[-2000:]}"
    assert out.count("bubblewrap") >= 1 and "sudo apt-get install --no-install-recommends bubblewrap" in out, out
    assert out.count("cannot run here") == 1, out


def test_the_demo_itself_checks_the_sandbox_before_the_pipeline(hidden_env):
    """`python -m grader.demo` run by hand (not through make) says the same once, before step 1."""
    code, out, took = run_until([sys.executable, "-m", "grader.demo", "--out", "out/test-setup-demo"],
                                hidden_env("bwrap"), work_started="1. The reference pipeline")
    assert code == 2 and "1. The reference pipeline" not in out, out[-2000:]
    assert "bubblewrap (bwrap)" in out and "sudo apt-get install bubblewrap" in out, out


def test_make_hub_without_its_tools_names_them_all_before_starting(hidden_env):
    code, out, took = run_until(["make", "hub"], hidden_env(*tools_of("hub")), work_started="hub/localhub.py")
    assert code == 2, f"make hub exited {code}:\n{out[-2000:]}"
    assert "bubblewrap" in out and "npm" in out and "localhub" not in out, out


def test_autograde_without_bubblewrap_says_so_once(hidden_env, tmp_path):
    """`grader autograde` with two returned submissions: one message and exit 2, not a failure per student."""
    from grader.cli import collect_folder
    from grader.cohort import BY_NAME, build_cohort
    from grader.course import Course
    course = Course(tmp_path / "course", release=tmp_path / "release")
    build_cohort(tmp_path / "cohort", [BY_NAME["untouched"], BY_NAME["basil"]])
    one = course.each("pipeline_lab")[0]
    collect_folder(one, tmp_path / "cohort")
    code, out, took = run_until([sys.executable, "-m", "grader", "--course", str(tmp_path / "course"), "autograde",
                                 "--assignment", "pipeline_lab"], hidden_env("bwrap"), work_started="FAILED")
    assert code == 2 and "FAILED" not in out, out[-2000:]
    assert out.count("bubblewrap (bwrap)") == 1, out

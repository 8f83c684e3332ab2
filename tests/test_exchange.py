"""The grader with nbgrader's exchange, without a hub (tests/test_hub.py does it all in a browser):
release into an exchange, students fetching and submitting with nbgrader's own commands and the
hub's student config (hub/localhub.py), and `grader collect --exchange` telling what it found.
Bad input: a submission while a check runs and one with a renamed notebook (refused with a clear
message, nothing reaches the exchange), a second submission (the later counts, the earlier stays), a
submission missing a notebook made anyway (the grader names it)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from grader import exchange
from grader.cli import main as grader_cli
from grader.course import COURSE_ID, Course
from lab_src.registry import ASSIGNMENT, EXERCISES, MODULES

from conftest import ROOT

sys.path.insert(0, str(ROOT / "hub"))
from localhub import nbgrader_config  # noqa: E402

pytestmark = pytest.mark.slow      # a dozen nbgrader commands: 3.5 minutes on 2 loaded cores


def flat(text: str) -> str:
    """Whitespace collapsed: nbgrader's log and the panel's dialog break and indent messages differently."""
    return " ".join(text.split())


def test_exchange_round_trip_with_the_grader(tmp_path, capsys):
    root = tmp_path / "exchange"
    root.mkdir()
    course = Course(tmp_path / "course", release=tmp_path / "release")
    exchange.release(course, str(root))
    outbound = root / COURSE_ID / "outbound" / ASSIGNMENT
    assert sorted(p.name for p in outbound.glob("*.ipynb")) == sorted(EXERCISES[q].notebook for q in MODULES[ASSIGNMENT])
    assert (outbound / "README.md").exists()       # the assignment's index, fetched with it
    assert not list(outbound.rglob("answers")) and (root.stat().st_mode & 0o777) == 0o777

    config = tmp_path / "etc"               # what every user of the hub reads
    config.mkdir()
    (config / "nbgrader_config.py").write_text(nbgrader_config(root))

    def student(name: str, *args: str) -> subprocess.CompletedProcess:
        home = tmp_path / name
        home.mkdir(exist_ok=True)
        env = {**os.environ, "USER": name, "LOGNAME": name, "HOME": str(home), "JUPYTER_CONFIG_PATH": str(config)}
        if args[0] == "submit":             # as root here: say who submits (on a hub, the Unix user)
            args = (*args, f"--student={name}")
        return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=home, env=env, capture_output=True,
                              text=True, timeout=120)

    for name in ("ana", "ben"):
        assert student(name, "fetch_assignment", ASSIGNMENT).returncode == 0
        work = tmp_path / name / ASSIGNMENT
        (work / "answers").mkdir()
        (work / "answers" / "q05_distribute_layers.py").write_text("def distribute_layers(): pass\n")
        (work / "runs" / "q05-1").mkdir(parents=True)
    inbound = root / COURSE_ID / "inbound"

    # Ana's check is still running (a process standing in for its torchrun): refused, nothing lost
    run = tmp_path / "ana" / ASSIGNMENT / "runs" / "q08-20260101-000000-1"
    run.mkdir(parents=True)
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "torch.distributed.run"], cwd=run)
    try:
        proc = student("ana", "submit", ASSIGNMENT)
    finally:
        fake.kill()
        fake.wait()
    assert proc.returncode != 0 and "NOT SUBMITTED. A check is still running (q08 for " in flat(proc.stderr), proc.stderr
    assert "wait for it to finish, save your notebooks" in flat(proc.stderr) and "Nothing was changed" in proc.stderr
    assert not list(inbound.glob("ana+*"))
    # Ana submits twice
    for _ in range(2):
        proc = student("ana", "submit", ASSIGNMENT)
        assert proc.returncode == 0, proc.stderr
    # Ben renamed q09: refused, with what is missing and what looks renamed; nothing reaches the exchange
    work = tmp_path / "ben" / ASSIGNMENT
    (work / "q09_check_outputs.ipynb").rename(work / "q09_mine.ipynb")
    proc = student("ben", "submit", ASSIGNMENT)
    assert proc.returncode != 0
    assert "NOT SUBMITTED. These notebooks of pipeline_lab are not in your pipeline_lab folder: " \
           "q09_check_outputs.ipynb." in flat(proc.stderr), proc.stderr
    assert "(renamed?): q09_mine.ipynb." in flat(proc.stderr) and "Nothing was changed" in proc.stderr
    assert not list(inbound.glob("ben+*")) and (work / "q09_mine.ipynb").exists()
    # ... a submission made anyway (not strict) goes in, and the grader names the problem
    proc = student("ben", "submit", ASSIGNMENT, "--ExchangeSubmit.strict=False")
    assert proc.returncode == 0, proc.stderr
    subs = sorted(inbound.iterdir())
    assert [s.name.split("+")[0] for s in subs] == ["ana", "ana", "ben"]
    for sub in subs:   # what the checks write beside the notebooks is never submitted
        assert not (sub / "answers").exists() and not (sub / "runs").exists()

    capsys.readouterr()
    assert grader_cli(["--course", str(course.root), "collect", "--exchange", str(root)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"ana\s+submitted .*\(2 submissions in the exchange, the latest counts\)", out), out
    assert re.search(r"ben\s+submitted .*\(1 submission in the exchange\)", out), out
    assert "q09_check_outputs.ipynb is missing (scored 0)" in out
    assert "q09_mine.ipynb is not a notebook of the assignment (renamed or extra?): not graded" in out
    latest = sorted(inbound.glob("ana+*"), key=lambda p: (p / "timestamp.txt").read_text())[-1]
    assert (course.submitted("ana") / "timestamp.txt").read_text() == (latest / "timestamp.txt").read_text()
    assert course.students() == ["ana", "ben"]

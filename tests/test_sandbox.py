"""The sandbox every grading launch runs in (lab_src/harness/sandbox.py): what a process inside can and
cannot reach, its limits, that nothing outlives it, and that grading refuses to run without it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest

from lab_src.harness import sandbox

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sandbox.available(), reason="bubblewrap cannot start a sandbox here")

PROBE = textwrap.dedent('''
    import json, os, socket, subprocess, sys, time
    from pathlib import Path
    out = {"uid": os.getuid(), "cwd": os.getcwd()}
    def can_read(path):
        try:
            Path(path).read_bytes()[:1]
            return True
        except OSError:
            return False
    def can_write(path):
        try:
            Path(path).write_text("x")
            return True
        except OSError:
            return False
    out["read"] = {p: can_read(p) for p in sys.argv[1].split(",")}
    out["write"] = {p: can_write(p) for p in sys.argv[2].split(",")}
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=1).close()
        out["network"] = True
    except OSError:
        out["network"] = False
    out["env"] = sorted(os.environ)
    children = []
    try:
        for _ in range(5000):
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
    except OSError:
        pass
    out["forks"] = len(children)
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    subprocess.Popen(["sleep", sys.argv[3]], start_new_session=True, env={})     # a process left behind
    Path("result.json").write_text(json.dumps(out))
''')


def run_probe(tmp_path, readable, writable_targets):
    folder = tmp_path / "run"
    sandbox.prepare(folder)
    (folder / "probe.py").write_text(PROBE)
    sleep = f"300.{uuid.uuid4().int % 10**9}"        # this probe's own: other sandboxes may run beside it
    cmd = sandbox.wrap([sys.executable, "probe.py", ",".join(map(str, readable)), ",".join(map(str, writable_targets)),
                        sleep], writable=folder, env={"LAB_RUN_TAG": "probe"})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {**json.loads((folder / "result.json").read_text()), "sleep": sleep}


def test_a_sandboxed_process_reaches_only_its_folder(tmp_path):
    secret = tmp_path / "secret.txt"          # outside the run folder, like the grader's work files
    secret.write_text("the reference")
    readable = [ROOT / "solutions" / "pipeline_lab" / "q08_afab_step.ipynb", ROOT / "grader" / "trusted.py",
                secret, ROOT / "lab_src" / "registry.py", sandbox.INSIDE / "lab_src" / "registry.py"]
    writable = [sandbox.INSIDE / "lab_src" / "pwned.py", Path(sys.prefix) / "pwned", tmp_path / "pwned",
                "/tmp/ok.txt", tmp_path / "run" / "ok.txt"]
    out = run_probe(tmp_path, readable, writable)
    assert out["read"] == {str(readable[0]): False, str(readable[1]): False, str(secret): False,
                           str(readable[3]): False, str(readable[4]): True}, "only lab_src itself is visible"
    assert out["write"] == {str(writable[0]): False, str(writable[1]): False, str(writable[2]): False,
                            "/tmp/ok.txt": True, str(writable[4]): True}
    assert out["network"] is False
    assert "LAB_RUN_TAG" in out["env"] and not any(k.startswith(("SSH", "AWS", "GIT")) for k in out["env"])
    if os.geteuid() == 0:
        assert out["uid"] in sandbox.UIDS, "as root, the sandbox drops to a uid of its own"
    assert 0 < out["forks"] < sandbox.Limits().processes, "the process limit holds"


def test_a_figure_drawn_in_the_sandbox_says_nothing_on_stderr(tmp_path):
    """The timelines in the feedback are drawn in the sandbox (nbgrader's kernel): matplotlib's first
    drawing asks fontconfig for fonts, which printed "Fontconfig error: ..." under every figure."""
    folder = tmp_path / "draw"
    sandbox.prepare(folder)
    code = ("import matplotlib; matplotlib.use('agg'); import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(); ax.set_title('rank 0'); fig.savefig('figure.png')")
    proc = subprocess.run(sandbox.wrap([sys.executable, "-c", code], writable=folder, env={}),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and (folder / "figure.png").stat().st_size > 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == "", proc.stderr[-2000:]


def test_nothing_outlives_the_sandbox(tmp_path):
    sleep = run_probe(tmp_path, [], [])["sleep"]
    left = [p for p in psutil.process_iter(["cmdline", "uids"])
            if (p.info["cmdline"] or [])[:2] == ["sleep", sleep]]
    assert not left, f"a process started in a new session outlived the sandbox: {[p.pid for p in left]}"


def test_the_reference_cache_is_verified_not_trusted(tmp_path, monkeypatch):
    from grader.reference import reference_sources, reference_texts
    monkeypatch.setenv("LAB_CACHE", str(tmp_path / "cache"))
    paths = reference_sources()
    Path(paths["q05"]).write_text("def distribute_layers(num_layers, pp_rank, pp_size):\n    return [0]\n")
    assert Path(reference_sources()["q05"]).read_text() == reference_texts()["q05"]
    assert oct((tmp_path / "cache").stat().st_mode)[-3:] == "700"


@pytest.mark.slow
def test_grading_refuses_without_a_sandbox_unless_told(tmp_path, monkeypatch):
    from grader import trusted
    from grader.reference import source_dir
    monkeypatch.setattr(sandbox, "available", lambda: False)
    with pytest.raises(sandbox.SandboxUnavailable, match="--unsafe-no-sandbox"):
        trusted.grade_submission(source_dir(), tmp_path / "work", only=["q02"])
    result = trusted.grade_submission(source_dir(), tmp_path / "unsafe", only=["q02"], sandboxed=False)
    assert result["sandbox"].startswith("none")
    assert result["exercises"]["q02"]["fraction"] == 1.0
    assert any("WITHOUT a sandbox" in m for m in result["exercises"]["q02"]["messages"])


def test_no_group_of_cases_holds_what_its_exercises_are_judged_against(reference, tmp_path):
    """The hidden tests of a whole submission, grouped: no group holds the reference of an exercise it
    grades, and no group that holds a baseline grades an exercise judged on those numbers."""
    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    from lab_src.harness.runner import group_cases, holds
    from lab_src.registry import CODED
    ctx = Context(student=dict(reference), reference=reference, folder=tmp_path)
    cases = [c for ex in CODED for c in hidden_tests(ex.id).cases(ctx)]
    groups = group_cases(cases)
    assert sorted(c.index if c.index >= 0 else id(c) for g in groups for c in g) == \
        sorted(c.index if c.index >= 0 else id(c) for c in cases)
    for group in groups:
        graded = {c.qid for c in group}
        held = set().union(*(holds(c) for c in group))
        assert not graded & held, (graded, held)
    assert len(groups) <= 8     # q14's grids hold every pipeline reference and are judged on numbers: a group of their own

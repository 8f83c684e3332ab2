"""Ranks forked from a warm process under torch's elastic agent (harness/elastic.py, warm.py,
warm_launch.py): what a rank sees is what torchrun gives it, for the visible checks and in the grader's
sandbox; a killed warm launcher is reported and replaced; two kernels' checks share nothing; nothing
outlives the kernel."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from lab_src.harness import runfolder, sandbox, warm_launch
from lab_src.harness.case import Case
from lab_src.harness.runner import run_cases
from lab_src.pipeline.config import LabConfig

ROOT = Path(__file__).resolve().parents[1]
CFG = LabConfig()
TORCHRUN_ENV = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "GROUP_RANK", "ROLE_RANK"]

# The reference step, run by an answer that first looks at its environment as a student's code might,
# and calls init_process_group itself.
CURIOUS = textwrap.dedent('''
    import os
    import torch.distributed as dist
    _reference_step = afab_step

    def afab_step(stage, data_iter, num_microbatches):
        seen = {k: os.environ.get(k) is not None for k in %r}
        print("SEEN", sorted(k for k, v in seen.items() if v), flush=True)
        print("LOCAL_RANK is the stage:", int(os.environ["LOCAL_RANK"]) == stage.pp_rank, flush=True)
        try:
            dist.init_process_group("gloo")
            print("INIT ok", flush=True)
        except Exception as e:
            print("INIT", type(e).__name__, flush=True)
        return _reference_step(stage, data_iter, num_microbatches)
''' % TORCHRUN_ENV)

HANG = '''
import time

def afab_step(stage, data_iter, num_microbatches):
    while True:
        time.sleep(0.05)
'''


def case(answers):
    return Case(kind="pipeline", qid="q08", config=CFG, answers=answers)


def said(run) -> list[set[str]]:
    """What each rank of the run's last launch printed, as a set of lines."""
    return [{ln.strip() for ln in log.splitlines()} for _, log in sorted(run.launches[-1].rank_logs.items())]


def test_ranks_see_torchruns_environment_and_an_answer_behaves_as_under_torchrun(
        answers_with, reference, tmp_path, monkeypatch, no_leftovers):
    answers = answers_with(q08=Path(reference["q08"]).read_text() + CURIOUS)
    runs = {}
    for way in ("warm", "torchrun"):
        monkeypatch.setenv("LAB_LAUNCH", way)
        runs[way] = run_cases([case(answers)], tmp_path / way, timeout_s=20)
    if sandbox.available():
        runs["sandbox"] = run_cases([case(answers)], tmp_path / "sandbox", timeout_s=20, sandboxed=True)
    expected = "SEEN " + str(sorted(TORCHRUN_ENV))
    for way, run in runs.items():
        out = run.outcomes[0]
        assert out.failure is None and not out.errors(), (way, out.failure, out.errors())
        for rank, lines in enumerate(said(run)):
            assert expected in lines, (way, rank, lines)
            assert "LOCAL_RANK is the stage: True" in lines, (way, rank)
    # the worker has joined the job before the answer runs: a second init_process_group fails alike
    assert [ln for ln in said(runs["warm"])[0] if ln.startswith("INIT")] == \
        [ln for ln in said(runs["torchrun"])[0] if ln.startswith("INIT")]
    assert warm_launch.warm_pid() is not None


def test_a_killed_warm_launcher_is_reported_and_the_next_check_starts_a_new_one(
        answers_with, reference, tmp_path, no_leftovers):
    warm_launch.prestart()
    first = warm_launch.warm_pid()
    journal = runfolder.journal_path(tmp_path / "hung", 0)

    def kill_when_the_case_runs():
        until = time.monotonic() + 120
        while time.monotonic() < until and "start" not in (journal.read_text() if journal.exists() else ""):
            time.sleep(0.05)
        time.sleep(0.3)
        forked.extend(psutil.Process(first).children(recursive=True))    # the agent and the ranks
        os.kill(first, signal.SIGKILL)
    forked: list[psutil.Process] = []
    killer = threading.Thread(target=kill_when_the_case_runs)
    killer.start()
    hung = run_cases([case(answers_with(q08=HANG))], tmp_path / "hung", timeout_s=60, case_deadline_s=60)
    killer.join()
    report = hung.outcomes[0].failure
    assert f"the warm launcher that starts the ranks (pid {first}) was killed by signal 9" in report
    assert "the next check starts a new one" in report
    assert len(forked) >= 5 and not psutil.wait_procs(forked, timeout=5)[1], "the agent and ranks died with it"
    good = run_cases([case(reference)], tmp_path / "good", timeout_s=20)
    assert good.outcomes[0].failure is None and not good.outcomes[0].errors()
    assert warm_launch.warm_pid() not in (None, first)



def test_an_unused_warm_launcher_goes_and_the_next_check_starts_a_new_one(reference, tmp_path, monkeypatch,
                                                                          no_leftovers):
    """Issue 41, item 5: each open notebook kept its warm launcher (about 260 MB) for ever, 5 GB with eight
    open; one that started nothing for IDLE_S goes, never during a launch, and the next check starts one."""
    monkeypatch.setattr(warm_launch, "IDLE_S", 1.5)
    warm_launch.prestart()
    first = warm_launch.warm_pid()
    assert first is not None
    proc = psutil.Process(first)
    ran = run_cases([case(reference)], tmp_path / "used", timeout_s=20)     # a launch re-arms the countdown
    assert ran.outcomes[0].failure is None and warm_launch.warm_pid() == first
    time.sleep(0.5)
    assert warm_launch.warm_pid() == first, "gone before its idle time"
    proc.wait(timeout=10)
    until = time.monotonic() + 5
    while warm_launch.warm_pid() is not None and time.monotonic() < until:    # the countdown's thread lets go
        time.sleep(0.05)
    assert warm_launch.warm_pid() is None
    again = run_cases([case(reference)], tmp_path / "again", timeout_s=20)
    assert again.outcomes[0].failure is None and not again.outcomes[0].errors()
    assert warm_launch.warm_pid() not in (None, first)
    monkeypatch.setattr(warm_launch, "IDLE_S", 0.0)
    warm_launch._arm_idle()                                                 # no countdown left behind


KERNEL = '''
import os, sys
from lab_src.checks import check
from lab_src.harness import warm_launch
report = check("q08")
print("RESULT", int(report.ok), warm_launch.warm_pid(), flush=True)
'''


def _warm_launchers_of(parents: set[int]) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "lab_src.harness.warm" in " ".join(p.info["cmdline"] or []) and \
                    int(p.environ().get("LAB_WARM_PARENT", 0)) in parents:
                found.append(p)
        except (psutil.Error, ValueError):
            continue
    return found


def test_two_kernels_check_at_once_each_with_its_own_ranks_and_leave_nothing(reference, tmp_path):
    from lab_src.registry import EXERCISES
    kernels = []
    for name in ("ann", "bob"):
        folder = tmp_path / name
        (folder / "answers").mkdir(parents=True)
        for qid, path in reference.items():
            (folder / "answers" / EXERCISES[qid].answer_file).write_text(Path(path).read_text())
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("LAB_LAUNCH", None)
        kernels.append(subprocess.Popen([sys.executable, "-c", KERNEL], cwd=folder, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    pids = {k.pid for k in kernels}
    outs = [k.communicate(timeout=300)[0] for k in kernels]
    results = [next(ln.split() for ln in out.splitlines() if ln.startswith("RESULT")) for out in outs]
    assert [r[1] for r in results] == ["1", "1"], outs
    assert results[0][2] != results[1][2], "each kernel has its own warm launcher"
    for name in ("ann", "bob"):     # each kernel's ranks wrote only in its own run folder
        (run,) = (tmp_path / name / "runs").iterdir()
        assert sorted(runfolder.rank_logs(run)) == [0, 1, 2, 3]
    time.sleep(0.5)
    left = _warm_launchers_of(pids)
    assert not left, f"warm launchers outlived their kernels: {[p.pid for p in left]}"


def test_no_rank_goes_on_before_the_agent_has_forked_them_all():
    """elastic.hold_until_all_forked, with real forks 0.2 s apart as a loaded agent makes them: no rank
    passes the hold (after which it connects to the store) before the last one exists, so no fork is
    taken while the agent's threads serve a rank's connection; a rank whose sibling never comes goes on
    after the limit, and the launch then fails at its store and says so."""
    import mmap
    import struct

    from lab_src.harness.elastic import hold_until_all_forked
    nproc = 4
    flags, passed = mmap.mmap(-1, nproc), mmap.mmap(-1, 8 * nproc)
    pids, last_fork = [], 0.0
    for rank in range(nproc):
        time.sleep(0.2)
        last_fork = time.monotonic()
        pid = os.fork()
        if pid == 0:
            ok = hold_until_all_forked(flags, rank, nproc, limit_s=20)
            passed[8 * rank:8 * rank + 8] = struct.pack("d", time.monotonic() if ok else -1.0)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    times = [struct.unpack("d", passed[8 * r:8 * r + 8])[0] for r in range(nproc)]
    assert all(t >= last_fork for t in times), (times, last_fork)

    t0 = time.monotonic()
    assert not hold_until_all_forked(mmap.mmap(-1, 2), 0, 2, limit_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 5


@pytest.mark.gpu
def test_nccl_ranks_start_cuda_after_the_fork(reference, tmp_path, monkeypatch, no_leftovers):
    """LAB_BACKEND=nccl through the warm launcher: the warm process never touches CUDA (elastic.run_ranks
    asserts it), each rank takes its GPU after the fork."""
    monkeypatch.setenv("LAB_BACKEND", "nccl")
    monkeypatch.delenv("LAB_LAUNCH", raising=False)
    run = run_cases([case(reference)], tmp_path, timeout_s=30)
    assert run.outcomes[0].failure is None and not run.outcomes[0].errors()
    assert all(o["device"].startswith("cuda") for o in run.outcomes[0].obs.values() if "device" in o)


def test_what_a_ranks_first_split_case_would_import_is_imported_before_the_ranks_are_forked():
    """A rank's first case of a split step (q16) runs torch's first autograd.grad given grad_outputs, which
    imports sympy (about 1 s of CPU). In the forked rank, after the fork server's preload, that imports nothing
    more: on a loaded machine the import had held one rank past the 15 s its peers wait at the case's barrier."""
    code = textwrap.dedent("""
        import sys
        from lab_src.harness import elastic
        elastic.preload()
        before = set(sys.modules)
        from lab_src.pipeline import split
        split.warm_up()
        new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("sympy", "mpmath", "torch"))
        print(f"{len(new)} modules: {new[:5]}" if new else "none")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "none", out.stdout

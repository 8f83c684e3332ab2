"""Shared fixtures. Multi-process tests launch real torchrun (gloo on the CPU); GPU tests skip without CUDA."""
from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def reference():
    """{qid: path of the reference answer file}, extracted from solutions/."""
    from grader.reference import reference_sources
    return reference_sources()


@pytest.fixture
def answers_with(reference, tmp_path):
    """answers_with(q08="source text", ...) -> mapping: reference answers, some replaced by test sources."""
    made = []

    def make(**sources):
        mapping = dict(reference)
        made.append(sources)
        for qid, text in sources.items():
            path = tmp_path / f"{qid}_test_answer_{len(made)}.py"
            path.write_text(text)
            mapping[qid] = str(path)
        return mapping
    return make


def lab_processes(marker: str = "") -> list[psutil.Process]:
    """torchrun launchers, warm launchers (and the agents and ranks they fork, which carry their command
    line) and lab workers alive now; with `marker`, only those whose command line has it."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if any(m in cmd for m in ("lab_src.harness.worker", "torch.distributed.run", "lab_src.harness.warm")) \
                and marker in cmd:
            found.append(p)
    return found


def children_left(timeout: float = 5) -> list:
    """The test process's child processes still alive after `timeout` s, but its warm launcher: the one a
    check or a grading run in this process started, which lives as long as the test process, as it does
    as long as a kernel (harness/warm_launch.py)."""
    from lab_src.harness import warm_launch
    warm = warm_launch.warm_pid()
    mine = [p for p in psutil.Process().children(recursive=True) if p.pid != warm]
    return psutil.wait_procs(mine, timeout=timeout)[1]


@pytest.fixture
def no_leftovers(tmp_path):
    """Fail the test if it leaves behind a torchrun or worker process of its own (its runs live in
    tmp_path, which their command lines name) or any child process of the test but its warm launcher,
    which lives as long as the test process, as it does as long as a kernel (harness/warm_launch.py)."""
    yield
    from lab_src.harness import warm_launch
    warm = warm_launch.warm_pid()
    left = lab_processes(str(tmp_path)) + [p for p in psutil.Process().children(recursive=True) if p.pid != warm]
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline())[:120]) for p in left]}"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LAB_ANSWERS", raising=False)
    monkeypatch.delenv("LAB_ANSWERS_DIR", raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    return tmp_path


# LAB_TEST_COHORT=ada,ivo,untouched grades only those students: enough for tests/test_slurm.py run alone
# (minutes instead of half an hour); the cohort tests then skip.
PARTIAL_COHORT = [s for s in os.environ.get("LAB_TEST_COHORT", "").split(",") if s]


# LAB_TEST_COHORT_AT_ONCE=1 grades the cohort when the first test that needs it starts, in pytest's process,
# instead of in the background from the session's start (tests/cohort_in_background.py)
AT_ONCE = os.environ.get("LAB_TEST_COHORT_AT_ONCE") == "1"


def needs_cohort(item) -> int:
    """2: the test needs the graded cohort from its start; 1: only at its end (marked `uses_cohort_late`: it
    asks for it with request.getfixturevalue after work of its own); 0: not at all."""
    if "graded_cohort" in getattr(item, "fixturenames", ()):
        return 2
    return 1 if item.get_closest_marker("uses_cohort_late") else 0


@pytest.fixture(scope="session", autouse=True)
def cohort_in_background(request, tmp_path_factory):
    """The cohort's grading, started with the session when a selected test needs it (they run last)."""
    if AT_ONCE or not any(needs_cohort(item) for item in request.session.items):
        yield None
        return
    from cohort_in_background import Background
    from grader.cohort import COHORT
    grading = Background(tmp_path_factory.mktemp("cohort"),
                         [s.name for s in COHORT if not PARTIAL_COHORT or s.name in PARTIAL_COHORT])
    yield grading
    grading.stop()


@pytest.fixture(scope="session")
def graded_cohort(cohort_in_background, tmp_path_factory):
    """The whole sample cohort autograded for real, eight students at a time (nbgrader + the out-of-process
    hidden tests; grader/cohort/grading.py): (course, results by student, grade rows by student).
    Shared by the cohort tests and the Slurm test, which compares its merged grades with these."""
    if cohort_in_background is not None:
        return cohort_in_background.result()
    from grader.cohort import COHORT
    from grader.cohort.grading import grade_cohort
    students = [s for s in COHORT if not PARTIAL_COHORT or s.name in PARTIAL_COHORT]
    return grade_cohort(tmp_path_factory.mktemp("cohort"), students)


def pytest_configure(config):
    from lab_src.registry import EXERCISES
    for ex in EXERCISES.values():
        config.addinivalue_line("markers", f"{ex.id}: concerns exercise {ex.id} ({ex.title}); `pytest -m {ex.id}`")
    config.addinivalue_line("markers", "uses_cohort_late: asks for the graded cohort at its end (conftest.needs_cohort)")


def concerns(item) -> set[str]:
    """The exercises a test of one cohort student concerns: those the student's story is about. (A test of
    one exercise says so itself: `pytestmark = pytest.mark.qNN` in tests/test_qNN_<function>.py, or
    `@pytest.mark.qNN` on the test.)"""
    from grader.cohort import BY_NAME
    student = getattr(item, "callspec", None) and item.callspec.params.get("student")
    return set(BY_NAME[student].expect) if student in BY_NAME else set()


def pytest_collection_modifyitems(config, items):
    import torch
    for item in items:
        for qid in sorted(concerns(item)):
            item.add_marker(getattr(pytest.mark, qid))
    if not AT_ONCE:     # the tests of the graded cohort last, while it grades in the background
        items.sort(key=needs_cohort)     # (a stable sort: the order within each part stays)
    if not (torch.cuda.is_available() and torch.cuda.device_count() >= 2):
        skip = pytest.mark.skip(reason="needs at least 2 CUDA GPUs (one per rank)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


os.environ.setdefault("LAB_CACHE", str(ROOT / "out" / "cache"))

"""Names in the gradebook: `grader roster` imports a CSV with nbgrader's own student import, and
collecting again keeps the names (nbgrader's autograde keeps them too: tests/test_cohort.py checks the
names the formgrader shows after grading)."""
from __future__ import annotations

import pytest

from grader.cli import main as grader_cli
from grader.cohort import BY_NAME, ROSTER, build_cohort
from grader.course import COURSE_ID, Course


def names(course: Course) -> dict[str, tuple]:
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:
        return {s.id: (s.first_name, s.last_name, s.email) for s in gb.students}


@pytest.mark.slow   # collect runs nbgrader generate_assignment once: about 30 s, minutes on a loaded machine
def test_roster_import_and_collecting_again_keep_the_names(tmp_path, capsys):
    returned = tmp_path / "returned"
    build_cohort(returned, [BY_NAME["ada"], BY_NAME["sam"]])
    course = Course(tmp_path / "course")
    assert grader_cli(["--course", str(course.root), "collect", "--from", str(returned),
                       "--roster", str(returned / ROSTER)]) == 0
    want = {"ada": ("Ada", "Okafor", "ada@students.example.edu"), "sam": ("Sam", "Adeyemi", "sam@students.example.edu")}
    assert names(course) == want
    assert grader_cli(["--course", str(course.root), "collect", "--from", str(returned)]) == 0   # again, no roster
    course.add_students(["ada", "sam"])
    assert names(course) == want
    (tmp_path / "more.csv").write_text("id,first_name,last_name,email\nsam,Samira,Adeyemi,\n")
    assert grader_cli(["--course", str(course.root), "roster", str(tmp_path / "more.csv")]) == 0
    assert names(course)["sam"][:2] == ("Samira", "Adeyemi") and names(course)["ada"] == want["ada"]
    assert "1 students' names imported" in capsys.readouterr().out

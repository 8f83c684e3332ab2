"""A course of several assignments: a later assignment's checks find the student's answers to the earlier ones
in the folder beside it, and name the notebook (and assignment) to finish first when there are none; a
core-only course grades the ten core exercises out of the core total."""
from __future__ import annotations

from dataclasses import replace

import pytest

from grader import plan
from lab_src import answers
from lab_src.checks.common import sources
from lab_src.registry import EXERCISES, MODULES, module_of


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """Two assignment folders side by side, as a student fetches them; the student works in the second."""
    for m in ("pipeline_lab", "pipeline_schedules"):
        (tmp_path / m / "answers").mkdir(parents=True)
    monkeypatch.delenv("LAB_ANSWERS_DIR", raising=False)
    monkeypatch.delenv("LAB_ANSWERS", raising=False)
    monkeypatch.chdir(tmp_path / "pipeline_schedules")
    return tmp_path


def write_answer(folder, qid):
    path = folder / "answers" / EXERCISES[qid].answer_file
    path.write_text(f"def {EXERCISES[qid].function}(*args, **kwargs):\n    return None\n")
    return path


def test_a_later_assignments_check_names_the_notebook_of_the_earlier_assignment_to_finish(folders):
    write_answer(folders / "pipeline_schedules", "q11")
    write_answer(folders / "pipeline_schedules", "q12")
    with pytest.raises(answers.StubCalled) as e:   # the student skipped pipeline_lab
        sources("q12")
    text = str(e.value)
    assert text.startswith("q12 needs your answer to q02 (check_args): open q02_check_args.ipynb of the "
                           "assignment pipeline_lab (../pipeline_lab/, finish it first)"), text


def test_a_later_assignments_check_uses_the_students_own_earlier_answers(folders):
    mine = {q: write_answer(folders / "pipeline_lab", q) for q in MODULES["pipeline_lab"] if EXERCISES[q].function}
    write_answer(folders / "pipeline_schedules", "q11")
    write_answer(folders / "pipeline_schedules", "q12")
    srcs = sources("q12")
    assert srcs["q05"] == str(mine["q05"].resolve())
    assert srcs["q12"] == str((folders / "pipeline_schedules" / "answers" / "q12_one_f_one_b_step.py").resolve())


@pytest.mark.slow
def test_a_core_only_course_grades_the_core_out_of_its_total(tmp_path):
    """A course.toml with only pipeline_lab: its students get one assignment of ten notebooks, graded to
    the points their story says, out of the core's total (the students' other answers are not graded)."""
    from grader.cohort import BY_NAME
    from grader.cohort.grading import grade_cohort
    plan.write(tmp_path / "course", ["pipeline_lab"])
    chosen = [BY_NAME["ivo"]]     # partial q08: the points of a story, one student to keep make test short
    course, results, rows = grade_cohort(tmp_path, chosen, jobs=2)
    assert [c.assignment for c in course.each()] == ["pipeline_lab"]
    assert {s: r["state"] for s, r in results.items()} == {"ivo": "graded"}
    assert set(results["ivo"]["assignments"]) == {"pipeline_lab"}
    core = [q for q in MODULES["pipeline_lab"] if EXERCISES[q].function]
    points = course.hidden_points()
    for s in chosen:
        want = s.expected_points(points)
        assert {q: rows[s.name].get(q) for q in core} == {q: want[q] for q in core}, s.name
        assert not any(q in rows[s.name] for q in EXERCISES if q not in MODULES["pipeline_lab"])
        assert rows[s.name]["autograded_max"] == sum(points[q] for q in core)
    assert sorted(p.name for p in course.autograded("ivo").glob("*.ipynb")) == \
        sorted(EXERCISES[q].notebook for q in MODULES["pipeline_lab"])


@pytest.mark.slow
def test_a_two_module_course_grades_each_assignment_and_a_student_who_returned_only_the_second(tmp_path):
    """pipeline_lab and pipeline_schedules: wren returns both (graded together: one run of the hidden tests,
    one nbgrader autograde), ada only the second; each assignment has its own gradebook entries and points."""
    from grader.autograde import grade_course
    from grader.cli import collect_folder
    from grader.cohort import BY_NAME, build_cohort
    from grader.course import Course
    from grader.report import course_rows, grade_rows
    two = ["pipeline_lab", "pipeline_schedules"]
    plan.write(tmp_path / "course", two)
    wren = replace(BY_NAME["wren"], returns=tuple(two))     # her story is the second's; she returns both
    build_cohort(tmp_path / "submissions", [wren, BY_NAME["ada"]])
    for q in MODULES["pipeline_lab"]:
        (tmp_path / "submissions" / "ada" / EXERCISES[q].notebook).unlink()
    course = Course(tmp_path / "course")
    for one in course.each():
        collect_folder(one, tmp_path / "submissions")
    assert course.for_assignment("pipeline_lab").students() == ["wren"]
    results = grade_course(course, jobs=2)
    assert {s: {a: o["state"] for a, o in r["assignments"].items()} for s, r in results.items()} == \
        {"wren": {a: "graded" for a in two}, "ada": {"pipeline_schedules": "graded"}}
    assert results["wren"]["assignments"]["pipeline_schedules"]["graded_with"] == two
    points = course.hidden_points()
    rows = {r["student"]: r for r in course_rows(course)}
    for student, modules in ((wren, two), (BY_NAME["ada"], ["pipeline_schedules"])):
        name, want = student.name, student.expected_points(points)
        graded = [q for m in modules for q in MODULES[m] if EXERCISES[q].function]
        assert {q: rows[name][q] for q in graded} == {q: want[q] for q in graded}, name
        assert not any(q in rows[name] for q in EXERCISES if module_of(q) not in modules)
    schedules = course.for_assignment("pipeline_schedules")
    assert sorted(r["student"] for r in grade_rows(schedules)) == ["ada", "wren"]
    assert sorted(p.name for p in schedules.autograded("wren").glob("*.ipynb")) == \
        sorted(EXERCISES[q].notebook for q in MODULES["pipeline_schedules"])

"""Grading a course on a Slurm cluster: one task space per student, merged into the course gradebook.

    slurm/grade.sh [options]           (or: sbatch slurm/grade.sh [options]) plans a run and submits it
    python -m grader.cluster --help    the same steps by hand: submit, task, merge, status, resubmit

nbgrader has no parallel mode, and SQLite dislikes concurrent writers on a shared file system, so a
run never lets two jobs write one gradebook:

1. `submit` makes a run folder, <course>/cluster/<run>/, with the list of students to grade and a
   template gradebook (the course's assignment, no students), then submits a job array of `task`s
   and a `merge` job that waits for the whole array (afterany).
2. Each array task grades its students one by one, each in a task space of its own: a course folder
   with its own gradebook, built in node-local scratch and published to <run>/spaces/<student>/ when
   graded (grader.autograde.grade_student does the grading). A state file per student,
   <run>/state/<student>.json, says running / graded / failed, with the job and node.
3. `merge` copies every graded space into the course through nbgrader's Gradebook API (students,
   submissions, each grade's auto_score and needs_manual_grade, comments) with the autograded
   notebooks and grader logs, then exports grades.csv. Merging again gives the same gradebook.
4. `status` counts graded / running / failed / waiting; `resubmit` submits the students whose task
   failed (cancelled, time limit, node failure) again, with a new merge job.

The merge reads only the run folder, never node-local state, so any node can run it.
"""

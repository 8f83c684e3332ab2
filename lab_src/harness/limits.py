"""The limits of grading in one place: how long each part may take, how much it may write, how often an
exercise may fail before its other cases are skipped. Each limit says what it bounds, why it has this value,
and where it is enforced; the modules that enforce it import it from here. This module imports nothing:
a rank in the sandbox, the launching process and grader/ all read it.

Two clocks. A case's deadline and the load limit are read on the ranks' own clock (harness/own_time.py:
the wall clock less the time a rank waited for a CPU that other work held), so that a busy grading machine
does not decide a verdict; each has a backstop on the wall clock. Every other limit here is wall clock.

Limits of grading kept elsewhere:
- the sandbox's limits, per process and per launch (processes, address space, file size, CPU seconds, open
  files, the private /tmp, the run folder's total size): `lab_src.harness.sandbox.Limits`, which
  `sandbox.wrap` hands to bubblewrap and prlimit, and whose `disk_bytes` and `disk_stop_factor` the
  runner and the worker check after each case (docs/threat-model.md);
- Slurm's: the #SBATCH time of slurm/grade.sh, and grader/cluster/slurm.py (`MERGE_RESOURCES`, and
  `SLURM_TIMEOUT_S` for one sbatch or squeue command);
- how much of a verdict's problems the feedback shows (judge/summary.py `render`'s `limit`, called by
  grader/trusted.py) and how much of a rank's error is kept (harness/worker.py `_describe`): what is said,
  not what is run.
"""
from __future__ import annotations

# ---- a launch's cases: the hidden tests (grader/trusted.py) and the visible checks, both through
# ---- harness/runner.py `run_cases`, each rank running harness/worker.py

# Each operation of a case's process group (a receive, a send, a collective, the case's barriers) gives up
# after this: the groups' timeout (harness/groups.py `init`; the world group, whose barriers wait for a whole
# case, gets 4 times it plus 30 s), from the spec's `timeout_s`, which grader/trusted.py passes to run_cases.
# The last resort: a deadlock is stopped at once by the runner's watch (harness/deadlock.py), so this mostly
# ends a wait the watch cannot see through, as after another rank's error; longer leaves those waits to the case
# deadline (benchmarks/README.md, "Limits and the runs behind them"). A message's wait inside a case (the lab's
# waits, pipeline/waiting.py `time_out_after`) reads it on the case's clock, as the barriers below: the wall clock
# less the longest time one of the case's ranks waited for a CPU, gloo given BUSY_BACKSTOP times it on the wall
# clock (a valid q06 lost a case on a loaded machine: rank 0's receive gave up after 15 s of wall time while rank
# 1 was sending it). A collective's own wait is gloo's, on the wall clock: tensor-parallel cases wait longer
# (COLLECTIVE_TIMEOUT_FACTOR below). A collective that does time out ends its
# case (comm/collectives.py `CollectiveGaveUp`) instead of leaving a group in an undefined state to
# the case's next part.
GRADING_RECV_TIMEOUT_S = 15.0

# The cases of a kind whose ranks wait for each other at every collective (tensor parallelism: each sub-layer's
# all-reduce joins all t ranks) give their groups and barriers this many times the timeout above (the kind's
# `timeout_factor`, topics/__init__.py `Kind`; harness/worker.py passes the case's timeout in `ctx`). One rank
# starved of CPU holds all t there: at 15 s a loaded machine failed the reference's q18 (benchmarks/README.md,
# "Grading"). A collective that hangs is still stopped at once by the deadlock watch;
# this only ends the waits the watch cannot see through, later. Below the world group's 4 x 15 + 30 s, which
# waits for the slowest rank's whole case.
COLLECTIVE_TIMEOUT_FACTOR = 4
# The case's barriers (harness/case_barrier.py) wait as long, but on the clock of the case deadline below: wall time
# less what the launch's most starved rank waited for a CPU (harness/own_time.py `peers_clock`): on the wall clock
# a starved rank's late arrival failed the reference's q18 (benchmarks/README.md, "Limits and the runs behind
# them"). gloo's own waits stay on the wall clock.

# A case, from its start to its end on every rank, on the ranks' own clock: harness/case_watch.py `CaseWatch`
# ends the launch, the case fails and the cases after it are launched again. Passed to run_cases by
# grader/trusted.py. Generous, so that a loaded machine never fails a correct answer; read on the ranks' own
# clock because a long graded case overran it on the wall clock (benchmarks/README.md, "The test suite").
GRADING_CASE_DEADLINE_S = 45.0

# The same two for a visible check, in a student's kernel: run_cases's defaults, for the checks that pass
# none (the longer checks, q11's, q13's, q15's, the experiments and the bridges, set their own beside their
# call). A check runs one student's answer alone: tighter than the grader's, and still far above what one
# core needs (hub/README.md).
CHECK_RECV_TIMEOUT_S = 10.0
CHECK_CASE_DEADLINE_S = 30.0

# From a launch's start until its ranks start the first case (forked, process groups joined, every answer
# under test loaded once: LOAD_LIMIT_S), on the wall clock: harness/case_watch.py `CaseWatch` ("the ranks did
# not start within 120 s"), run_cases's `startup_s`, for the checks and the grader alike. A healthy start
# takes well under a second from a warm process; ranks that hung at their start reached it, which
# harness/elastic.py `hold_until_all_forked` prevents (benchmarks/README.md, start_hold.py).
STARTUP_S = 120.0

# How long an answer cell under test may run as it loads (the code outside its function), on every rank
# before the first case, on the rank's own clock: harness/worker.py `load_answers_under_test` stops it, and
# each of its exercise's cases says so. run_cases passes half its startup deadline (this value by default);
# the worker uses this for a spec that does not say (scripts/train.py). On the own clock, since a cell that
# walks the disk overran it on the wall clock in CI (benchmarks/README.md, "The test suite").
LOAD_LIMIT_S = STARTUP_S / 2

# Wall-clock backstops of the two limits on the ranks' own clock, in harness/case_watch.py `CaseWatch`: the
# startup deadline does not count the time ranks spent loading answers, up to LOADING_BACKSTOP load limits
# more; a case ends at its deadline on its ranks' clock, or at BUSY_BACKSTOP deadlines of wall time
# whatever that clock says.
LOADING_BACKSTOP = 2
BUSY_BACKSTOP = 3

# A whole launch ends, on the wall clock, at startup + LOADING_BACKSTOP load limits + BUSY_BACKSTOP deadlines
# per case + this: harness/runner.py `run_cases`, the `deadline_s` of harness/launcher.py. Room for the
# launch's start and end outside any case: the watch's limits above end a launch first; this bounds a launch
# that they do not end.
LAUNCH_SLACK_S = 30

# After the watch has asked the ranks of a deadlocked case to stop waiting (harness/deadlock.py), they have
# this long to do so before it ends the launch ("the ranks did not stop when asked"): harness/runner.py
# `CaseWatch`. A stopped wait returns within a poll of pipeline/waiting.py, well under a second. Read on the ranks'
# clock, with BUSY_BACKSTOP graces of wall time as its backstop: ranks starved of CPU poll late (nico's q19 in a
# CI run beside the test suite: "did not stop when asked within 5 s", and his feedback changed).
STOP_GRACE_S = 5.0

# In one launch, once this many cases of an exercise have deadlocked or timed out, its other cases are not
# run ("not run: 2 earlier cases of qNN deadlocked or timed out"): harness/worker.py `main`. A deadlocking
# answer then costs two deadlines, not one per case; the other exercises are still graded.
SKIP_AFTER_TIMEOUTS = 2

# Across launches, once cases of an exercise have ended this many launches (a crash, an overrun deadline),
# its other cases are not launched again: harness/runner.py `run_cases` (`max_launch_failures_per_exercise`).
LAUNCH_FAILURES_PER_EXERCISE = 2

# The characters of a rank's printed output kept in its log (rank<r>.log), the rest dropped: harness/worker.py
# `CappedWriter`, from the spec's `log_limit` (run_cases's default; scripts/train.py writes the same). A
# student may print megabytes; a report shows a few lines of it (checks/common.py `OUTPUT_LINES`).
RANK_LOG_CHARS = 200_000

# The largest observation file (obs/c<case>.rank<r>.pt) the launching process reads back: a larger one is
# reported as OversizedObservation, never loaded (harness/runner.py `_load_obs`). Also the size above which
# a file in the run folder is not the lab's: deleted after each group and when the disk limit is reached
# (sandbox.remove_large_files; the worker's `over_disk_limit` through the spec's `disk_limit`). An
# observation is a few tensors of a small model, far below.
OBS_LIMIT_BYTES = 64 << 20

# How long a forked rank waits for the agent to fork its siblings before it connects (harness/elastic.py
# `hold_until_all_forked`); past it, it goes on and the launch fails at its store, saying so. A whole
# launch of 4 or 8 ranks starts in about 0.3 s (benchmarks/README.md, start_hold.py).
FORKED_LIMIT_S = 30.0

# ---- autograding one student (grader/autograde.py)

# How long grader/autograde.py `run_trusted` waits for `python -P -m grader.trusted` (one student's hidden
# tests: every exercise of every returned assignment) to exit once it has read the verdicts' pipe to its end,
# on the wall clock; then it kills it, and without verdicts the student is `failed`, with the reason. The
# read before it has no limit of its own (it ends when that process closes the pipe, at its end or as it
# dies): what bounds the grading itself is the launches' limits above.
TRUSTED_TIMEOUT_S = 900

# One `nbgrader autograde` (all the notebooks of a student's returned assignments), on the wall clock:
# NBGRADER_NOTEBOOK_S for each notebook it executes (`nbgrader_timeout_s`), which grader/autograde.py passes
# to grader/course.py `Course.nbgrader` (subprocess's timeout); past it the student is `failed`, with the
# reason. Each cell has CELL_TIMEOUT_S and each kernel start KERNEL_STARTUP_TIMEOUT_S below; this bounds the
# command that runs them all, so it grows with the notebooks: one limit of 900 s for the whole command was
# reached by a student who returned all six assignments (22 notebooks, 325 s alone, eight students at a
# time on 2 cores) while the test suite kept the cores busy, and their hidden tests' points were lost.
NBGRADER_NOTEBOOK_S = 240


def nbgrader_timeout_s(notebooks: int) -> float:
    return NBGRADER_NOTEBOOK_S * max(1, notebooks)

# The verdicts grader.trusted writes to its pipe (JSON): grader/autograde.py reads at most this much. A
# student's verdicts are a few kilobytes of messages.
VERDICTS_LIMIT_BYTES = 8 << 20

# One cell of a submitted notebook while nbgrader executes it (nbgrader's `Execute.timeout`, written into
# the course's nbgrader_config.py by grader/course.py, `Course(cell_timeout=...)`): a hung cell fails and
# the notebook goes on. The visible checks run there draw the grader's own run and launch nothing.
CELL_TIMEOUT_S = 120

# After a cell's execute reply, how long nbgrader waits for the rest of its output (nbclient's `iopub_timeout`,
# 4 s by default, written into the course config by grader/course.py). nbgrader raises past it, and the
# whole assignment of that student fails: in a full test run (the suite and the cohort on 2 cores) the
# cohort's loud student, whose cell prints 5 MB, went past 4 s and was left "needs autograding". The
# output itself is cut down afterwards (OUTPUT_MAX_LINES, OUTPUT_MAX_CHARS below).
IOPUB_TIMEOUT_S = 60

# A kernel that executes a submitted notebook must answer within this (nbgrader's `Execute.startup_timeout`,
# its own default 60 s), else it gets KERNEL_START_RETRIES fresh starts (grader/execute.py
# `RetryingExecute`), written into the course config by grader/course.py: nbgrader's 60 s was not always
# enough while other students' hidden tests kept every core busy (benchmarks/README.md, kernel_start.py).
KERNEL_STARTUP_TIMEOUT_S = 180
KERNEL_START_RETRIES = 1

# Fresh kernels per notebook after one died while a cell ran (a cell that killed its kernel): the cells
# after it run in a fresh kernel, at most this many times per notebook: grader/execute.py
# `RetryingExecute.kernel_deaths`.
KERNEL_DEATHS = 2

# The fork server that starts nbgrader's kernels in the sandbox (harness/kernel_zygote.py, which imports
# torch, matplotlib and ipykernel once per student) must say READY within this: grader/kernel_sandbox.py
# `KernelZygote`; otherwise it is not tried again for that folder, and each kernel gets a sandbox of its own
# (`zygote_for`, which logs why).
KERNEL_ZYGOTE_READY_S = 120

# Each output of an autograded notebook, cut down for the gradebook and the feedback: nbgrader's LimitOutput
# keeps OUTPUT_MAX_LINES lines (OUTPUT_MAX_TRACEBACK of a traceback), written into the course config by
# grader/course.py; one print of megabytes is one line, so grader/limit_output.py `LimitOutputChars` then
# keeps OUTPUT_MAX_CHARS characters (the start and the end).
OUTPUT_MAX_LINES = 200
OUTPUT_MAX_TRACEBACK = 60
OUTPUT_MAX_CHARS = 20_000

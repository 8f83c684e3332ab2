#!/bin/bash
# Autograde a course's submissions on a Slurm cluster (see slurm/README.md).
#
#   sbatch slurm/grade.sh [--course DIR] [--student S ...] [options]   # a short job plans and submits the run
#   slurm/grade.sh        [--course DIR] [--student S ...] [options]   # the same, straight from the login node
#
# It submits a job array (one task per student, or per --per-task students) that grades into task
# spaces of its own, and a merge job after it that fills the course gradebook and writes grades.csv.
# Options: python -m grader.cluster submit --help. Follow a run with `python -m grader.cluster status`.
#
# The #SBATCH lines below are the defaults of each grading task (the checks run 4 ranks: one CPU,
# or one GPU, each). Override them per run with --cpus/--mem/--time/--partition/--gpus/--max-running,
# or GRADE_CPUS, GRADE_MEM, ... in the environment; `sbatch` options given on its command line only
# apply to the short planning job.
#SBATCH --job-name=pp-lab-grade
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time=00:30:00
#SBATCH --output=pp-lab-grade-%j.out
#
# Environment: LAB_PYTHON (the Python to use), else an activated conda env or virtualenv that has
# nbgrader and torch, else the checkout's .venv. LAB_ENV_SCRIPT: a file sourced first (module loads,
# conda activate). LAB_ROOT: the checkout, if it cannot be found from this script's path.
set -euo pipefail

has_lab_deps() {  # has_lab_deps PYTHON: does it have what grading needs?
  [ -x "$1" ] && "$1" -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ("nbgrader", "torch")))' 2>/dev/null
}

# The checkout. sbatch runs a copy of this file from slurmd's spool; Slurm knows the original path.
if [ -z "${LAB_ROOT:-}" ]; then
  script=$0
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    original=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p' | head -n 1 || true)
    if [ -n "$original" ] && [ -f "$original" ]; then script=$original; fi
  fi
  LAB_ROOT=$(cd "$(dirname "$script")/.." && pwd)
fi
if [ ! -f "$LAB_ROOT/grader/cluster/__init__.py" ]; then
  echo "grade.sh: $LAB_ROOT is not the lab's checkout: set LAB_ROOT" >&2
  exit 2
fi

if [ -n "${LAB_ENV_SCRIPT:-}" ]; then
  set +u
  # shellcheck disable=SC1090
  source "$LAB_ENV_SCRIPT"
  set -u
fi

if [ -z "${LAB_PYTHON:-}" ]; then
  for candidate in "${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" \
                   "$LAB_ROOT/.venv/bin/python" "$(command -v python3 || true)"; do
    if [ -n "$candidate" ] && has_lab_deps "$candidate"; then LAB_PYTHON=$candidate; break; fi
  done
fi
if [ -z "${LAB_PYTHON:-}" ] || ! has_lab_deps "$LAB_PYTHON"; then
  echo "grade.sh: no Python with nbgrader and torch: set LAB_PYTHON, activate the conda env (environment.yml)," \
       "or run scripts/setup.sh in $LAB_ROOT" >&2
  exit 2
fi

# The jobs this submits inherit these (sbatch --export=ALL). PYTHONSAFEPATH: nothing in the
# working folder can shadow a module.
export LAB_ROOT LAB_PYTHON PYTHONSAFEPATH=1
export PYTHONPATH="$LAB_ROOT${PYTHONPATH:+:$PYTHONPATH}"

case "${1:-}" in
  submit|task|merge|status|resubmit) exec "$LAB_PYTHON" -m grader.cluster "$@" ;;
  *) exec "$LAB_PYTHON" -m grader.cluster submit "$@" ;;
esac

#!/usr/bin/env bash
# `make demo`: set-up (the venv, then the system packages the demo's path uses), then python -m grader.demo,
# which prints where the time went, set-up included (passed on in LAB_DEMO_SETUP).
set -euo pipefail
cd "$(dirname "$0")/.."
now() { date +%s.%N; }
t0=$(now)
scripts/setup.sh
t1=$(now)
scripts/system_deps.sh demo
t2=$(now)
export LAB_DEMO_SETUP="venv=$(awk "BEGIN{print $t1 - $t0}"),system packages=$(awk "BEGIN{print $t2 - $t1}")"
exec .venv/bin/python -m grader.demo "$@"

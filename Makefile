# The two commands of README.md:
#   make demo   set up .venv, then the reference pipeline on 4 CPU processes, the release, the sample cohort graded
#   make test   set up .venv and the system packages the end-to-end tests need, then the whole test suite
.PHONY: setup demo test release benchmark

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/python -m grader.demo

test: setup
	@scripts/system_deps.sh
	.venv/bin/python -m pytest -ra --durations=15 $(PYTEST_ARGS)

benchmark: setup
	.venv/bin/python benchmarks/afab_vs_gpipe.py
	.venv/bin/python benchmarks/autograde_time.py
	.venv/bin/python benchmarks/failure_report.py

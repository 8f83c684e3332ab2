# The two commands of README.md:
#   make demo   set up .venv, then the reference pipeline on 4 CPU processes, the release, the sample cohort graded
#   make test   set up .venv and the system packages the end-to-end tests need, then the whole test suite
#   make train  (not graded) the digits trained for longer in a 4-stage pipeline and in one process:
#               a progress bar, out/train/curves.png and out/train/metrics.json
.PHONY: setup demo test release benchmark train

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/python -m grader.demo

test: setup
	@scripts/system_deps.sh
	.venv/bin/python -m pytest -ra --durations=15 $(PYTEST_ARGS)

train: setup
	.venv/bin/python scripts/train.py $(TRAIN_ARGS)

benchmark: setup
	.venv/bin/python benchmarks/afab_vs_gpipe.py
	.venv/bin/python benchmarks/one_f_one_b_vs_schedule1f1b.py
	.venv/bin/python benchmarks/memory_microbatches.py
	.venv/bin/python benchmarks/interleaved_vs_torch.py
	.venv/bin/python benchmarks/q13_curve_agreement.py
	.venv/bin/python benchmarks/autograde_time.py
	.venv/bin/python benchmarks/grid_traffic.py

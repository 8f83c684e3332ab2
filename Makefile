# The two commands of README.md:
#   make demo   set up .venv, then the reference pipeline on 4 CPU processes, the release, 6 sample students graded
#               (make demo COHORT=all: the whole sample cohort)
#   make test   set up .venv and the system packages the end-to-end tests need, then the whole test suite
#   make train  (not graded) the digits trained for longer in a 4-stage pipeline and in one process:
#               a progress bar, out/train/curves.png and out/train/metrics.json
#   make hub    a local course hub (JupyterHub, PAM accounts, nbgrader exchange) to try as instructor and students
.PHONY: setup demo test release benchmark train hub hub-env

setup:
	@scripts/setup.sh

# each target that README names first runs scripts/system_deps.sh with its own name: the system packages its path uses
demo:
	@scripts/demo.sh $(if $(COHORT),--cohort $(COHORT))

test: setup
	@scripts/system_deps.sh test
	@hub/setup.sh >/dev/null || echo "hub/setup.sh failed: tests/test_hub.py will fail" >&2
	.venv/bin/python -m pytest -ra --durations=15 $(PYTEST_ARGS)

train: setup
	@scripts/system_deps.sh train
	.venv/bin/python scripts/train.py $(TRAIN_ARGS)

benchmark: setup
	@scripts/system_deps.sh benchmark
	.venv/bin/python benchmarks/afab_vs_gpipe.py
	.venv/bin/python benchmarks/one_f_one_b_vs_schedule1f1b.py
	.venv/bin/python benchmarks/memory_microbatches.py
	.venv/bin/python benchmarks/interleaved_vs_torch.py
	.venv/bin/python benchmarks/zero_bubble_vs_torch.py
	.venv/bin/python benchmarks/zero_bubble_bubbles.py
	.venv/bin/python benchmarks/q13_curve_agreement.py
	.venv/bin/python benchmarks/autograde_time.py
	.venv/bin/python benchmarks/failure_report.py
	.venv/bin/python benchmarks/grid_traffic.py
	.venv/bin/python benchmarks/tp_vs_torch.py
	.venv/bin/python benchmarks/tp_block_vs_torch.py
	.venv/bin/python benchmarks/validate_time.py
	.venv/bin/python benchmarks/ring_all_reduce.py
	.venv/bin/python benchmarks/network_tail.py
	.venv/bin/python benchmarks/buckets_vs_ddp.py
	.venv/bin/python benchmarks/zero_vs_torch.py
	.venv/bin/python benchmarks/recompute_vs_torch.py
	.venv/bin/python benchmarks/ring_attention_vs_sdpa.py
	.venv/bin/python benchmarks/moe_dispatch.py
	.venv/bin/python benchmarks/fsdp_vs_torch.py
	.venv/bin/python benchmarks/agent_vs_fork.py
	.venv/bin/python benchmarks/start_hold.py 40
	.venv/bin/python benchmarks/check_latency.py

# the single-user environment and configurable-http-proxy of the local hub (cached; hub/README.md)
hub-env:
	@hub/setup.sh

# start the local course hub as root; prints the URL and the test accounts; Ctrl-C stops it
hub: setup
	@scripts/system_deps.sh hub
	.venv/bin/python hub/localhub.py $(HUB_ARGS)

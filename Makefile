# Stepwise: two commands set up everything on a fresh machine.
#   make demo   - set up, then materialize the whole asset graph on embedded defaults
#   make test   - set up, lint (ruff, mypy, import contracts), then run the test suite (what .ci/run calls)
SHELL := /bin/bash
export STEPWISE_HOME ?= $(CURDIR)/.stepwise
export DAGSTER_HOME ?= $(STEPWISE_HOME)/dagster
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
VENV := .venv
PORT ?= 3000

.PHONY: setup demo data test test-fast lint ui annotate reward-models rl flywheel bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	@$(VENV)/bin/stepwise demo

# The suite on TEST_WORKERS pytest-xdist workers (default 2, this machine's cores; 0 runs it in one
# process); tests/conftest.py keeps a module's tests, Ray's and Label Studio's on one worker each.
TEST_WORKERS ?= 2

test: setup lint
	@$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

# Style, types and the import direction (pyproject.toml: [tool.ruff], [tool.mypy], [tool.importlinter]).
lint: setup
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(VENV)/bin/mypy
	@$(VENV)/bin/lint-imports

test-fast: setup
	@$(VENV)/bin/python -m pytest -q -m "not e2e"

# The fuzz tests (marker fuzz) with 25x the examples of the suite's run (tests/envs/fuzzing.py); ~10 minutes.
.PHONY: fuzz
fuzz: setup
	@STEPWISE_FUZZ_PROFILE=stepwise-fuzz-long $(VENV)/bin/python -m pytest -q -m fuzz

ui: setup
	@$(VENV)/bin/stepwise ui --port $(PORT)

annotate: setup
	@bash scripts/annotate.sh

# Every recorded demonstration (10,466) imported and labelled, in the home make demo made (which
# holds a sample of 30 per task): what make reward-models, make rl and make flywheel are run on.
data: setup
	@$(VENV)/bin/stepwise demo --until labels --demos-per-task 0

reward-models: setup
	@$(VENV)/bin/stepwise reward-models

rl: setup
	@$(VENV)/bin/stepwise rl

# After `make rl`: policy rollouts -> labels -> reward models retrained on the mix -> judged on agents.
flywheel: setup
	@$(VENV)/bin/stepwise flywheel --rounds 1

bench: setup
	@$(VENV)/bin/python benchmarks/bench_import.py
	@$(VENV)/bin/python benchmarks/bench_labels.py
	@$(VENV)/bin/python benchmarks/bench_rollouts.py
	@$(VENV)/bin/python benchmarks/bench_annotation.py
	@$(VENV)/bin/python benchmarks/bench_reward_models.py
	@$(VENV)/bin/python benchmarks/bench_serving.py
	@$(VENV)/bin/python benchmarks/bench_rl.py
	@$(VENV)/bin/python benchmarks/bench_guidance.py
	@$(VENV)/bin/python benchmarks/bench_partitions.py
	@$(VENV)/bin/python benchmarks/bench_encoder.py
	@$(VENV)/bin/python benchmarks/bench_determinism.py
	@$(VENV)/bin/python benchmarks/bench_alternatives.py

clean:
	rm -rf $(STEPWISE_HOME)

# Rebound: the two commands a newcomer needs are `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TEST_STATE := $(CURDIR)/.rebound-lab-test

.PHONY: install demo up down status test lint typecheck unit e2e record-histories clean

# System packages (Slurm, munge, gcc) + a virtualenv with Rebound and its dev/demo/trainers extras.
$(STAMP): pyproject.toml
	bash deploy/local/install-system.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,demo,trainers]'
	touch $(STAMP)

install: $(STAMP)

## The main job: bring the lab up, submit the demo training job, show it training, point at the UI.
demo: install
	$(BIN)/rebound lab demo

up: install
	$(BIN)/rebound lab up

down:
	$(BIN)/rebound lab down
	-REBOUND_LAB_STATE_DIR=$(TEST_STATE) $(BIN)/rebound lab down
	-REBOUND_LAB_STATE_DIR=$(TEST_STATE)-2 $(BIN)/rebound lab down

status:
	$(BIN)/rebound lab status

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

## Everything: lint, types, unit tests and end-to-end tests on a real lab (started by the test session); the lab
## tests and the others run side by side (deploy/local/test-all.sh).
test: install lint typecheck
	BIN=$(BIN) bash deploy/local/test-all.sh

unit: install
	$(BIN)/pytest -q -m "not lab"

e2e: install
	$(BIN)/pytest -q -m lab

## Re-record the workflow histories the replay tests check (tests/replay/histories/), from the e2e scenarios on a
## real test lab (one lab per host: waits on LAB_LOCK). See docs/adr/012-replay-and-workflow-versioning.md.
LAB_LOCK  ?= /tmp/rebound-lab.lock
HISTORIES ?= $(CURDIR)/tests/replay/histories
RECORDED  := tests/e2e/test_cluster_watch.py tests/e2e/test_detection_scenarios.py tests/e2e/test_fleet.py \
             tests/e2e/test_recovery_scenarios.py
record-histories: install
	flock $(LAB_LOCK) env PYTHONPATH=$(CURDIR) REBOUND_RECORD_HISTORIES=$(HISTORIES) \
		$(BIN)/pytest -q -p no:cacheprovider -m lab $(RECORDED); \
	status=$$?; flock $(LAB_LOCK) env PYTHONPATH=$(CURDIR) REBOUND_LAB_STATE_DIR=$(TEST_STATE) \
		$(BIN)/python -m workers.cli lab down; exit $$status

clean: down
	rm -rf .rebound-lab .rebound-lab-test .rebound-lab-test-2 .mypy_cache .ruff_cache .pytest_cache

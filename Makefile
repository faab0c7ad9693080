# hyperplace: the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HYPERPLACE_PORT ?= 8000
export HYPERPLACE_PORT

.PHONY: run test install install-dev test-sqlite test-postgres lint bench browser-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e .

install-dev: $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev]"

## Install, migrate the embedded SQLite database and serve on 127.0.0.1:$HYPERPLACE_PORT
run: install
	$(BIN)/hyperplace migrate
	$(BIN)/hyperplace serve

## Install test deps, run the suite on SQLite, then on a throwaway PostgreSQL 15
test: install-dev browser-deps lint
	$(MAKE) --no-print-directory test-sqlite
	scripts/with-postgres.sh $(MAKE) --no-print-directory test-postgres

test-sqlite:
	@echo "=== pytest on SQLite ==="
	env -u HYPERPLACE_TEST_POSTGRES_URL $(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-postgres:
	@echo "=== pytest on PostgreSQL ==="
	HYPERPLACE_DATABASE_URL=$$HYPERPLACE_TEST_POSTGRES_URL $(BIN)/alembic upgrade head
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

## Formatter, linter, type checker on partitioners/, import contracts, Dockerfile, manifests
lint:
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/hadolint Dockerfile
	$(BIN)/python scripts/validate_k8s.py deploy/k8s

## Headless Chromium for the plan-view browser test (Debian packages)
browser-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	  echo "warning: could not install chromium; the browser test will be skipped"

bench: install-dev
	$(BIN)/python -m bench.ingest
	$(BIN)/python -m bench.onnx_ingest
	$(BIN)/python -m bench.simulate
	$(BIN)/python -m bench.placement
	$(BIN)/python -m bench.plan_document
	$(BIN)/python -m bench.moe
	$(BIN)/python -m bench.moe_http
	$(BIN)/python -m bench.request_bodies
	$(BIN)/python -m bench.parallel3d
	$(BIN)/python -m bench.hopper_in_training
	$(BIN)/python -m bench.llm_foundry
	$(BIN)/python -m bench.feedback
	$(BIN)/python -m bench.runtime
	$(BIN)/python -m bench.load

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache hyperplace.sqlite3*

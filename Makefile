# runbus developer tasks. `make` (or `make help`) lists them.

.DEFAULT_GOAL := help
SHELL := /bin/sh

PYTHON ?= python3
# uv from PATH, else as a module of $(PYTHON) (where `pip install --user uv` puts it when
# ~/.local/bin is not on PATH). Recursive on purpose: re-evaluated after `make uv` installs it.
UV ?= $(or $(shell command -v uv 2>/dev/null),$(shell $(PYTHON) -m uv --version >/dev/null 2>&1 && echo "$(PYTHON) -m uv"))
UV_RUN = $(UV) run --locked
COMPOSE ?= docker compose

.PHONY: help
help: ## Show this list of targets
	@echo "Usage: make <target>"
	@echo
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z0-9_.-]+:.*## / { printf "  %-10s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

.PHONY: uv
uv: ## Install uv with pip if it is not there yet
	@if [ -z "$(UV)" ]; then \
		echo "uv not found; installing it with pip"; \
		$(PYTHON) -m pip install --user uv || $(PYTHON) -m pip install uv; \
	fi

.PHONY: setup
setup: uv ## Create .venv with every package and dev tool, exactly as uv.lock says
	$(if $(UV),,$(error uv is still not available after `make uv`; install it and retry))
	$(UV) sync --locked

.PHONY: run
run: setup ## Run the demo: embedded NATS and the seven services, one short conversation
	$(UV_RUN) runbus demo

.PHONY: up-local
up-local: setup ## Start the stack here without docker: embedded NATS + the seven services, until Ctrl-C
	$(UV_RUN) runbus up

FAST = not (chaos or e2e or subprocess or slow or browser or real_model or cluster)

.PHONY: browser
browser: ## Install Debian's chromium for the console's browser tests (Playwright never downloads one)
	@command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium)

.PHONY: iptables
iptables: ## Install iptables for the cluster suite's partitions if absent (root; tests/cluster says why it cannot run without)
	@command -v iptables >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq iptables; } \
	  || echo "iptables not installed: tests/cluster will fail saying so"

.PHONY: test
# Two passes: the fast lanes on every core (xdist: they are most of the suite's time and safe to
# share a machine), then the lanes that start processes, kill things or time a probe, one at a
# time so their deadlines see a machine no busier than a user's. Exit 5 of either pass fails.
test: setup browser iptables ## Run the whole test suite (every lane; pytest exit 5, nothing collected, fails)
	$(UV_RUN) pytest -m "$(FAST)" -n auto
	$(UV_RUN) pytest -m "not ($(FAST))"

.PHONY: test-fast
test-fast: setup ## The inner loop: unit, contract and fast integration tests, on every core (xdist)
	$(UV_RUN) pytest -q -m "$(FAST)" -n auto

.PHONY: chaos
chaos: setup ## Kill matrix, NATS restart, fuzz and isolation sweep at full size; writes bench/results/chaos.md
	RUNBUS_CHAOS=full RUNBUS_CHAOS_REPORT=bench/results/chaos.md $(UV_RUN) pytest tests/chaos --timeout 1800

.PHONY: jepsen
jepsen: setup iptables ## Every fault on a 3-node NATS cluster in network namespaces, full size (root); writes bench/results/cluster.md
	RUNBUS_JEPSEN=full RUNBUS_JEPSEN_REPORT=bench/results/cluster.md $(UV_RUN) pytest tests/cluster --timeout 1800

.PHONY: lint
lint: setup ## Ruff (lint and format check), mypy --strict (tests/ and bench/ too), codespell, compose and k8s schemas
	$(UV_RUN) ruff check .
	$(UV_RUN) ruff format --check .
	$(UV_RUN) --group bench mypy shared/src services/*/src examples/src tests bench
	$(UV_RUN) codespell
	$(UV_RUN) check-jsonschema --builtin-schema vendor.compose-spec compose.yaml compose.cluster.yaml
	$(UV_RUN) kubernetes-validate --strict -k 1.33.0 $(filter-out %/kustomization.yaml,$(wildcard deploy/k8s/*.yaml))

.PHONY: fmt
fmt: setup ## Format the code and apply ruff's safe fixes
	$(UV_RUN) ruff format .
	$(UV_RUN) ruff check --fix .

.PHONY: bench
bench: setup bench-postgres ## Run the benchmarks (with the LangGraph + Postgres anchor)
	$(UV_RUN) --group bench python bench/run.py

.PHONY: bench-quick
bench-quick: setup bench-postgres ## A few-minute smoke run of the benchmarks (smaller sizes)
	$(UV_RUN) --group bench python bench/run.py --quick

.PHONY: bench-targets
bench-targets: setup bench-postgres ## Only the bench sections the targets are judged from; writes /tmp/runbus-bench/
	$(UV_RUN) --group bench python bench/run.py --targets

.PHONY: bench-postgres
bench-postgres: ## Install PostgreSQL's server binaries for the bench's anchor if absent (root)
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq postgresql; } \
	  || echo "PostgreSQL not installed: the bench skips the LangGraph + Postgres rows"

.PHONY: phoenix
# Its own environment (the locked `phoenix` group alone, under the data dir), so no later
# `uv sync --locked` of .venv uninstalls it under the running server.
phoenix: uv ## Arize Phoenix (optional group) as trace UI and OTLP/HTTP backend on 127.0.0.1:6006
	UV_PROJECT_ENVIRONMENT=$${RUNBUS_DATA_DIR:-.runbus}/phoenix-venv \
	PHOENIX_WORKING_DIR=$${RUNBUS_DATA_DIR:-.runbus}/phoenix PHOENIX_HOST=127.0.0.1 \
		$(UV_RUN) --only-group phoenix phoenix serve

.PHONY: up
up: setup ## Build the image and start the full stack with docker compose (NATS secrets made once)
	$(UV_RUN) runbus secrets .runbus/compose
	$(COMPOSE) up -d --build

.PHONY: down
down: ## Stop the docker compose stack
	$(COMPOSE) down

.PHONY: clean
clean: ## Remove caches, build output and local runbus state (.runbus/); keeps .venv
	rm -rf .pytest_cache .mypy_cache .ruff_cache .runbus build dist
	find . -path ./.venv -prune -o -type d -name __pycache__ -exec rm -rf {} +
	find . -path ./.venv -prune -o -type d -name '*.egg-info' -exec rm -rf {} +

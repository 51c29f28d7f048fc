# gpuyard: `make run` starts the server, `make test` runs every test.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-crash lint unit system venv bench clean docs console-assets skypilot

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) console-assets

# The web terminal's xterm.js, pinned in console/package-lock.json, copied with its
# licence into the console's static files (built, not committed).
XTERM_DIR := src/gpuyard/console/static/vendor/xterm
console-assets: $(XTERM_DIR)/.built

$(XTERM_DIR)/.built: console/package.json console/package-lock.json
	cd console && npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(XTERM_DIR)
	cp console/node_modules/@xterm/xterm/lib/xterm.js $(XTERM_DIR)/xterm.js
	cp console/node_modules/@xterm/xterm/css/xterm.css $(XTERM_DIR)/xterm.css
	cp console/node_modules/@xterm/addon-fit/lib/addon-fit.js $(XTERM_DIR)/addon-fit.js
	cp console/node_modules/@xterm/xterm/LICENSE $(XTERM_DIR)/LICENSE
	touch $@

system:
	@bash scripts/setup-system.sh

# The guide (mkdocs.yml, docs/guide/), served by gpuyard at /guide/; rebuilt when a page changed.
GUIDE := src/gpuyard/guide_site/index.html
$(GUIDE): $(STAMP) mkdocs.yml $(shell find docs/guide -type f 2>/dev/null)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q
	touch $(GUIDE)

docs: $(GUIDE)

run: venv system docs
	@echo "gpuyard web console: http://127.0.0.1:$${GPUYARD_PORT:-8000}/ (sign in with an API key)"
	@echo "guide: http://127.0.0.1:$${GPUYARD_PORT:-8000}/guide/  API reference: /docs"
	$(VENV)/bin/gpuyard serve

lint: venv
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/ruff format --check src tests bench scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy bench
	$(VENV)/bin/lint-imports
	@# No import circle (type-only imports too), no function-level import of gpuyard
	@# outside the CLI, no source file over 800 lines, no folder of more than 25 modules.
	$(PY) scripts/architecture_report.py --check > /dev/null || $(PY) scripts/architecture_report.py --check

unit: venv
	$(VENV)/bin/pytest -q tests/unit

# Every test: lint, type check, unit, service (SQLite and PostgreSQL), API and
# end-to-end tests with real containers (the last two groups at once: scripts/run-tests.sh).
test: venv docs
	@WITH_POSTGRES=1 WITH_TEST_HOSTS=1 bash scripts/setup-system.sh
	$(MAKE) --no-print-directory lint
	GPUYARD_TEST_POSTGRES_URL="$${GPUYARD_TEST_POSTGRES_URL:-$$(bash scripts/test-postgres.sh)}" \
		PYTEST=$(VENV)/bin/pytest bash scripts/run-tests.sh

# Every crash point (src/gpuyard/observability/crash_points.py): the server killed
# there with SIGKILL, started again, and checked to converge. `make test` runs a sample.
test-crash: venv
	GPUYARD_CRASH_ALL=1 $(VENV)/bin/pytest -q -ra -p no:cacheprovider tests/e2e/test_crash_points_e2e.py

# SkyPilot's client (~/.cache/gpuyard/skypilot) and its pod image, built offline for
# tests/e2e/test_skypilot_e2e.py (which builds them itself when missing).
skypilot: venv
	$(PY) -m tests.e2e.skypilot_image

bench: venv system
	$(PY) bench/bench_start_latency.py
	$(PY) bench/bench_get_cluster.py
	$(PY) bench/bench_graphql.py
	$(PY) bench/bench_autoterminate.py
	$(PY) bench/bench_observe.py
	WITH_POSTGRES=1 bash scripts/setup-system.sh
	GPUYARD_TEST_POSTGRES_URL="$${GPUYARD_TEST_POSTGRES_URL:-$$(bash scripts/test-postgres.sh)}" \
		$(PY) bench/bench_scale.py
	$(PY) bench/bench_training.py
	$(PY) bench/bench_hostile.py
	$(PY) bench/bench_placement.py
	WITH_TEST_HOSTS=1 bash scripts/setup-system.sh
	$(PY) bench/bench_volume_move.py
	$(PY) bench/bench_snapshot.py
	WITH_BENCH=1 bash scripts/setup-system.sh
	$(PY) bench/bench_proxy.py
	$(PY) bench/bench_ssh_gateway.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

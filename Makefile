# make demo   set up .venv and run the order-processing demo
# make test   set up .venv and run lint, types and the whole test suite
# make check  lint + types
# make bench  run the benchmarks (see docs/benchmarks.md)
#
# The suite by cost, cheapest first (each also sets up .venv; docs/testing.md):
# make test-unit        pure logic, no server, no process: seconds
# make test-sim         the deterministic simulation and sasflow.testing: seconds
# make test-contract    every store and transport against the machine's servers
# make test-acceptance  the `sasflow` command line as a subprocess
# make test-chaos       worker processes killed, frozen and partitioned
# make test-scenario    the fault matrix: private servers crashed and restarted
# make test-web         the HTTP API and the dashboard, in a real Chromium
#
# make screenshots      the dashboard's main pages, as docs/images/*.png

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test check bench clean \
	test-unit test-sim test-contract test-acceptance test-chaos test-scenario test-web \
	screenshots

$(BIN)/sasflow: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(BIN)/sasflow
	$(BIN)/sasflow demo

# The tests spread over two processes, each file's in one (most wait on processes and
# servers, not on the CPU); then the fault scenarios (chaos/, scenario/), which wait
# for replacements and lease takeovers, two files at a time on their own; then, in one
# process, the API fuzzing (docs/testing.md).
test: $(BIN)/sasflow
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -n 2 --dist loadfile -m "not faults and not serial" --durations=10
	$(BIN)/pytest -q -n 2 --dist loadfile -m faults --durations=20
	$(BIN)/pytest -q -m serial --durations=5

test-unit test-sim test-contract test-acceptance test-chaos test-scenario test-web: $(BIN)/sasflow
	$(BIN)/pytest -q tests/$(@:test-%=%)

screenshots: $(BIN)/sasflow
	mkdir -p docs/images
	SASFLOW_SCREENSHOTS=docs/images $(BIN)/pytest -q tests/web/test_browser.py -k retries

check: $(BIN)/sasflow
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

bench: $(BIN)/sasflow
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# make demo   set up .venv and run the order-processing demo
# make test   set up .venv and run the whole test suite
# make check  lint + types
# make bench  run the benchmarks (see docs/benchmarks.md)

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: demo test check bench clean

$(BIN)/sasflow: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(BIN)/sasflow
	$(BIN)/sasflow demo

test: $(BIN)/sasflow
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q

check: $(BIN)/sasflow
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

bench: $(BIN)/sasflow
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

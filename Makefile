# `make demo` and `make test` work from a fresh clone: each creates its own
# virtual environment. PYTHON picks the interpreter (e.g. PYTHON=python3.12);
# every interpreter gets its own environment.
PYTHON ?= python3
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV ?= .venv-$(PYVER)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

DOCS_STAMP := $(VENV)/.docs-installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: demo test test-1x lint typecheck check clean bench docs

# pip prints what it collects and installs: the first run takes a few minutes.
$(STAMP): pyproject.toml
	@echo "=== creating $(VENV) for Python $(PYVER) and installing aiocop with its test tools (a few minutes, once)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

# The demo needs aiocop and uvloop only: the test tools come with `make test`.
$(DEMO_STAMP): pyproject.toml
	@echo "=== creating $(VENV) for Python $(PYVER) and installing aiocop with uvloop for the demo"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[uvloop]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m aiocop run --uvloop examples/demo_app.py

# Two pytest-xdist workers, a test file each at a time (module fixtures run once);
# TEST_WORKERS=0 runs them in this process. The test programs the tests start
# may keep their byte code (PYTHONDONTWRITEBYTECODE off) instead of compiling
# aiocop and pytest's rewritten plugins anew in each of hundreds of processes.
TEST_WORKERS ?= 2
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

# aiocop 1.2.1's own test suite, unchanged, against this checkout (downloaded from PyPI).
test-1x: $(STAMP)
	$(BIN)/python .ci/aiocop1_suite.py

lint: $(STAMP)
	$(BIN)/ruff check aiocop tests benchmarks examples docs/hooks .ci
	$(BIN)/ruff format --check aiocop tests benchmarks examples docs/hooks .ci

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

$(DOCS_STAMP): $(STAMP)
	@echo "=== installing the documentation tools into $(VENV)"
	$(BIN)/python -m pip install -e '.[docs]'
	touch $(DOCS_STAMP)

# Strict: a broken link, a missing page or a missing snippet fails the build.
docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/run_benchmark.py

clean:
	rm -rf .venv-* .pytest_cache .mypy_cache .ruff_cache site

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

.PHONY: demo test test-unit test-timing test-1x lint typecheck check clean bench docs

# With uv on the PATH (CI puts it there) an environment takes seconds; with
# pip, about a minute of CPU. Either prints what it installs: the first run
# takes a minute or a few, once.
UV := $(shell command -v uv 2>/dev/null)
ifdef UV
# --seed: pip inside too (tests and .ci/aiocop1_suite.py download with it).
NEW_VENV = $(UV) venv -q --seed --allow-existing -p $(PYTHON) $(VENV)
INSTALL = $(UV) pip install -p $(BIN)/python
else
NEW_VENV = $(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install -q --upgrade pip
INSTALL = $(BIN)/python -m pip install
endif

$(STAMP): pyproject.toml
	@echo "=== creating $(VENV) for Python $(PYVER) and installing aiocop with its test tools (once)"
	$(NEW_VENV)
	$(INSTALL) -e '.[dev]'
	touch $(STAMP)

# The demo needs aiocop and uvloop only: the test tools come with `make test`.
$(DEMO_STAMP): pyproject.toml
	@echo "=== creating $(VENV) for Python $(PYVER) and installing aiocop with uvloop for the demo"
	$(NEW_VENV)
	$(INSTALL) -e '.[uvloop]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m aiocop run --uvloop examples/demo_app.py

# Two pytest-xdist workers, a test file each at a time (module fixtures run once);
# TEST_WORKERS=0 runs them in this process. The test programs the tests start
# may keep their byte code (PYTHONDONTWRITEBYTECODE off) instead of compiling
# aiocop and pytest's rewritten plugins anew in each of hundreds of processes.
TEST_WORKERS ?= 2
PYTEST_RUN = PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -p no:cacheprovider --dist loadfile --durations=10
PYTEST = $(PYTEST_RUN) -n $(TEST_WORKERS)
# `make test` runs the deterministic tests, then the `timing` ones on their own
# (tests/conftest.py says which are which): those rest on real time, so nothing
# else of the suite runs beside them, each is re-run once on failure, and every
# re-run is listed at the end with the failure that caused it. Past 5 re-runs
# the run fails: that is no passing hiccup.
# The timing tests mostly wait (a quarter of two cores' time), so four workers
# share the cores; TIMING_MARKS narrows them (CI runs the integrations once).
# pytest-xdist hands out the files with most tests first: the Prometheus fleet
# file (two tests of 40 s of real time) starts late and ends the run alone.
# Handing out the longest first (--no-loadscope-reorder) packed the run
# tighter, 153-167 s instead of 188-199 s on 3.11 with two `yes` beside it, but
# with 5 re-runs in 3 runs against none in 2 (three workers: 182-191 s, 1
# re-run in 2): more of these tests at once hold less well. Kept as it is.
TEST_MARKS ?= not timing
TIMING_MARKS ?= timing
TIMING_WORKERS ?= 4
TIMING = $(PYTEST_RUN) -n $(TIMING_WORKERS) -m "$(TIMING_MARKS)" --reruns 1 --max-suite-reruns 5 --rerun-show-tracebacks -rR
test: $(STAMP)
	$(PYTEST) -m "$(TEST_MARKS)"
	$(TIMING)

# The halves of `make test`, as CI schedules them (.ci/run): TEST_MARKS narrows
# the first, e.g. TEST_MARKS="not timing and not cost and not integration".
test-unit: $(STAMP)
	$(PYTEST) -m "$(TEST_MARKS)"

test-timing: $(STAMP)
	$(TIMING)

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
	$(INSTALL) -e '.[docs]'
	touch $(DOCS_STAMP)

# Strict: a broken link, a missing page or a missing snippet fails the build.
docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/run_benchmark.py

clean:
	rm -rf .venv-* .pytest_cache .mypy_cache .ruff_cache site

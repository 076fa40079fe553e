# `make demo` and `make test` work from a fresh clone: each creates its own
# virtual environment. PYTHON picks the interpreter (e.g. PYTHON=python3.12);
# every interpreter gets its own environment.
PYTHON ?= python3
PYVER := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
VENV ?= .venv-$(PYVER)
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: demo test lint typecheck check clean bench docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m aiocop run --uvloop examples/demo_app.py

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check aiocop tests benchmarks examples
	$(BIN)/ruff format --check aiocop tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# Strict: a broken link, a missing page or a missing snippet fails the build.
docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python benchmarks/run_benchmark.py

clean:
	rm -rf .venv-* .pytest_cache .mypy_cache .ruff_cache site

# gpuledger — two commands for a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
# Caches live outside the repo so a clean clone reuses them.
export PIP_CACHE_DIR ?= $(HOME)/.cache/gpuledger/pip
OUT ?= out

.PHONY: demo test lint typecheck unit wheel-check bench clean venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpuledger demo --out $(OUT)/demo

lint: $(STAMP)
	$(VENV)/bin/ruff check events scheduler projections replay tests bench scripts
	$(VENV)/bin/ruff format --check events scheduler projections replay tests bench scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q

# Build the wheel and install it into a fresh venv once, so a package or data
# file missing from pyproject.toml is caught before users find it.
wheel-check: $(STAMP)
	bash scripts/wheel-check.sh

test: lint typecheck unit wheel-check

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(OUT) build dist *.egg-info

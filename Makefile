# gpuledger — two commands for a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell sha1sum pyproject.toml | cut -c1-12)
RUNTIME := $(VENV)/.runtime-$(HASH)
STAMP := $(VENV)/.installed-$(HASH)
# Caches live outside the repo so a clean clone reuses them.
export PIP_CACHE_DIR ?= $(HOME)/.cache/gpuledger/pip
OUT ?= out

.PHONY: demo test lint typecheck unit suite wheel-check bench fuzz mutate clean venv native kafka-up kafka-down k8s-up k8s-down browsers helm

# `make demo` needs the runtime dependencies only; `make test` adds the development tools.
$(RUNTIME): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	bash scripts/console-assets.sh  # Chart.js for the console, from the npm registry
	mkdir -p projections/console/static/vendor  # a package of the wheel, even without npm
	$(PY) -m pip install -q -e .
	rm -f $(VENV)/.runtime-*; touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*; touch $(STAMP)

venv: $(STAMP) native

# The policy core compiled by mypyc (scheduler/native.py): about 80 s on the 2-core machine,
# kept in ~/.cache/gpuledger/native under a hash of its sources, a no-op when built. Every
# gpuledger process then runs it (GPULEDGER_CORE=pure opts out); the suite runs the core as
# Python and tests/test_native.py the compiled one.
native: $(STAMP)
	$(PY) scripts/native.py build

demo: $(RUNTIME)
	$(VENV)/bin/gpuledger demo --out $(OUT)/demo  # its last line: the console's serve command

lint: $(STAMP)
	$(VENV)/bin/ruff check events scheduler projections replay tests bench scripts
	$(VENV)/bin/ruff format --check events scheduler projections replay tests bench scripts
	$(VENV)/bin/lint-imports  # the layering contracts in pyproject.toml

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The tests that need no broker, API server or browser (markers set in tests/conftest.py):
# 1,369 of the 1,438, no infrastructure started; 2 min 10 s on the 2-core machine in four
# processes (6 to 11 min one test at a time, depending on the load).
UNIT_MARKERS := not kafka and not kube and not browser
# Four processes on two cores: about half of a unit test's time is spent waiting on a
# subprocess or a file, not computing.
UNIT_WORKERS ?= 4
unit: $(STAMP) native
	$(VENV)/bin/pytest -q -n $(UNIT_WORKERS) -m "$(UNIT_MARKERS)"

# The whole suite, with its broker, control plane, Chromium and helm. CI=true unless the
# caller set CI: a missing prerequisite (Chromium, the shared trace, helm, atheris) then
# fails the run instead of skipping (tests/prereq.py); plain `pytest` skips it.
suite: $(STAMP) native kafka-up k8s-up browsers helm
	CI=$${CI:-true} $(VENV)/bin/pytest -q

# Headless Chromium for the HTML report's screenshot test (apt; skipped when present).
browsers:
	bash scripts/install-chromium.sh

# helm for tests/test_helm.py, built once from the Go module proxy into ~/.cache/gpuledger/helm.
helm:
	bash scripts/helm.sh

# Build the wheel and install it into a fresh venv once, so a package or data
# file missing from pyproject.toml is caught before users find it.
wheel-check: $(STAMP)
	bash scripts/wheel-check.sh
	bash scripts/demo-check.sh  # `make demo` from a fresh clone: runtime deps only, quiet

test: lint typecheck suite wheel-check

bench: $(STAMP) native kafka-up k8s-up
	$(PY) -m bench --kafka  # with the live path on the broker (bench/kafka_bench.py)
	bash scripts/k8s.sh kube-scheduler >/dev/null  # upstream kube-scheduler, API server's version (cached)
	$(PY) -m bench.kube  # 500 kwok nodes, 4,000 pods through the real API server: gpuledger vs kube-scheduler
	$(PY) -m bench.kube --backlog  # the same with every pod created first: each scheduler's own rate
	$(PY) -m bench.core --json $(OUT)/bench/core.json  # scheduling cycles at 1,000 and 4,000 nodes, fill rate, memory
	mkdir -p docs/bench && cp $(OUT)/bench/core.json docs/bench/core.json
	$(PY) scripts/bench_tables.py  # docs/operations.md's tables from the JSON just written
	$(PY) -m bench.policy --json $(OUT)/bench-policy.json  # gpuledger vs easy, fifo, drf on a congested multi-tenant week
	$(PY) -m bench.forecast --json $(OUT)/bench/forecast.json  # forecast accuracy on both bench.policy runs, and cost
	cp $(OUT)/bench/forecast.json docs/bench/forecast.json && $(PY) scripts/bench_tables.py
	$(PY) -m bench.soak  # the demo at 10x arrival rate for 6 h, then normal: latency and RSS per hour
	$(PY) -m bench.soak --kafka  # 3.5 min on the broker: normal, 10x burst, normal; latency, lag, RSS

# Coverage-guided fuzzing (atheris) of the decoders, the segment reader, the YAML loaders and
# JSON Lines import, FUZZ_SECONDS per target; corpora and crash inputs go to out/fuzz/ (docs/operations.md).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= codec segment config jsonl
fuzz: $(STAMP)
	set -e; for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  $(PY) -m tests.fuzz.atheris_targets $$t -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1; \
	done

# Mutation testing of the policy core (mutmut, [tool.mutmut] in pyproject.toml): each mutant
# of scheduler/core runs the pure-core tests that cover it. MUTANTS narrows the run to mutant
# name globs (e.g. 'scheduler.core.victims*'); work and results are kept in mutants/
# (git-ignored), so a second run resumes (docs/operations.md).
MUTANTS ?=
MUTATE_JOBS ?= 2
mutate: $(STAMP)
	nice -n 19 $(VENV)/bin/mutmut run --max-children $(MUTATE_JOBS) $(MUTANTS)
	$(VENV)/bin/mutmut results

# A single-node Kafka (KRaft) on 127.0.0.1:19092 for the live path and its tests; jars are
# cached in ~/.cache/gpuledger, data and logs live in /tmp/gpuledger-kafka (docs/operations.md).
kafka-up:
	bash scripts/kafka.sh up

kafka-down:
	bash scripts/kafka.sh down

# etcd + kube-apiserver + kwok on 127.0.0.1:16443 for the Kubernetes adapters' tests; built
# from the Go module proxy once and cached in ~/.cache/gpuledger/k8s (docs/operations.md).
k8s-up:
	bash scripts/k8s.sh up

k8s-down:
	bash scripts/k8s.sh down

clean:
	rm -rf $(VENV) $(OUT) build dist *.egg-info

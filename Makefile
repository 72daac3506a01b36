# `make demo` and `make test` install what they need, idempotently: Debian packages (apt-get),
# then a virtual environment in .venv/ with sandloop and its dev dependencies.
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEB_STAMP := $(VENV)/.deb-installed
DEMO := $(CURDIR)/build/demo
# gcc/g++/nodejs/bash: the sandboxed languages (gcc + libc6-dev also build the C helper that
# each run uses to isolate itself); libseccomp2: the seccomp filter compiler; chromium: the
# monitor dashboard's end-to-end test (headless); default-jdk-headless (javac, jar, java),
# golang-go, rustc and node-typescript (tsc): Java, Go, Rust and TypeScript (docs/sandbox.md).
DEB_PKGS := python3 python3-venv gcc g++ libc6-dev nodejs bash libseccomp2 chromium \
	default-jdk-headless golang-go rustc node-typescript
# user-mode-linux: a Linux guest as an ordinary process, whose cgroup v2 hierarchy the sandbox
# suites run on again (tests/uml/run_in_uml.py); its own stamp, so existing checkouts get it too.
UML_STAMP := $(VENV)/.uml-installed
RESULTS := build/test-results

# The training environment (`sandloop train`, tests/train): torch pinned first, so that pip picks
# the CPU wheel here instead of the CUDA build (~3 GB), then the train extra.
TVENV := .venv-train
TVPY := $(TVENV)/bin/python
TSTAMP := $(TVENV)/.installed
TORCH_PIN := torch==2.13.0

.PHONY: demo test test-cgroup-v2 test-slow lint bench deps clean train-env .venv-train

$(DEB_STAMP): Makefile
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

$(UML_STAMP): | $(DEB_STAMP)
	@dpkg -s user-mode-linux >/dev/null 2>&1 || { echo "installing Debian packages: user-mode-linux"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq user-mode-linux; }
	@touch $@

# setup.py builds the C helper (jail.c) into the package at install time: a changed jail.c
# reinstalls, so that `make test` never runs a helper built from an older source (which
# jailbuild refuses anyway, falling back to the slower Python steps).
$(STAMP): pyproject.toml setup.py src/sandloop/sandbox/jail.c | $(DEB_STAMP)
	@test -x $(VPY) || $$(command -v python3.11 || command -v python3) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	# verl's own sandbox_fusion client, OpenRLHF's reward executor and TRL's trainer source, for
	# the compatibility tests; --no-deps: not their torch/ray stacks
	$(VPY) -m pip install -q --no-deps 'verl>=0.4' 'openrlhf>=0.11.2,<0.12' 'trl>=1.16,<2'
	@touch $@

$(TSTAMP): pyproject.toml | $(DEB_STAMP)
	@test -x $(TVPY) || $$(command -v python3.11 || command -v python3) -m venv $(TVENV)
	$(TVPY) -m pip install -q --upgrade pip
	$(TVPY) -m pip install -q '$(TORCH_PIN)'
	$(TVPY) -m pip install -q -e '.[train,dev]'
	@touch $@

.venv-train: $(TSTAMP)
train-env: $(TSTAMP)

deps: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sandloop doctor
	$(VENV)/bin/sandloop exec-batch --table examples/demo_batch.jsonl
	$(VENV)/bin/sandloop demo
	# Task validation of a bundled set with one planted defect per problem code; --exit-zero
	# because rejecting those tasks is the point of the demo (it exits 1 on rejects otherwise).
	$(VENV)/bin/sandloop tasks validate curation-demo --exit-zero --no-db
	# A small monitored training run: score its rollouts step by step into a rollout log, then
	# the monitor's alerts and report (hacks appear from step 7; the alert comes at step 8).
	@rm -f $(DEMO)/run.db $(DEMO)/run.db-wal $(DEMO)/run.db-shm
	$(VENV)/bin/sandloop score --tasks humaneval --completions examples/demo_run.jsonl --json \
	  --db $(DEMO)/results.db --rollout-log $(DEMO)/run.db --run-id demo
	$(VENV)/bin/sandloop monitor analyze $(DEMO)/run.db
	$(VENV)/bin/sandloop monitor report $(DEMO)/run.db -o $(DEMO)/report.html

test: $(STAMP) $(UML_STAMP) $(TSTAMP)
	$(VPY) -m ruff check src tests benchmarks
	$(VPY) -m mypy
	$(VENV)/bin/lint-imports --no-cache
	@mkdir -p $(RESULTS)
	$(VPY) -m pytest -q --junitxml=$(RESULTS)/v1-c.xml
	# The closed loop (tests/train) in its own environment; one thread per process: the loop and
	# its sandboxes share the cores, and two threads on a busy 2-core machine ran 6x slower.
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(TVPY) -m pytest -q tests/train
	# The sandbox and adversarial suites again, with the children's isolation steps in Python
	# (the fallback for hosts without a C compiler) instead of the C helper.
	SANDLOOP_JAIL=python $(VPY) -m pytest -q --junitxml=$(RESULTS)/v1-python.xml tests/sandbox tests/security
	# Both again on cgroup v2 (this host has v1 only), in a User-mode Linux guest; the table
	# puts them next to the runs above (docs/sandbox.md, "cgroup v2").
	$(VPY) tests/uml/run_in_uml.py --v1-junit $(RESULTS)

test-cgroup-v2: $(STAMP) $(UML_STAMP)
	$(VPY) tests/uml/run_in_uml.py --v1-junit $(RESULTS)

test-slow: $(STAMP)
	$(VPY) -m pytest -q -m slow

lint: $(STAMP)
	$(VPY) -m ruff check src tests benchmarks
	$(VPY) -m mypy
	$(VENV)/bin/lint-imports --no-cache

bench: $(STAMP)
	$(VPY) benchmarks/bench_sandbox.py
	$(VPY) benchmarks/bench_score.py
	$(VPY) benchmarks/bench_engine.py
	$(VPY) benchmarks/bench_server.py

clean:
	rm -rf $(VENV) $(TVENV) build src/*.egg-info src/sandloop/sandbox/jail.so.1

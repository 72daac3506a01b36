# `make demo` and `make test` install what they need, idempotently: Debian packages (apt-get),
# then a virtual environment in .venv/ with sandloop and its dev dependencies.
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEB_STAMP := $(VENV)/.deb-installed
# gcc/g++/nodejs/bash: the sandboxed languages (gcc + libc6-dev also build the C helper that
# each run uses to isolate itself); libseccomp2: the seccomp filter compiler.
DEB_PKGS := python3 python3-venv gcc g++ libc6-dev nodejs bash libseccomp2

# The training environment (`sandloop train`, tests/train): torch pinned first, so that pip picks
# the CPU wheel here instead of the CUDA build (~3 GB), then the train extra.
TVENV := .venv-train
TVPY := $(TVENV)/bin/python
TSTAMP := $(TVENV)/.installed
TORCH_PIN := torch==2.13.0

.PHONY: demo test test-slow lint bench deps clean train-env .venv-train

$(DEB_STAMP):
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

$(STAMP): pyproject.toml | $(DEB_STAMP)
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

test: $(STAMP) $(TSTAMP)
	$(VPY) -m ruff check src tests benchmarks
	$(VPY) -m mypy
	$(VPY) -m pytest -q
	# The closed loop (tests/train) in its own environment; one thread per process: the loop and
	# its sandboxes share the cores, and two threads on a busy 2-core machine ran 6x slower.
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 $(TVPY) -m pytest -q tests/train
	# The sandbox and adversarial suites again, with the children's isolation steps in Python
	# (the fallback for hosts without a C compiler) instead of the C helper.
	SANDLOOP_JAIL=python $(VPY) -m pytest -q tests/sandbox tests/security

test-slow: $(STAMP)
	$(VPY) -m pytest -q -m slow

lint: $(STAMP)
	$(VPY) -m ruff check src tests benchmarks
	$(VPY) -m mypy

bench: $(STAMP)
	$(VPY) benchmarks/bench_sandbox.py
	$(VPY) benchmarks/bench_score.py
	$(VPY) benchmarks/bench_engine.py
	$(VPY) benchmarks/bench_server.py

clean:
	rm -rf $(VENV) $(TVENV) build src/*.egg-info

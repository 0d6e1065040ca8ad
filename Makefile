# The two commands of the README's quickstart, and what they need. Everything installs into .venv
# from the package registry, at the exact versions of requirements/lock.txt (the versions the
# suite passed with), so a fresh machine needs only python3 (>= 3.11) and make. pyproject.toml
# keeps version ranges for people who install the library into their own environment.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCK := requirements/lock.txt
# The lock pins the installer and the build backend too; the project is built with them
# (no isolated build environment that would fetch the newest setuptools).
INSTALL = $(1)/python -m pip install --quiet --disable-pip-version-check
LOCKED = $(call INSTALL,$(BIN)) --constraint $(LOCK)

.PHONY: demo test lint unit integration bench lock clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# The demo's install: the library, the embedded broker and matplotlib, none of the test tools.
# The warm-up compiles the numba kernels once, so the demo's first seconds are not spent on it.
$(VENV)/.demo-installed: pyproject.toml $(LOCK) | $(BIN)/python
	$(LOCKED) pip setuptools
	$(LOCKED) --no-build-isolation -e '.[demo]'
	$(BIN)/python -m streambandit.cli.warmup
	@touch $@

# The development install: the above plus pytest, scikit-learn and the peers the benchmarks
# compare against (their adapters' tests run rather than skip).
$(VENV)/.dev-installed: pyproject.toml $(LOCK) | $(BIN)/python
	$(LOCKED) pip setuptools
	$(LOCKED) --no-build-isolation -e '.[dev]'
	$(BIN)/python -m streambandit.cli.warmup
	@touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/streambandit demo

# The linter and the formatter's check first (seconds), then the whole suite: the Apache Kafka
# tier in a pytest process beside the rest where this machine runs it (tests/run_tiers.py says why).
test: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tests/run_tiers.py

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

unit: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -q tests/unit

# BROKER=tansu, kafka or both: the brokers the integration tests run on (default: both where java
# and mvn are, else tansu; tests/integration/conftest.py).
integration: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -q tests/integration $(if $(BROKER),--broker=$(BROKER))

bench: $(VENV)/.dev-installed
	$(BIN)/python -m bench.policies

# A deliberate upgrade: the newest versions the ranges of pyproject.toml allow, in a separate
# environment; the whole suite runs on them, and only if it passes is the lock rewritten.
# Review `git diff requirements/lock.txt`, then commit it.
lock:
	rm -rf .venv-lock
	$(PY) -m venv .venv-lock
	$(call INSTALL,.venv-lock/bin) --upgrade pip setuptools
	$(call INSTALL,.venv-lock/bin) --no-build-isolation --upgrade -e '.[dev]'
	.venv-lock/bin/ruff check .
	.venv-lock/bin/ruff format --check .
	.venv-lock/bin/python -m pytest -q
	{ echo "# Exact versions the whole suite passed with (make lock, $$(.venv-lock/bin/python -V), $$(uname -m))."; \
	  echo "# Used as a pip constraints file by the Makefile and deploy/Dockerfile; refresh with make lock."; \
	  .venv-lock/bin/python -m pip freeze --all --exclude-editable | grep -v '^#'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

clean:
	rm -rf $(VENV) .venv-lock .pytest_cache

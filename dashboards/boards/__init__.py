"""The boards, one module each, each with ``build(config, rules_config)``."""

from __future__ import annotations

from dashboards.boards import engine, gpu, pipeline, slo, tenants

BOARDS = {"slo": slo, "engine": engine, "gpu": gpu, "pipeline": pipeline, "tenants": tenants}
"""Board key (the uid suffix and file name) -> module."""

__all__ = ["BOARDS"]

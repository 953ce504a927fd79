"""The boards, one module each, each with ``build(config, rules_config, length_edges)`` (the length edges are
serve.length_bucket_edges, which the length-class panels select by)."""

from __future__ import annotations

from dashboards.boards import engine, gpu, pipeline, slo, tenants

BOARDS = {"slo": slo, "engine": engine, "gpu": gpu, "pipeline": pipeline, "tenants": tenants}
"""Board key (the uid suffix and file name) -> module."""

__all__ = ["BOARDS"]

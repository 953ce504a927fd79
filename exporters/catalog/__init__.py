"""The one metric catalog: every family inferwatch emits or reads, with its help and labels.

Outside this package a metric name is spelled only through a :class:`MetricSpec` attribute,
so exporters, rules and dashboards cannot drift apart. Each area keeps its specs in its own
module (``request``, ``upstreams`` for the lane, priority and shadow,
``genai`` for OpenTelemetry's GenAI names, ``vllm``, ``engine``, ``gpu``,
``usage`` for usage and cost by tenant,
``process``, ``pipeline``, ``rules``, ``recordings`` for our recording rules' outputs,
``prometheus`` for what Prometheus writes itself, ``cutover`` for wrong-model answers, tokenizer
drift and text classes);
``ALL_SPECS`` joins them and refuses a name declared twice.
"""

from __future__ import annotations

import importlib

from exporters.catalog.spec import MetricSpec, MetricType, Source

_AREAS = (
    "request", "usage", "upstreams", "genai", "vllm", "sglang", "llamacpp", "engine", "engines", "gpu", "process",
    "pipeline", "rules", "recordings", "prometheus",
    "cutover",
)


def _load() -> tuple[MetricSpec, ...]:
    specs: list[MetricSpec] = []
    for area in _AREAS:
        try:
            module = importlib.import_module(f"exporters.catalog.{area}")
        except ModuleNotFoundError as err:
            if err.name != f"exporters.catalog.{area}":
                raise
            continue
        specs.extend(module.SPECS)
    seen: dict[str, MetricSpec] = {}
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"metric {spec.name!r} is declared twice in the catalog")
        seen[spec.name] = spec
    return tuple(specs)


ALL_SPECS: tuple[MetricSpec, ...] = _load()
BY_NAME: dict[str, MetricSpec] = {s.name: s for s in ALL_SPECS}


def sample_names() -> frozenset[str]:
    """Every sample name (series) of every family in the catalog, vLLM aliases included."""
    names: set[str] = set()
    for spec in ALL_SPECS:
        names.update(spec.sample_names())
        for alias in spec.aliases.values():
            names.add(alias)
    return frozenset(names)


__all__ = ["ALL_SPECS", "BY_NAME", "MetricSpec", "MetricType", "Source", "sample_names"]

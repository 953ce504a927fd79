"""Ollama's models as gauges: ``/api/tags`` (pulled) and ``/api/ps`` (loaded, with their memory) -> a snapshot,
and the collector that exports it (exporters/catalog/engines.py names the families).

Pure: the sidecar polls the two endpoints (serving/ollama_watch.py) and hands their JSON here. Fields follow
Ollama's API reference: ``/api/tags`` ``{"models": [{"name", "size", ...}]}``, ``/api/ps`` ``{"models": [{"name",
"size", "size_vram", "expires_at", ...}]}``; a field that is missing or not a number is left out, never 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from exporters.catalog import engines as ce
from exporters.catalog.spec import MetricSpec


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """One model Ollama holds in memory."""

    name: str
    size_bytes: float | None
    vram_bytes: float | None
    expires_unix: float | None


@dataclass(frozen=True, slots=True)
class OllamaModels:
    """What the latest poll of Ollama found (``ok`` False: it failed; the rest is the last good one's)."""

    upstream: str
    ok: bool
    pulled: tuple[tuple[str, float | None], ...] = ()
    loaded: tuple[LoadedModel, ...] = ()


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _unix(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _models(answer: Any) -> list[dict[str, Any]]:
    models = answer.get("models") if isinstance(answer, dict) else None
    return [m for m in models if isinstance(m, dict) and isinstance(m.get("name"), str)] if isinstance(
        models, list) else []


def parse_models(upstream: str, tags: Any, ps: Any) -> OllamaModels:
    """The snapshot of ``/api/tags``' and ``/api/ps``' decoded JSON answers."""
    pulled = tuple(sorted((m["name"], _number(m.get("size"))) for m in _models(tags)))
    loaded = tuple(sorted(
        (LoadedModel(m["name"], _number(m.get("size")), _number(m.get("size_vram")), _unix(m.get("expires_at")))
         for m in _models(ps)), key=lambda model: model.name))
    return OllamaModels(upstream, True, pulled, loaded)


class OllamaCollector(Collector):
    """Exports the latest :class:`OllamaModels` (nothing before the first poll)."""

    def __init__(self, snapshot: Callable[[], OllamaModels | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Fresh families from the latest snapshot."""
        snap = self._snapshot()
        if snap is None:
            return
        up = GaugeMetricFamily(ce.OLLAMA_POLL_UP.name, ce.OLLAMA_POLL_UP.help, labels=ce.OLLAMA_POLL_UP.labels)
        up.add_metric([snap.upstream], 1.0 if snap.ok else 0.0)
        yield up
        if not snap.ok:
            return
        count = GaugeMetricFamily(ce.OLLAMA_MODELS.name, ce.OLLAMA_MODELS.help, labels=ce.OLLAMA_MODELS.labels)
        count.add_metric([snap.upstream], float(len(snap.pulled)))
        yield count
        sizes = GaugeMetricFamily(ce.OLLAMA_MODEL_SIZE.name, ce.OLLAMA_MODEL_SIZE.help,
                                  labels=ce.OLLAMA_MODEL_SIZE.labels)
        for name, size in snap.pulled:
            if size is not None:
                sizes.add_metric([snap.upstream, name], size)
        yield sizes
        readings: tuple[tuple[MetricSpec, Callable[[LoadedModel], float | None]], ...] = (
            (ce.OLLAMA_LOADED_BYTES, lambda m: m.size_bytes), (ce.OLLAMA_LOADED_VRAM_BYTES, lambda m: m.vram_bytes),
            (ce.OLLAMA_LOADED_EXPIRES, lambda m: m.expires_unix),
        )
        for spec, value_of in readings:
            family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            for model in snap.loaded:
                value = value_of(model)
                if value is not None:
                    family.add_metric([snap.upstream, model.name], value)
            yield family

"""The cut-over families on a registry: wrong-model requests, requests by text class, tokenizer fingerprints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from exporters.catalog import cutover as cat
from exporters.catalog.cutover import RETIRED_MODEL
from exporters.records import RequestRecord


class TokenizerFingerprints:
    """The latest tokenizer fingerprint per (upstream, model); a collector of its info family.

    ``set`` is called by whoever probes the upstream; a fingerprint that differs from the one before under the
    same upstream and model counts one change.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._latest: dict[tuple[str, str], str] = {}
        spec = cat.UPSTREAM_TOKENIZER_CHANGES
        self.changes = Counter(spec.name, spec.help, spec.labels, registry=registry)
        registry.register(self)

    def get(self, upstream: str, model: str) -> str | None:
        """The latest fingerprint of ``model`` on ``upstream``, or None before one was taken."""
        return self._latest.get((upstream, model))

    def set(self, upstream: str, model: str, fingerprint: str) -> bool:
        """Remember a fingerprint; True when it changed under the same upstream and model."""
        key = (upstream, model)
        before = self._latest.get(key)
        latest = dict(self._latest)  # readers (the collector, request threads) see one whole dict
        latest[key] = fingerprint
        self._latest = latest
        counter = self.changes.labels(upstream, model)  # 0 from the first fingerprint: increase() sees a change
        if before is not None and before != fingerprint:
            counter.inc()
            return True
        return False

    def collect(self) -> Iterator[Metric]:
        """The info family, fresh on every scrape."""
        spec = cat.UPSTREAM_TOKENIZER
        family = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for (upstream, model), fingerprint in sorted(self._latest.items()):
            family.add_metric([upstream, model, fingerprint], 1.0)
        yield family


class CutoverMetrics:
    """Counters observed once per finished request: wrong-model requests and generation requests by text class."""

    def __init__(self, registry: CollectorRegistry) -> None:
        wrong, classes = cat.WRONG_MODEL_REQUESTS, cat.TEXT_CLASS_REQUESTS
        self.wrong_model = Counter(wrong.name, wrong.help, wrong.labels, registry=registry)
        self.text_classes = Counter(classes.name, classes.help, classes.labels, registry=registry)
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Counter, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, record: RequestRecord, *, generation: bool) -> None:
        """Count one finished request; ``generation``: it ran the model (a text class is counted)."""
        if generation:
            self._child(self.text_classes, record.model, record.text_class, str(record.outcome)).inc()
        if record.wrong_model is not None:
            # a retired name is bounded by the config; any other requested name by the proxy's model label
            model = record.requested_model if record.wrong_model == RETIRED_MODEL else record.model
            self._child(self.wrong_model, model or "unknown", record.wrong_model).inc()


__all__ = ["CutoverMetrics", "TokenizerFingerprints"]

"""Instruments of the upstream choice (lane fallbacks, estimate error, priority classes, shadow), from records.

Everything is observed from the finished :class:`~exporters.records.RequestRecord`, so with
``serve --workers N`` the primary counts the other processes' requests the same way.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from exporters.batch_histogram import BatchHistogram
from exporters.catalog import upstreams as cat
from exporters.records import RequestRecord

_DROPPED_PREFIX = "dropped_"


class UpstreamMetrics:
    """Observes one finished request into the families of exporters/catalog/upstreams.py."""

    def __init__(self, registry: CollectorRegistry, fallback: str = "main") -> None:
        self._fallback = fallback
        self.fallbacks = Counter(cat.LONG_LANE_FALLBACKS.name, cat.LONG_LANE_FALLBACKS.help,
                                 cat.LONG_LANE_FALLBACKS.labels, registry=registry)
        self.estimate_ratio = BatchHistogram(cat.PROMPT_ESTIMATE_RATIO, registry)
        self.priority_ttft = BatchHistogram(cat.PRIORITY_TTFT_SECONDS, registry)
        self.priority_e2e = BatchHistogram(cat.PRIORITY_E2E_SECONDS, registry)
        self.priority_queue = BatchHistogram(cat.PRIORITY_ENGINE_QUEUE_SECONDS, registry)
        self.shadow_requests = Counter(cat.SHADOW_REQUESTS.name, cat.SHADOW_REQUESTS.help,
                                       cat.SHADOW_REQUESTS.labels, registry=registry)
        self.shadow_dropped = Counter(cat.SHADOW_DROPPED.name, cat.SHADOW_DROPPED.help,
                                      cat.SHADOW_DROPPED.labels, registry=registry)
        self.shadow_outcomes = Counter(cat.SHADOW_OUTCOMES.name, cat.SHADOW_OUTCOMES.help,
                                       cat.SHADOW_OUTCOMES.labels, registry=registry)
        self.shadow_ttft = BatchHistogram(cat.SHADOW_TTFT_SECONDS, registry)
        self.shadow_e2e = BatchHistogram(cat.SHADOW_E2E_SECONDS, registry)
        self.shadow_distance = BatchHistogram(cat.SHADOW_OUTPUT_DISTANCE_RATIO, registry)
        self.shadow_in_flight = Gauge(cat.SHADOW_IN_FLIGHT.name, cat.SHADOW_IN_FLIGHT.help, registry=registry)

    def observe(self, record: RequestRecord) -> None:
        """Record what the upstream choice did for one finished request (most requests: two attribute reads)."""
        model = record.model
        if record.lane_fallback is not None:
            self.fallbacks.labels(model, record.lane_fallback, self._fallback).inc()
        estimate, usage = record.prompt_tokens_estimate, record.prompt_tokens
        if estimate is not None and usage:
            self.estimate_ratio.labels(model, record.lane).observe(estimate / usage)
        if record.priority_class is not None:
            self._observe_priority(record, record.priority_class)
        if record.shadow_result is not None:
            self._observe_shadow(record, record.shadow_result)

    def _observe_priority(self, record: RequestRecord, priority: str) -> None:
        model = record.model
        if record.ttft_s is not None:
            self.priority_ttft.labels(model, priority).observe(record.ttft_s)
        if record.e2e_s is not None:
            self.priority_e2e.labels(model, priority).observe(record.e2e_s)
        if record.engine is not None:
            self.priority_queue.labels(model, priority).observe(record.engine.queued_s)

    def _observe_shadow(self, record: RequestRecord, result: str) -> None:
        model = record.model
        if result.startswith(_DROPPED_PREFIX):
            self.shadow_dropped.labels(model, result.removeprefix(_DROPPED_PREFIX)).inc()
            return
        self.shadow_requests.labels(model, result).inc()
        self.shadow_outcomes.labels(model, "primary", str(record.outcome)).inc()
        self.shadow_outcomes.labels(model, "shadow", record.shadow_outcome or "unknown").inc()
        sides: tuple[tuple[str, Any, Any], ...] = (
            ("primary", record.ttft_s, record.e2e_s), ("shadow", record.shadow_ttft_s, record.shadow_e2e_s),
        )
        for side, ttft, e2e in sides:
            if ttft is not None:
                self.shadow_ttft.labels(model, side).observe(ttft)
            if e2e is not None:
                self.shadow_e2e.labels(model, side).observe(e2e)
        if record.shadow_distance is not None:
            self.shadow_distance.labels(model).observe(record.shadow_distance)

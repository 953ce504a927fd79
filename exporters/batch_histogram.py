"""The request path's histogram: one lock per observation, or per request for its inter-token gaps.

A streamed request has one gap per content chunk, so prometheus_client's ``Histogram`` would
take a lock and scan its buckets once per chunk. This collector is handed the request's gaps
when it ends: a local tally (one bisect per gap, or per bucket edge over the sorted gaps), then
one locked merge. A single value (TTFT, end-to-end latency, token counts) is one bisect and one
locked update, where the library's ``Histogram`` walks its bounds in Python and takes a lock for
the sum, another for the bucket and a third for the exemplar. It exposes the same family a
``Histogram`` would (cumulative ``_bucket``, ``_count``, ``_sum``; the latest exemplar per bucket
for OpenMetrics), built from the catalog spec.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.samples import Exemplar

from exporters.buckets import le_label
from exporters.catalog.spec import MetricSpec

_FEW = 8
"""Up to this many values, bisect each; more are sorted first (a C call costs about as much as a bisect)."""


class _Child:
    """One label set's buckets, sum and exemplars."""

    __slots__ = ("_bounds", "_counts", "_exemplars", "_lock", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self._exemplars: list[Exemplar | None] = [None] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: Sequence[float], exemplar: dict[str, str] | None = None) -> None:
        """Add every value; ``exemplar`` (e.g. the trace id) is attached to the last one's bucket."""
        if not values:
            return
        bounds, tally = self._bounds, dict[int, int]()
        if len(values) <= _FEW:
            for value in values:
                index = bisect.bisect_left(bounds, value)
                tally[index] = tally.get(index, 0) + 1
        else:  # sorted once, then one bisect per bucket edge the values span (a stream's gaps span few)
            ordered = sorted(values)
            first, last = bisect.bisect_left(bounds, ordered[0]), bisect.bisect_left(bounds, ordered[-1])
            below = 0  # values in the buckets before ``index``
            for index in range(first, last):
                upto = bisect.bisect_right(ordered, bounds[index])  # values <= this bucket's bound
                if upto > below:
                    tally[index], below = upto - below, upto
            tally[last] = len(ordered) - below
        total = math.fsum(values)
        newest = values[-1]
        marker = Exemplar(exemplar, newest, time.time()) if exemplar else None
        with self._lock:
            counts = self._counts
            for index, count in tally.items():
                counts[index] += count
            self._sum += total
            if marker is not None:
                self._exemplars[bisect.bisect_left(bounds, newest)] = marker

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        """Add one value; ``exemplar`` is attached to its bucket."""
        index = bisect.bisect_left(self._bounds, value)  # the first bound >= value: Prometheus' le
        marker = Exemplar(exemplar, value, time.time()) if exemplar else None
        with self._lock:
            self._counts[index] += 1
            self._sum += value
            if marker is not None:
                self._exemplars[index] = marker

    def snapshot(self) -> tuple[list[int], list[Exemplar | None], float]:
        with self._lock:
            return list(self._counts), list(self._exemplars), self._sum


class BatchHistogram:
    """A labelled histogram family fed one value or a request's values at once; registered like any collector."""

    def __init__(self, spec: MetricSpec, registry: CollectorRegistry | None) -> None:
        self._spec = spec
        self._bounds = tuple(float(b) for b in spec.buckets or ())
        self._children: dict[tuple[str, ...], _Child] = {}
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _Child:
        """The child of one label set, created on first use."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._spec.labels):
                raise ValueError(f"{self._spec.name} takes labels {self._spec.labels}, got {values}")
            with self._lock:
                child = self._children.setdefault(values, _Child(self._bounds))
        return child

    def describe(self) -> Iterable[Metric]:
        """The family without samples (for the registry's duplicate-name check)."""
        return [HistogramMetricFamily(self._spec.name, self._spec.help, labels=self._spec.labels)]

    def collect(self) -> Iterator[Metric]:
        """The family as prometheus_client's Histogram exposes it."""
        family = HistogramMetricFamily(self._spec.name, self._spec.help, labels=self._spec.labels)
        edges = [le_label(b) for b in self._bounds] + ["+Inf"]
        for values, child in list(self._children.items()):
            counts, exemplars, total = child.snapshot()
            cumulative, buckets = 0, []
            for edge, count, exemplar in zip(edges, counts, exemplars, strict=True):
                cumulative += count
                buckets.append((edge, cumulative, exemplar) if exemplar is not None else (edge, cumulative))
            family.add_metric(list(values), buckets, total)
        yield family

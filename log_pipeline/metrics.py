"""The log pipeline's instruments, built from the catalog on a registry that is passed in."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from exporters.catalog import pipeline as cat
from exporters.catalog.spec import MetricSpec
from log_pipeline.archive import WriterStats
from log_pipeline.sampling import DROPPED_SAMPLING, ERROR, SAMPLED, SLOW

KEPT_REASONS = (ERROR, SLOW, SAMPLED)
DROP_SAMPLING = "sampling"
DROP_QUEUE_FULL = "queue_full"
DROP_CLOSED = "closed"
DROP_NO_ARCHIVE = "no_archive"
DROPPED_REASONS = (DROP_SAMPLING, DROP_QUEUE_FULL, DROP_CLOSED, DROP_NO_ARCHIVE)
LOST_REASONS = ("write_error", "shutdown")


def _counter(spec: MetricSpec, registry: CollectorRegistry) -> Counter:
    return Counter(spec.name, spec.help, spec.labels, registry=registry)


class PipelineMetrics:
    """Counters of the sink and its writer; label values are pre-created so that rates start at 0."""

    def __init__(self, registry: CollectorRegistry, queue_depth: Callable[[], int], capacity: int) -> None:
        self.seen = _counter(cat.LOG_RECORDS_SEEN, registry)
        kept = _counter(cat.LOG_RECORDS_KEPT, registry)
        dropped = _counter(cat.LOG_RECORDS_DROPPED, registry)
        lost = _counter(cat.LOG_RECORDS_LOST, registry)
        self.kept = {reason: kept.labels(reason) for reason in KEPT_REASONS}
        self.dropped = {reason: dropped.labels(reason) for reason in DROPPED_REASONS}
        self.dropped[DROPPED_SAMPLING] = self.dropped[DROP_SAMPLING]
        self.lost = {reason: lost.labels(reason) for reason in LOST_REASONS}
        depth = Gauge(cat.LOG_QUEUE_RECORDS.name, cat.LOG_QUEUE_RECORDS.help, registry=registry)
        depth.set_function(lambda: float(queue_depth()))
        Gauge(cat.LOG_QUEUE_CAPACITY.name, cat.LOG_QUEUE_CAPACITY.help, registry=registry).set(capacity)
        self.written_bytes = _counter(cat.LOG_ARCHIVE_WRITTEN_BYTES, registry)
        self.raw_bytes = _counter(cat.LOG_RAW_BYTES, registry)
        self.archived = _counter(cat.LOG_ARCHIVED_RECORDS, registry)
        self.frames = _counter(cat.LOG_FRAMES, registry)
        self.segments = _counter(cat.LOG_SEGMENTS, registry)
        deleted = _counter(cat.LOG_SEGMENTS_DELETED, registry)
        self.deleted = {reason: deleted.labels(reason) for reason in ("size", "age")}
        self._last = WriterStats()

    def writer_progress(self, stats: WriterStats) -> None:
        """Add what a writer did since the last call (called by the writer thread only)."""
        last = self._last
        self.written_bytes.inc(stats.bytes_written - last.bytes_written)
        self.raw_bytes.inc(stats.json_bytes - last.json_bytes)
        self.archived.inc(stats.records - last.records)
        self.frames.inc(stats.frames - last.frames)
        self.segments.inc(stats.segments_published - last.segments_published)
        for reason, counter in self.deleted.items():
            counter.inc(stats.segments_deleted[reason] - last.segments_deleted[reason])
        self.lost["write_error"].inc(stats.lost_records - last.lost_records)
        self._last = dataclasses.replace(stats, segments_deleted=dict(stats.segments_deleted))

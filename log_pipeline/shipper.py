"""Kept request records to a remote log backend: a bounded queue and one thread that sends batches.

The request path only ever calls :meth:`RecordShipper.offer`, which never blocks: when the queue
is full (the backend is slow or down) the record is dropped and counted. The thread takes up to
``batch_records`` records, or what arrived within ``flush_s`` of the first one, and hands them to
the ``export`` function it was given (the OTLP encoding and transport live with the caller, which
owns OpenTelemetry). A batch that ``export`` refuses or raises on is dropped and counted; memory
stays bounded by the queue whatever the backend does.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from exporters.catalog import pipeline as cat
from log_pipeline.worker import stop_worker

log = structlog.get_logger(__name__)

Export = Callable[[Sequence[Mapping[str, Any]]], bool]
"""Sends one batch of records; True when the backend accepted it."""

DROP_QUEUE_FULL = "queue_full"
DROP_EXPORT_FAILED = "export_failed"
DROP_SHUTDOWN = "shutdown"
_STOP: Any = object()


class ShipperMetrics:
    """Records exported, dropped by reason, and the queue depth (label values pre-created)."""

    def __init__(self, registry: CollectorRegistry, queue_depth: Callable[[], int]) -> None:
        spec = cat.LOG_OTLP_RECORDS_EXPORTED
        self.exported = Counter(spec.name, spec.help, registry=registry)
        spec = cat.LOG_OTLP_RECORDS_DROPPED
        dropped = Counter(spec.name, spec.help, spec.labels, registry=registry)
        self.dropped = {r: dropped.labels(r) for r in (DROP_QUEUE_FULL, DROP_EXPORT_FAILED, DROP_SHUTDOWN)}
        spec = cat.LOG_OTLP_QUEUE_RECORDS
        Gauge(spec.name, spec.help, registry=registry).set_function(lambda: float(queue_depth()))


class RecordShipper:
    """Bounded queue plus a sender thread in front of an ``export`` function."""

    def __init__(
        self,
        export: Export,
        registry: CollectorRegistry,
        *,
        queue_size: int,
        batch_records: int,
        flush_s: float,
        on_close: Callable[[], None] | None = None,
        name: str = "inferwatch-log-shipper",
    ) -> None:
        self._export = export
        self._on_close = on_close
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._batch_records = batch_records
        self._flush_s = flush_s
        self._name = name
        self.metrics = ShipperMetrics(registry, self._queue.qsize)
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        """Start the sender thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def offer(self, record: Mapping[str, Any]) -> bool:
        """Queue a record without blocking; False (and counted) when the queue is full or closed."""
        if self._closed:
            self.metrics.dropped[DROP_SHUTDOWN].inc()
            return False
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.metrics.dropped[DROP_QUEUE_FULL].inc()
            return False
        return True

    def _next_batch(self) -> tuple[list[Mapping[str, Any]], bool]:
        """Wait for a first record, then collect until the batch is full or ``flush_s`` has passed.

        Returns the batch and whether the stop sentinel was seen.
        """
        first = self._queue.get()
        if first is _STOP:
            return [], True
        batch = [first]
        deadline = time.monotonic() + self._flush_s
        while len(batch) < self._batch_records:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            batch.append(item)
        return batch, False

    def _send(self, batch: list[Mapping[str, Any]]) -> None:
        try:
            accepted = self._export(batch)
        except Exception as err:  # the sender thread must outlive any backend or encoding failure
            log.warning("log export failed", records=len(batch), error=repr(err))
            accepted = False
        if accepted:
            self.metrics.exported.inc(len(batch))
        else:
            self.metrics.dropped[DROP_EXPORT_FAILED].inc(len(batch))

    def _run(self) -> None:
        stop = False
        while not stop:
            batch, stop = self._next_batch()
            if batch:
                self._send(batch)

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop accepting records, send what is queued, stop the thread, then call ``on_close``.

        Returns False when the thread did not finish within ``timeout_s``; what was still queued
        then is counted as dropped with reason ``shutdown``.
        """
        self._closed = True
        thread = self._thread
        if thread is None:
            return True
        if not stop_worker(self._queue, thread, _STOP, timeout_s):
            self.metrics.dropped[DROP_SHUTDOWN].inc(self._queue.qsize())
            return False
        self._thread = None
        if self._on_close is not None:
            self._on_close()
        return True

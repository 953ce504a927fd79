"""Tests of the record shipper: a queue that never blocks, batches by size and time, counted losses."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from exporters.catalog import pipeline as cat
from exporters.catalog.spec import MetricSpec
from log_pipeline.shipper import RecordShipper


def _value(registry: CollectorRegistry, spec: MetricSpec, **labels: str) -> float:
    return registry.get_sample_value(spec.series, labels) or 0.0


class Backend:
    """An export function that records batches; it can refuse, raise, or hang until released."""

    def __init__(self, *, accept: bool = True, error: Exception | None = None) -> None:
        self.batches: list[list[Mapping[str, Any]]] = []
        self.accept = accept
        self.error = error
        self.release = threading.Event()
        self.release.set()

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> bool:
        self.release.wait()
        self.batches.append(list(batch))
        if self.error is not None:
            raise self.error
        return self.accept


def _shipper(backend: Backend, **changes: Any) -> tuple[RecordShipper, CollectorRegistry]:
    registry = CollectorRegistry()
    options: dict[str, Any] = {"queue_size": 100, "batch_records": 10, "flush_s": 0.05}
    options.update(changes)
    return RecordShipper(backend, registry, **options), registry


def _records(n: int) -> list[dict[str, Any]]:
    return [{"trace_id": f"{i:032x}"} for i in range(n)]


def test_every_record_reaches_the_backend_in_batches_no_larger_than_asked() -> None:
    backend = Backend()
    shipper, registry = _shipper(backend)
    shipper.start()
    records = _records(35)
    assert all(shipper.offer(r) for r in records)
    assert shipper.close()
    assert [r for batch in backend.batches for r in batch] == records
    assert max(len(b) for b in backend.batches) <= 10
    assert _value(registry, cat.LOG_OTLP_RECORDS_EXPORTED) == 35


def test_a_lone_record_is_sent_within_the_flush_interval() -> None:
    backend = Backend()
    shipper, _ = _shipper(backend, flush_s=0.05)
    shipper.start()
    shipper.offer({"trace_id": "a" * 32})
    deadline = time.monotonic() + 5.0
    while not backend.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    assert backend.batches == [[{"trace_id": "a" * 32}]]
    shipper.close()


def test_a_hanging_backend_costs_counted_drops_not_memory_or_blocking() -> None:
    """The backend hangs: the queue fills to its size, offers keep returning at once, and drops are counted."""
    backend = Backend()
    backend.release.clear()
    shipper, registry = _shipper(backend, queue_size=20, batch_records=5)
    shipper.start()
    started = time.monotonic()
    results = [shipper.offer(r) for r in _records(1000)]
    elapsed = time.monotonic() - started
    accepted = sum(results)
    assert accepted <= 20 + 5  # the queue, plus at most one batch taken by the hanging sender
    assert _value(registry, cat.LOG_OTLP_RECORDS_DROPPED, reason="queue_full") == 1000 - accepted
    assert _value(registry, cat.LOG_OTLP_QUEUE_RECORDS) <= 20
    assert elapsed < 1.0, "offer must never wait for the backend"
    assert not shipper.close(timeout_s=0.2)
    assert _value(registry, cat.LOG_OTLP_RECORDS_DROPPED, reason="shutdown") >= 1
    backend.release.set()


def test_refused_and_failing_batches_are_counted_and_the_sender_goes_on() -> None:
    for backend in (Backend(accept=False), Backend(error=ConnectionError("backend down"))):
        shipper, registry = _shipper(backend)
        shipper.start()
        for record in _records(25):
            shipper.offer(record)
        assert shipper.close()
        assert _value(registry, cat.LOG_OTLP_RECORDS_DROPPED, reason="export_failed") == 25
        assert _value(registry, cat.LOG_OTLP_RECORDS_EXPORTED) == 0
        assert sum(len(b) for b in backend.batches) == 25


def test_records_offered_after_close_are_counted() -> None:
    shipper, registry = _shipper(Backend())
    shipper.start()
    assert shipper.close()
    assert not shipper.offer({"trace_id": "b" * 32})
    assert _value(registry, cat.LOG_OTLP_RECORDS_DROPPED, reason="shutdown") == 1


def test_close_calls_on_close_after_the_last_batch() -> None:
    order: list[str] = []

    def export(batch: Sequence[Mapping[str, Any]]) -> bool:
        order.append("export")
        return True

    shipper = RecordShipper(export, CollectorRegistry(), queue_size=10, batch_records=10, flush_s=5.0,
                            on_close=lambda: order.append("closed"))
    shipper.start()
    shipper.offer({"trace_id": "c" * 32})
    assert shipper.close()
    assert order == ["export", "closed"]

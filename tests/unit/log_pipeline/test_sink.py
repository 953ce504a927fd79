"""Tests of the record sink: sampling and counting in one place, a queue that never blocks."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporters.catalog import pipeline as cat
from exporters.catalog.spec import MetricSpec
from exporters.records import Outcome, RequestRecord
from log_pipeline.config import LogConfig
from log_pipeline.query import Archive
from log_pipeline.records import event_from_record
from log_pipeline.sampling import Decision
from log_pipeline.sink import RecordSink
from tests.unit.log_pipeline.conftest import make_records


def _value(registry: CollectorRegistry, spec: MetricSpec, **labels: str) -> float:
    return registry.get_sample_value(spec.series, labels) or 0.0


def _sink(tmp_path: Path | None, **changes: Any) -> tuple[RecordSink, CollectorRegistry]:
    registry = CollectorRegistry()
    values: dict[str, Any] = {"dir": str(tmp_path) if tmp_path else "", "frame_max_ms": 20.0}
    values.update(changes)
    return RecordSink(LogConfig(**values), registry, on_problem=lambda _m: None), registry


class TestOffer:
    def test_a_full_queue_drops_and_counts_instead_of_blocking(self, tmp_path: Path) -> None:
        """With no writer running and room for 2, the third kept record is refused and counted."""
        sink, registry = _sink(tmp_path, queue_size=2, success_sample_ratio=1.0)
        results = [sink.offer(r) for r in make_records(3)]
        assert results == [True, True, False]
        assert _value(registry, cat.LOG_RECORDS_DROPPED, reason="queue_full") == 1
        assert _value(registry, cat.LOG_QUEUE_RECORDS) == 2

    def test_seen_equals_kept_plus_dropped_by_reason(self, tmp_path: Path) -> None:
        """Over 2000 records the counters add up and errors are all kept as errors."""
        records = make_records(2000)
        sink, registry = _sink(tmp_path, queue_size=5000)
        for record in records:
            sink.offer(record)
        seen = _value(registry, cat.LOG_RECORDS_SEEN)
        kept = {r: _value(registry, cat.LOG_RECORDS_KEPT, reason=r) for r in ("error", "slow", "sampled")}
        dropped = _value(registry, cat.LOG_RECORDS_DROPPED, reason="sampling")
        assert seen == 2000
        assert sum(kept.values()) + dropped == seen
        assert kept["error"] == sum(1 for r in records if r["outcome"] != "ok")

    def test_a_given_decision_is_used_as_is(self, tmp_path: Path) -> None:
        """Passing the proxy's decision skips re-deciding: a forced drop is counted as sampling."""
        sink, registry = _sink(tmp_path, success_sample_ratio=1.0)
        assert sink.offer(make_records(1)[0], Decision(False, "dropped_sampling")) is True
        assert _value(registry, cat.LOG_RECORDS_DROPPED, reason="sampling") == 1

    def test_without_an_archive_kept_records_are_counted_as_no_archive(self) -> None:
        """An empty dir keeps the counting but writes nothing."""
        sink, registry = _sink(None, success_sample_ratio=1.0)
        sink.start()
        assert sink.offer(make_records(1)[0]) is True
        assert _value(registry, cat.LOG_RECORDS_DROPPED, reason="no_archive") == 1
        assert sink.close(1.0) is True

    def test_after_close_offers_are_refused_and_counted(self, tmp_path: Path) -> None:
        """A closed sink returns False for a kept record and counts it as closed."""
        sink, registry = _sink(tmp_path, success_sample_ratio=1.0)
        sink.start()
        sink.close(5.0)
        assert sink.offer(make_records(1)[0]) is False
        assert _value(registry, cat.LOG_RECORDS_DROPPED, reason="closed") == 1


class TestWriterThread:
    def test_close_writes_everything_and_publishes(self, tmp_path: Path) -> None:
        """Every kept record is in the archive after close, and the writer metrics say so."""
        records = make_records(1500)
        sink, registry = _sink(tmp_path, success_sample_ratio=1.0, frame_max_records=100)
        sink.start()
        for record in records:
            sink.put(record)
        assert sink.close(10.0) is True
        assert list(Archive(tmp_path).records()) == records
        assert _value(registry, cat.LOG_ARCHIVED_RECORDS) == 1500
        assert _value(registry, cat.LOG_SEGMENTS) == 1
        assert _value(registry, cat.LOG_RAW_BYTES) > _value(
            registry, cat.LOG_ARCHIVE_WRITTEN_BYTES
        )

    def test_an_idle_writer_still_closes_the_open_frame(self, tmp_path: Path) -> None:
        """One record and no more traffic: the writer thread writes its frame after frame_max_ms."""
        sink, registry = _sink(tmp_path, success_sample_ratio=1.0)
        sink.start()
        sink.offer(make_records(1)[0])
        deadline = time.monotonic() + 10.0
        while _value(registry, cat.LOG_FRAMES) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(list(Archive(tmp_path).records())) == 1
        sink.close(5.0)

    def test_the_writer_wakes_once_per_frame_not_once_per_record(self, tmp_path: Path) -> None:
        """Twenty records spread over 100 ms, one frame of a second: one round of the writer writes them all."""
        sink, registry = _sink(tmp_path, success_sample_ratio=1.0, frame_max_ms=1000.0)
        sink.start()
        writer = sink.writer
        assert writer is not None
        rounds = []
        tick = writer.tick
        writer.tick = lambda: (rounds.append(writer.stats.records), tick())  # type: ignore[method-assign]
        for record in make_records(20):
            sink.offer(record)
            time.sleep(0.005)
        deadline = time.monotonic() + 10.0
        while _value(registry, cat.LOG_FRAMES) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _value(registry, cat.LOG_ARCHIVED_RECORDS) == 20
        assert len(rounds) <= 3, rounds  # the first record's, the frame's; a writer woken per record takes 20 or more
        sink.close(5.0)

    def test_a_frames_worth_of_records_wakes_the_writer_before_the_frame_is_due(self, tmp_path: Path) -> None:
        """frame_max_records queued: the frame is written at once, not a minute later."""
        sink, registry = _sink(tmp_path, success_sample_ratio=1.0, frame_max_ms=60_000.0, frame_max_records=16)
        sink.start()
        first, *rest = make_records(16)
        sink.offer(first)
        time.sleep(0.05)  # the writer took it and sleeps on the open frame
        for record in rest:
            sink.offer(record)
        deadline = time.monotonic() + 10.0
        while _value(registry, cat.LOG_ARCHIVED_RECORDS) < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _value(registry, cat.LOG_ARCHIVED_RECORDS) == 16
        assert time.monotonic() < deadline
        assert sink.close(5.0) is True

    def test_close_wakes_a_writer_asleep_on_its_frame(self, tmp_path: Path) -> None:
        """A frame due in a minute: close still writes it and returns at once."""
        sink, _registry = _sink(tmp_path, success_sample_ratio=1.0, frame_max_ms=60_000.0)
        sink.start()
        records = make_records(3)
        for record in records:
            sink.offer(record)
        time.sleep(0.05)  # the writer took the first record and sleeps on the open frame
        began = time.monotonic()
        assert sink.close(5.0) is True
        assert time.monotonic() - began < 2.0
        assert list(Archive(tmp_path).records()) == records

    def test_a_record_that_is_not_json_does_not_kill_the_writer(self, tmp_path: Path) -> None:
        """A value JSON cannot encode is written as its str() and the next records still arrive."""
        sink, _registry = _sink(tmp_path, success_sample_ratio=1.0)
        sink.start()
        odd: dict[str, Any] = {"trace_id": "a" * 32, "outcome": "ok", "when": object()}
        sink.offer(odd)
        sink.offer(make_records(1)[0])
        sink.close(5.0)
        assert len(list(Archive(tmp_path).records())) == 2


class TestOfferRequest:
    """The proxy's path: decide on the finished request first, build the event only when it is kept."""

    @settings(max_examples=200, deadline=None)
    @given(
        outcome=st.sampled_from(list(Outcome)),
        e2e_s=st.one_of(st.none(), st.floats(0, 30), st.sampled_from([2.0, 2.00004, 2.00006, 5.0])),
        sla_s=st.one_of(st.none(), st.sampled_from([1.0, 5.0])),
        slow_request_s=st.sampled_from([0.0, 2.0]),
        ratio=st.sampled_from([0.0, 0.05, 1.0]),
        trace_id=st.one_of(st.from_regex(r"[0-9a-f]{32}", fullmatch=True), st.text(max_size=8)),
    )
    def test_the_decision_is_the_one_its_event_would_get(
        self, outcome: Outcome, e2e_s: float | None, sla_s: float | None, slow_request_s: float, ratio: float,
        trace_id: str,
    ) -> None:
        """Error, slow (the SLA, or serve's slow threshold on the event's rounded e2e_ms) and the ratio."""
        sink, _ = _sink(None, success_sample_ratio=ratio, slow_request_s=slow_request_s)
        record = RequestRecord(trace_id=trace_id, span_id="1" * 16, route="/v1/completions", outcome=outcome,
                               e2e_s=e2e_s, start_unix=1_754_568_000.0)
        assert sink.decide_request(record, sla_s=sla_s) == sink.decide(event_from_record(record, sla_s=sla_s))

    def test_dropped_requests_are_counted_and_never_built_kept_ones_are_queued(self, tmp_path: Path) -> None:
        """Seen = kept + dropped as with offer(); the event comes back only for a kept request."""
        sink, registry = _sink(tmp_path, queue_size=100, success_sample_ratio=0.0)
        start = 1_754_568_000.0  # a record without a start is stamped with the time its event is built
        ok = RequestRecord(trace_id="ab" * 16, span_id="1" * 16, route="/v1/completions", e2e_s=0.1, start_unix=start)
        failed = RequestRecord(trace_id="cd" * 16, span_id="2" * 16, route="/v1/completions", e2e_s=0.1,
                               outcome=Outcome.TIMEOUT, error_type="upstream_timeout", start_unix=start)
        assert sink.offer_request(ok, sla_s=None) == (Decision(False, "dropped_sampling"), None)
        decision, event = sink.offer_request(failed, sla_s=None)
        assert decision == Decision(True, "error")
        assert event == event_from_record(failed, sla_s=None)
        assert _value(registry, cat.LOG_RECORDS_SEEN) == 2
        assert _value(registry, cat.LOG_RECORDS_DROPPED, reason="sampling") == 1
        assert _value(registry, cat.LOG_RECORDS_KEPT, reason="error") == 1
        assert _value(registry, cat.LOG_QUEUE_RECORDS) == 1

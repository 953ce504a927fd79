"""Request records over OTLP/HTTP logs: through a real sidecar on loopback into an OTLP receiver.

The receiver decodes the protobuf the sidecar sent, so each check reads what a backend would get:
the record's own trace and span ids equal the client's ``x-trace-id`` and the sidecar's span, the
fields match the archived record, and a backend that is down costs counted drops, never a request.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry._logs import SeverityNumber
from prometheus_client import CollectorRegistry

from exporters.catalog import pipeline as cat
from serving import config as cfg
from tests.fakes.faulty_upstream import FaultyUpstream, ThreadedServer
from tests.harness.otlp_receiver import OtlpReceiver
from tests.unit.serving.inprocess import ANSWER_WITHIN_S, Sidecar, record_of, send, start_sidecar


@pytest.fixture(name="upstream", scope="module")
def _upstream() -> Iterator[ThreadedServer]:
    with ThreadedServer(FaultyUpstream().app) as server:
        yield server


@pytest.fixture(name="receiver")
def _receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


async def _sidecar(
    upstream: str, logs: Path, endpoint: str, sample: float = 1.0, **changes: object
) -> AsyncIterator[Sidecar]:
    settings = cfg.replace(cfg.defaults(), "logs", otlp_endpoint=endpoint, otlp_flush_ms=50.0, **changes)
    sidecar, runner = await start_sidecar(upstream, logs, settings, success_sample_ratio=sample)
    try:
        yield sidecar
    finally:
        await sidecar.session.close()
        await runner.cleanup()


def _value(registry: CollectorRegistry, spec: object, **labels: str) -> float:
    return registry.get_sample_value(spec.series, labels) or 0.0  # type: ignore[attr-defined]


async def test_kept_records_reach_the_backend_with_their_trace_and_span_ids(
    upstream: ThreadedServer, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    async for sidecar in _sidecar(upstream.url, tmp_path / "logs", receiver.logs_endpoint):
        answers = [await send(sidecar, None, stream=True), await send(sidecar, None, stream=False),
                   await send(sidecar, "error_500_json", stream=False)]
        for answer in answers:
            trace_id = answer.headers["x-trace-id"]
            received = await asyncio.to_thread(receiver.logs_for, trace_id, 10.0)
            assert len(received) == 1, f"no OTLP log record for trace {trace_id}"
            record = received[0]
            span = next(s for s in sidecar.spans.get_finished_spans()
                        if format(s.context.trace_id, "032x") == trace_id)
            assert record.span_id == format(span.context.span_id, "016x")
            assert record.service == "inferwatch"
            assert record.event_name == "inferwatch.request"
            archived = await record_of(sidecar.logs, trace_id)
            assert archived is not None
            assert record.attributes["http_status"] == answer.status == archived["http_status"]
            assert record.attributes["outcome"] == archived["outcome"]
            assert record.attributes["model"] == "fake-model"
            if answer.status == 200:
                assert record.severity_number == SeverityNumber.INFO.value
                assert record.attributes["completion_tokens"] == archived["completion_tokens"]
            else:
                assert record.severity_number == SeverityNumber.ERROR.value
                assert record.attributes["error_type"] == archived["error_type"]
        exported = _value(sidecar.registry, cat.LOG_OTLP_RECORDS_EXPORTED)
        assert exported == len(receiver.log_records) == 3


async def test_only_the_sampled_records_are_sent(
    upstream: ThreadedServer, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """With the success sample at 0, successes are not sent and errors still are (the archive's rule)."""
    async for sidecar in _sidecar(upstream.url, tmp_path / "logs", receiver.logs_endpoint, sample=0.0):
        ok = await send(sidecar, None, stream=False)
        error = await send(sidecar, "error_500_json", stream=False)
        assert await asyncio.to_thread(receiver.logs_for, error.headers["x-trace-id"], 10.0)
        assert receiver.logs_for(ok.headers["x-trace-id"], 0.0) == []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_backend_that_is_down_costs_counted_drops_not_requests(
    upstream: ThreadedServer, tmp_path: Path
) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}/v1/logs"
    async for sidecar in _sidecar(upstream.url, tmp_path / "logs", endpoint, otlp_queue_size=8,
                                  otlp_batch_records=4, otlp_timeout_s=0.5):
        answers = [await send(sidecar, None, stream=i % 2 == 0) for i in range(40)]
        assert all(a.status == 200 and a.seconds < ANSWER_WITHIN_S for a in answers)
        archived = [await record_of(sidecar.logs, a.headers["x-trace-id"]) for a in answers[-3:]]
        assert all(archived), "the archive must not suffer from the OTLP backend"
        registry = sidecar.registry
        assert _value(registry, cat.LOG_OTLP_QUEUE_RECORDS) <= 8
    dropped = sum(_value(registry, cat.LOG_OTLP_RECORDS_DROPPED, reason=r)
                  for r in ("queue_full", "export_failed", "shutdown"))
    assert _value(registry, cat.LOG_OTLP_RECORDS_EXPORTED) == 0
    assert dropped == 40, "every kept record is either exported or counted as dropped"

"""`serve --workers`: a secondary's records and in-flight table reach the primary's intake intact."""

from __future__ import annotations

import dataclasses
import time
from array import array
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.trace import Span
from prometheus_client import CollectorRegistry

from exporters.inflight import InFlight, InFlightRequests, InFlightTokens
from exporters.records import Outcome, RequestRecord
from serving.commands import serve
from serving.config import settings_from_args
from serving.workers import RECORDS_PATH, PrimaryLink, RecordForwarder, RecordIntake, record_from_wire, shares


def _record(i: int) -> RequestRecord:
    return RequestRecord(
        trace_id=f"{i:032x}", span_id=f"{i:016x}", route="/v1/chat/completions", model="m", stream=True,
        upstream="http://u", http_status=200, outcome=Outcome.TIMEOUT, length_bucket="0-512", prompt_tokens=7,
        completion_tokens=3, accept_s=0.01, ttft_s=0.02, e2e_s=0.5, inter_token_s=[0.1, 0.0, 0.25],
        finish_reason="length", response_model="m", error_type="request_timeout", error_message="slow",
        start_unix=1.5e9, prompt_hash="ab" * 8, prompt_chars=30, prompt_tokens_estimate=8,
    )


def test_a_record_crosses_the_wire_unchanged() -> None:
    record = _record(1)
    assert record_from_wire(orjson.loads(orjson.dumps(record))) == record


def test_a_non_record_is_refused() -> None:
    with pytest.raises(ValueError, match="not a request record"):
        record_from_wire({"route": "/v1/completions"})  # no trace id


def test_each_process_admits_its_share_of_max_inflight() -> None:
    assert (shares(1024, 2), shares(5, 2), shares(1, 4)) == (512, 3, 1)


def test_workers_flag_sets_the_setting() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--workers", "3"])
    assert settings_from_args(args, serve.SHORTCUTS).serve.workers == 3


def test_remote_in_flight_entries_merge_in_start_order_and_expire() -> None:
    table = InFlightTokens()
    table.track("a", "m", 10)
    started = table.local_snapshot()[0].started_ns
    table.set_remote("worker-1", [InFlight("m", 5, started - 1), InFlight("m", 6, started + 1)], ttl_s=0.05)
    assert [e.tokens for e in table.snapshot()] == [5, 10, 6]
    time.sleep(0.06)
    assert [e.tokens for e in table.snapshot()] == [10]


class _Primary:
    """The primary's intake on a real Unix socket, with a recording observer."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.finished: list[RequestRecord] = []
        self.inflight = InFlightTokens()
        self.requests = InFlightRequests()
        self.registry = CollectorRegistry()
        self.registry.register(self.requests)
        self.intake = RecordIntake(lambda record, _span: self.finished.append(record), self.inflight,
                                   self.requests, lambda: frozenset({"shed-me"}), self.registry)
        app = web.Application()
        app.router.add_post(RECORDS_PATH, self.intake.handle)
        self.runner = web.AppRunner(app)

    async def start(self) -> None:
        await self.runner.setup()
        await web.UnixSite(self.runner, self.path).start()


@pytest.fixture
async def primary(tmp_path: Path) -> AsyncIterator[_Primary]:
    server = _Primary(str(tmp_path / "primary.sock"))
    yield server
    await server.runner.cleanup()


async def test_records_and_in_flight_table_reach_the_primary(primary: _Primary) -> None:
    await primary.start()
    inflight = InFlightTokens()
    inflight.track("live", "m", 42)
    requests = InFlightRequests()
    requests.add(("m", "/v1/completions"))
    link = PrimaryLink(primary.path)
    forwarder = RecordForwarder(link, 3, inflight, requests)
    span: Span = None  # type: ignore[assignment]
    for i in range(3):  # the gaps between tokens as the proxy keeps them: one array of doubles
        record = _record(i)
        forwarder.observe(dataclasses.replace(record, inter_token_s=array("d", record.inter_token_s)), span)
    assert await forwarder.flush()
    assert primary.finished == [_record(i) for i in range(3)]
    assert [e.tokens for e in primary.inflight.snapshot()] == [42]
    primary.requests.add(("m", "/v1/completions"))  # one of the primary's own
    assert primary.registry.get_sample_value(
        "inferwatch_requests_in_flight", {"model_name": "m", "route": "/v1/completions"}) == 2
    assert forwarder.degraded == frozenset({"shed-me"})
    assert primary.registry.get_sample_value("inferwatch_worker_records_total", {"worker": "3"}) == 3
    await forwarder.close()
    await link.close()


async def test_records_wait_while_the_primary_is_away(primary: _Primary) -> None:
    link = PrimaryLink(primary.path)
    forwarder = RecordForwarder(link, 1, InFlightTokens(), InFlightRequests())
    forwarder.observe(_record(7), None)  # type: ignore[arg-type]
    assert not await forwarder.flush()  # nothing listens yet: kept, not lost
    await primary.start()
    await forwarder.close()
    await link.close()
    assert primary.finished == [_record(7)]


async def test_the_intake_refuses_tcp_and_malformed_batches(primary: _Primary) -> None:
    async with TestClient(TestServer(primary.runner.app)) as client:
        response = await client.post(RECORDS_PATH, data=orjson.dumps({"worker": 1, "records": []}))
        assert response.status == 404  # only the private Unix socket takes records
    await primary.start()
    link = PrimaryLink(primary.path)
    forwarder = RecordForwarder(link, 1, InFlightTokens(), InFlightRequests())
    forwarder.observe({"not": "a record"}, None)  # type: ignore[arg-type]
    assert not await forwarder.flush()
    assert primary.finished == []
    assert forwarder.dropped == 1  # dropped and counted: it would block every later batch
    await forwarder.close()
    await link.close()


def test_a_taken_port_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from serving.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        code = main(["serve", "--listen", address, "--workers", "2", "--gpu-enabled", "false",
                     "--rule-engine-enabled", "false", "--scrape-enabled", "false"])
    assert code == 2
    assert "config key 'serve.listen': cannot listen there" in capsys.readouterr().err

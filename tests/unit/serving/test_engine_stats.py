"""The sidecar's side of the stat-logger plugin: X-Request-Id to vLLM, datagrams in, joins to requests.

A UDP socket in the test plays the plugin, sending what vLLM's plugin would (the wire format of
exporters.engine_stats_wire) before, after, or never, relative to the end of the answer.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from exporters.catalog import request as cat
from exporters.engine_stats_wire import EngineRequestStats, EngineStepStats, encode
from serving import config as cfg
from serving.app import OBSERVERS, TRACING, build_app
from serving.engine_stats import PLUGIN_SILENT_AFTER_S
from tests.fakes.openai_upstream import FakeOpenAI

WAIT_MS = 150.0


class Plugin:
    """Sends datagrams the way vLLM's plugin does."""

    def __init__(self, port: int) -> None:
        self.address = ("127.0.0.1", port)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def send(self, trace_id: str | None, preemptions: int = 0) -> None:
        requests = [] if trace_id is None else [EngineRequestStats(
            f"cmpl-{trace_id}-0-1a2b3c4d", 0.004, 0.012, 0.25, 0.262, 0.27, preemptions, 32, 64, 8, "length")]
        for datagram in encode(EngineStepStats(0.25, 1, 0, 0, 3), requests):
            self.socket.sendto(datagram, self.address)


@pytest.fixture(name="setup")
async def _setup(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]]
) -> AsyncIterator[tuple[TestClient, CollectorRegistry, FakeOpenAI, Plugin, InMemorySpanExporter, list[Any]]]:
    fake = FakeOpenAI()
    upstream = await aiohttp_server(fake.app())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           engine_stats_listen=f"udp://127.0.0.1:{port}", engine_stats_wait_ms=WAIT_MS)
    registry = CollectorRegistry()
    app = build_app(settings, registry)
    spans = InMemorySpanExporter()
    app[TRACING].provider.add_span_processor(SimpleSpanProcessor(spans))
    finished: list[Any] = []
    app[OBSERVERS].append(lambda record, _span: finished.append(record))
    client = await aiohttp_client(app)
    plugin = Plugin(port)
    yield client, registry, fake, plugin, spans, finished
    plugin.socket.close()


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def _request(client: TestClient, trace_id: str, stream: bool = False) -> float:
    started = time.monotonic()
    response = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "hi", "max_tokens": 4,
                                                          "stream": stream},
                                 headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    await response.read()
    assert response.status == 200
    assert response.headers["x-trace-id"] == trace_id
    return time.monotonic() - started


async def _until(predicate: Callable[[], bool], timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert predicate()


async def test_vllms_numbers_that_came_first_are_joined_at_once(setup: Any) -> None:
    client, registry, fake, plugin, spans, finished = setup
    trace = "a" * 32
    plugin.send(trace, preemptions=2)
    await _until(lambda: _value(registry, f"{cat.ENGINE_STATS_RECORDS.series}", kind="request") == 1)
    await _request(client, trace)
    sent = next(r for r in reversed(fake.requests) if r["path"] == "/v1/completions")
    headers = {k.lower(): v for k, v in sent["headers"].items()}
    assert headers["x-request-id"] == trace, "vLLM's request id is the trace id"
    assert finished[-1].engine.preemptions == 2, "joined before the observers ran"
    labels = {"model_name": "fake-model", "length_bucket": "le512", "outcome": "ok"}
    assert _value(registry, cat.ENGINE_PREEMPTIONS_PER_REQUEST.sum, **labels) == 2
    assert _value(registry, cat.ENGINE_QUEUE_SECONDS.count, **labels) == 1
    assert _value(registry, cat.ENGINE_CACHED_PROMPT_RATIO.sum, **labels) == 0.5
    assert _value(registry, cat.ENGINE_STATS_JOINS.series, result="joined") == 1
    span = spans.get_finished_spans()[-1]
    assert span.attributes["inferwatch.engine.decode_ms"] == 250.0
    assert span.attributes["inferwatch.engine.preemptions"] == 2
    assert _value(registry, cat.ENGINE_PLUGIN_KV_CACHE_USAGE.series) == 0.25
    assert _value(registry, cat.ENGINE_STATS_PLUGIN_DROPPED.series) == 3


async def test_a_late_record_holds_back_the_observers_not_the_answer(setup: Any) -> None:
    client, registry, _, plugin, spans, finished = setup
    plugin.send(None)  # the plugin is alive: a step record
    await _until(lambda: _value(registry, cat.ENGINE_STATS_RECORDS.series, kind="step") == 1)
    trace = "b" * 32
    elapsed = await _request(client, trace, stream=True)
    assert elapsed < WAIT_MS / 1000, "the client's answer does not wait for vLLM's numbers"
    assert not [r for r in finished if r.trace_id == trace]
    plugin.send(trace, preemptions=1)
    await _until(lambda: any(r.trace_id == trace for r in finished))
    assert finished[-1].engine.preemptions == 1
    assert spans.get_finished_spans()[-1].attributes["inferwatch.engine.preemptions"] == 1
    assert _value(registry, cat.ENGINE_STATS_JOINS.series, result="joined") == 1


async def test_a_record_that_never_comes_is_a_counted_miss_after_the_wait(setup: Any) -> None:
    client, registry, _, plugin, _, finished = setup
    plugin.send(None)
    await _until(lambda: _value(registry, cat.ENGINE_STATS_RECORDS.series, kind="step") == 1)
    trace = "c" * 32
    await _request(client, trace)
    await _until(lambda: any(r.trace_id == trace for r in finished), timeout_s=WAIT_MS / 1000 + 2)
    assert finished[-1].engine is None
    assert _value(registry, cat.ENGINE_STATS_JOINS.series, result="missed") == 1


async def test_with_the_plugin_silent_nothing_waits(setup: Any) -> None:
    client, registry, _, _, _, finished = setup
    trace = "d" * 32
    await _request(client, trace)
    assert finished[-1].trace_id == trace, "observed at the end of the request, not after a wait"
    assert finished[-1].engine is None
    assert _value(registry, cat.ENGINE_STATS_JOINS.series, result="missed") == 1


async def test_a_datagram_that_is_not_the_plugins_is_counted(setup: Any) -> None:
    _, registry, _, plugin, _, _ = setup
    plugin.socket.sendto(b"hello", plugin.address)
    await _until(lambda: _value(registry, cat.ENGINE_STATS_RECORDS.series, kind="invalid") == 1)


async def test_with_no_plugin_sending_it_says_so_and_shows_no_zeros(setup: Any, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """A listener that hears nothing: plugin_up is 0 and the plugin's state families are absent (a 0 would
    read as an idle vLLM); the first datagram brings them, and 30 s of silence takes them away again."""
    _, registry, _, plugin, _, _ = setup
    assert registry.get_sample_value(cat.ENGINE_STATS_PLUGIN_UP.series) == 0
    for spec in (cat.ENGINE_PLUGIN_KV_CACHE_USAGE, cat.ENGINE_STATS_PLUGIN_DROPPED):
        assert registry.get_sample_value(spec.series) is None, spec.name
    assert registry.get_sample_value(cat.ENGINE_PLUGIN_REQUESTS.series, {"state": "running"}) is None
    plugin.send(None)
    await _until(lambda: registry.get_sample_value(cat.ENGINE_STATS_PLUGIN_UP.series) == 1)
    assert registry.get_sample_value(cat.ENGINE_PLUGIN_KV_CACHE_USAGE.series) == 0.25
    assert registry.get_sample_value(cat.ENGINE_PLUGIN_REQUESTS.series, {"state": "running"}) == 1
    later = time.monotonic() + PLUGIN_SILENT_AFTER_S + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    assert registry.get_sample_value(cat.ENGINE_STATS_PLUGIN_UP.series) == 0
    assert registry.get_sample_value(cat.ENGINE_PLUGIN_KV_CACHE_USAGE.series) is None

"""A real sidecar on loopback in the test's event loop, with its spans, records and counters at hand.

The upstream runs in a thread of its own (:class:`tests.fakes.faulty_upstream.ThreadedServer`),
so the sidecar's event loop holds only the sidecar's tasks and the test can count them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from log_pipeline.query import Archive
from serving import config as cfg
from serving.app import PROXY, TRACING, build_app, front_for, server_options
from serving.front import Front
from tests.fakes.faulty_upstream import FAULT_HEADER

READ_TIMEOUT_S = 0.5
REQUEST_TIMEOUT_S = 1.5
CONNECT_TIMEOUT_S = 0.5
MAX_EVENT_BYTES = 64 * 1024
ANSWER_WITHIN_S = 5.0
"""No answer may take longer than this (the longest configured limit is REQUEST_TIMEOUT_S)."""


@dataclass
class Sidecar:
    url: str
    app: web.Application
    registry: CollectorRegistry
    spans: InMemorySpanExporter
    logs: Path
    session: aiohttp.ClientSession


class Serving:
    """The front and aiohttp's runner behind it, as ``inferwatch serve`` runs them; stopped together."""

    def __init__(self, front: Front, runner: web.AppRunner) -> None:
        self.front = front
        self.runner = runner

    async def cleanup(self) -> None:
        await self.front.shutdown(1.0)
        await self.runner.cleanup()


async def start_sidecar(
    upstream: str, logs: Path, settings: cfg.Settings | None = None, *, success_sample_ratio: float = 1.0,
    **serve: Any,
) -> tuple[Sidecar, Serving]:
    """Start the sidecar (the front, as `serve` does) with short timeouts (``serve`` overrides them) and
    every record archived."""
    limits: dict[str, Any] = {"read_timeout_s": READ_TIMEOUT_S, "request_timeout_s": REQUEST_TIMEOUT_S,
                              "connect_timeout_s": CONNECT_TIMEOUT_S, "max_event_bytes": MAX_EVENT_BYTES,
                              "readiness_interval_s": 60.0}
    settings = cfg.replace(settings or cfg.defaults(), "serve", upstream=upstream, **{**limits, **serve})
    # every record kept, so the warm-up requests open the archive before the baseline is taken
    settings = cfg.replace(settings, "logs", dir=str(logs), frame_max_ms=20.0,
                           success_sample_ratio=success_sample_ratio)
    settings = cfg.replace(settings, "scrape", enabled=False)
    registry = CollectorRegistry()
    app = build_app(settings, registry)
    spans = InMemorySpanExporter()
    app[TRACING].provider.add_span_processor(SimpleSpanProcessor(spans))
    runner = web.AppRunner(app, **server_options(settings))  # type: ignore[arg-type]
    await runner.setup()
    front = front_for(app)
    port = await front.listen(runner, "127.0.0.1", 0)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ANSWER_WITHIN_S))
    return Sidecar(f"http://127.0.0.1:{port}", app, registry, spans, logs, session), Serving(front, runner)


def requests_counted(registry: CollectorRegistry, outcome: str) -> float:
    """inferwatch_requests_total summed over every label but the outcome."""
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "inferwatch_requests_total" and sample.labels["outcome"] == outcome:
                total += sample.value
    return total


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def upstream_connections_in_use(app: web.Application) -> int:
    return app[PROXY].upstream_pool.in_use


@dataclass
class Answer:
    status: int
    headers: Any
    body: bytes
    seconds: float


async def send(
    sidecar: Sidecar, fault: str | None, *, stream: bool, chat: bool = False, model: str = "fake-model",
    prompt: str = "hi", headers: dict[str, str] | None = None, max_tokens: int = 8,
) -> Answer:
    """One request, read to the end of its body (a half-written HTTP message raises here)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    payload: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream}
    payload.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    headers = {**(headers or {}), **({FAULT_HEADER: fault} if fault else {})}
    started = time.monotonic()
    async with sidecar.session.post(sidecar.url + path, json=payload, headers=headers) as response:
        body = await response.read()
        return Answer(response.status, response.headers, body, time.monotonic() - started)


def sse_events(body: bytes) -> list[Any]:
    events = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), f"not an SSE data event: {block[:80]!r}"
        data = block[6:]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def wait_for(predicate: Callable[[], Any], timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


async def record_of(logs: Path, trace_id: str) -> dict[str, Any] | None:
    found: list[dict[str, Any]] = []

    def look() -> bool:
        found[:] = list(Archive(logs).find(trace_id)) if logs.exists() else []
        return bool(found)

    await wait_for(look, 5.0)
    return found[0] if found else None

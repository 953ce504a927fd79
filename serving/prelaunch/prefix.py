"""The shared-prefix line: requests sharing one long prefix, against the same load with distinct prefixes.

vLLM's own counters say how much prefix cache was reused: the increase of ``vllm:prefix_cache_hits_total``
over that of ``vllm:prefix_cache_queries_total`` (prompt tokens) during each load, read from the engine's
/metrics before and after. KV cache usage is sampled during each load, and TTFT comes from the client.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import aiohttp

from exporters.vllm_parse import parse_exposition
from serving.loadtest.prompts import RequestPlan, prompt_text
from serving.loadtest.spec import LoadSpec
from serving.loadtest.stats import LoadReport
from serving.loadtest.steps import RunPlan, run_steps

SUFFIX_WORDS = 8
"""Words after the prefix that make each request's prompt its own."""
KV_SAMPLE_S = 0.25


@dataclass(frozen=True, slots=True)
class PrefixSource:
    """Prompts of ``prefix_words`` words, the same for every request when ``shared``, then a suffix of its own."""

    prefix_words: int
    shared: bool
    max_tokens: int

    def plan(self, index: int) -> RequestPlan:
        """The request number ``index``."""
        prefix = prompt_text(self.prefix_words, 0 if self.shared else index + 1)
        return RequestPlan(f"{prefix} {prompt_text(SUFFIX_WORDS, 1_000_003 + index)}", max_tokens=self.max_tokens,
                           bucket="shared" if self.shared else "distinct")

    def describe(self) -> dict[str, Any]:
        """What the source sends."""
        return {"kind": "shared-prefix" if self.shared else "distinct-prefix", "prefix_words": self.prefix_words}


@dataclass(frozen=True, slots=True)
class PrefixPhase:
    """One load's figures: prefix-cache tokens queried and hit (vLLM's counters), peak KV usage, client TTFT."""

    report: LoadReport
    queried_tokens: float | None
    hit_tokens: float | None
    kv_usage_max: float | None

    @property
    def hit_ratio(self) -> float | None:
        """Hits over queries during the load (None when vLLM gives no counters or nothing was queried)."""
        if not self.queried_tokens or self.hit_tokens is None:
            return None
        return self.hit_tokens / self.queried_tokens

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"requests": self.report.sent, "failed": self.report.failed, "prefix_cache_queried_tokens":
                self.queried_tokens, "prefix_cache_hit_tokens": self.hit_tokens, "prefix_cache_hit_ratio":
                self.hit_ratio, "kv_cache_usage_max": self.kv_usage_max, "ttft_p50_s": self.report.ttft_s.p50,
                "ttft_p99_s": self.report.ttft_s.p99}


async def _counters(session: aiohttp.ClientSession, metrics_url: str) -> tuple[float | None, float | None,
                                                                                float | None]:
    """(prefix-cache queries, hits, KV usage) summed over the engines of one scrape of vLLM's /metrics."""
    async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=10)) as reply:
        snapshot = parse_exposition(await reply.text())
    queries = [s.prefix_queries for s in snapshot.series if s.prefix_queries is not None]
    hits = [s.prefix_hits for s in snapshot.series if s.prefix_hits is not None]
    usage = [s.kv_usage for s in snapshot.series if s.kv_usage is not None]
    return (sum(queries) if queries else None, sum(hits) if hits else None, max(usage) if usage else None)


async def _peak_usage(session: aiohttp.ClientSession, metrics_url: str, into: list[float]) -> None:
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            usage = (await _counters(session, metrics_url))[2]
            if usage is not None:
                into.append(usage)
        await asyncio.sleep(KV_SAMPLE_S)


async def prefix_phase(spec: LoadSpec, source: PrefixSource, metrics_url: str) -> PrefixPhase:
    """Run one load of ``source`` and read vLLM's prefix-cache counters and KV usage around and during it."""
    async with aiohttp.ClientSession() as session:
        queries_before, hits_before, _ = await _counters(session, metrics_url)
        usage: list[float] = []
        sampler = asyncio.create_task(_peak_usage(session, metrics_url, usage))
        try:
            run = await run_steps(RunPlan((spec,), (source.describe()["kind"],), source))
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        queries_after, hits_after, _ = await _counters(session, metrics_url)
    queried = None if queries_before is None or queries_after is None else queries_after - queries_before
    hit = None if hits_before is None or hits_after is None else hits_after - hits_before
    return PrefixPhase(run.steps[0], queried, hit, max(usage) if usage else None)


__all__ = ["PrefixPhase", "PrefixSource", "prefix_phase"]

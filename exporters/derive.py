"""Pure derivations from parsed engine snapshots, in-flight token counts and GPU energy counters.

Data-parallel engines are summed where a sum means something (requests, blocks, counters, time);
KV usage is averaged weighted by each engine's block count. A value the inputs do not give stays
None: nothing is turned into a zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from exporters.catalog.engines import SIGNALS, Engine
from exporters.inflight import InFlight
from exporters.vllm_parse import CacheInfo, EngineSeries, EngineSnapshot, Histogram


@dataclass(frozen=True, slots=True)
class ModelView:
    """The normalized engine view of one served model (all its engines together)."""

    model: str
    engines: int
    running: float | None
    waiting: float | None
    swapped: float | None
    preemptions: float | None
    kv_usage: float | None
    blocks_total: int | None
    blocks_used: float | None
    block_size: int | None
    capacity_tokens: int | None
    prefix_hit_ratio: float | None
    prefill_seconds: float | None
    decode_seconds: float | None
    generation_tokens: float | None
    step_tokens: Histogram | None
    waiting_by_reason: dict[str, float] | None = None
    admission_rejections_by_reason: dict[str, float] | None = None
    offload_store_bytes: float | None = None
    offload_load_bytes: float | None = None
    offload_store_seconds: float | None = None
    offload_load_seconds: float | None = None
    offload_cpu_usage: float | None = None
    offload_allocation_failures: float | None = None

    @property
    def admission_rejections(self) -> float | None:
        """Requests vLLM refused with 503 at its queue limits, every reason together (None before 0.33)."""
        return _sum(self.admission_rejections_by_reason.values()) if self.admission_rejections_by_reason else None

    @property
    def kv_offload(self) -> dict[str, float | None] | None:
        """KV offloading (V1's swap): bytes and seconds each way and CPU space used; None when vLLM exposes none."""
        out = {
            "store_bytes": self.offload_store_bytes, "load_bytes": self.offload_load_bytes,
            "store_seconds": self.offload_store_seconds, "load_seconds": self.offload_load_seconds,
            "cpu_cache_usage": self.offload_cpu_usage,
        }
        if all(v is None for v in out.values()) and self.offload_allocation_failures is None:
            return None
        return out

    @property
    def prefill_share(self) -> float | None:
        """prefill / (prefill + decode) seconds, None before any request finished."""
        split = prefill_decode_split(self.prefill_seconds, self.decode_seconds)
        return None if split is None else split[0]

    @property
    def decode_share(self) -> float | None:
        """decode / (prefill + decode) seconds, None before any request finished."""
        split = prefill_decode_split(self.prefill_seconds, self.decode_seconds)
        return None if split is None else split[1]


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """Internal fragmentation of the KV blocks held by in-flight requests of one model."""

    model: str
    tokens: int
    blocks: int
    ratio: float | None


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) if present else None


def prefill_decode_split(prefill_s: float | None, decode_s: float | None) -> tuple[float, float] | None:
    """``(prefill share, decode share)`` of request time; None when either is unknown or both are 0."""
    if prefill_s is None or decode_s is None or prefill_s < 0 or decode_s < 0:
        return None
    total = prefill_s + decode_s
    if total <= 0:
        return None
    return prefill_s / total, decode_s / total


def prefix_hit_ratio(hits: float | None, queries: float | None) -> float | None:
    """hits / queries (tokens), None before the first query or when the counts are inconsistent."""
    if hits is None or queries is None or queries <= 0 or hits < 0 or hits > queries:
        return None
    return hits / queries


def kv_blocks(cache: Sequence[CacheInfo]) -> tuple[int | None, int | None]:
    """``(total blocks summed over engines, block size)`` from ``vllm:cache_config_info``."""
    totals = [c.num_gpu_blocks for c in cache if c.num_gpu_blocks is not None]
    sizes = [c.block_size for c in cache if c.block_size]
    return (sum(totals) if totals else None), (max(sizes) if sizes else None)


def kv_capacity_tokens(cache: Sequence[CacheInfo]) -> int | None:
    """Tokens the KV cache holds: sum over engines of num_gpu_blocks x block_size."""
    capacity = [c.num_gpu_blocks * c.block_size for c in cache if c.num_gpu_blocks is not None and c.block_size]
    return sum(capacity) if capacity else None


def usable_blocks(num_gpu_blocks: int, generation: str | None, engines: int = 1) -> int:
    """Blocks requests can get from ``engines`` engines holding ``num_gpu_blocks`` together: V1 holds one null
    block back in each engine (usage = 1 - free / (blocks - 1))."""
    if generation == "v0":
        return num_gpu_blocks
    return max(num_gpu_blocks - max(engines, 1), 0)


def kv_usage_and_used(
    series: Sequence[EngineSeries], cache: Sequence[CacheInfo], generation: str | None = None
) -> tuple[float | None, float | None]:
    """``(usage ratio, blocks in use)``: usage weighted by each engine's usable blocks; used = usage x usable."""
    blocks_by_engine = {
        c.engine: usable_blocks(c.num_gpu_blocks, generation) for c in cache if c.num_gpu_blocks is not None
    }
    usages = [(s.engine, s.kv_usage) for s in series if s.kv_usage is not None]
    if not usages:
        return None, None
    if all(engine in blocks_by_engine for engine, _ in usages):
        used = math.fsum(u * blocks_by_engine[e] for e, u in usages)
        total = sum(blocks_by_engine[e] for e, _ in usages)
        return (used / total if total > 0 else None), used
    return math.fsum(u for _, u in usages) / len(usages), None


def _merge_histograms(histograms: Sequence[Histogram]) -> Histogram | None:
    if not histograms:
        return None
    counts: dict[float, float] = {}
    for hist in histograms:
        for bound, count in hist.buckets:
            counts[bound] = counts.get(bound, 0.0) + count
    return Histogram(
        tuple(sorted(counts.items())), math.fsum(h.sum for h in histograms), math.fsum(h.count for h in histograms)
    )


def _by_label(pairs: Iterable[tuple[str, float]]) -> dict[str, float] | None:
    out: dict[str, float] = {}
    for key, value in pairs:
        out[key] = out.get(key, 0.0) + value
    return dict(sorted(out.items())) if out else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def _cache_of(snapshot: EngineSnapshot, model: str, series: Sequence[EngineSeries]) -> list[CacheInfo]:
    if len(snapshot.models) <= 1:
        return list(snapshot.cache)
    engines = {s.engine for s in series}
    return [c for c in snapshot.cache if c.engine in engines]


def model_view(snapshot: EngineSnapshot, model: str) -> ModelView:
    """Aggregate one model's engines into the normalized view."""
    series = [s for s in snapshot.series if s.model == model]
    cache = _cache_of(snapshot, model, series)
    blocks_total, block_size = kv_blocks(cache)
    usage, used = kv_usage_and_used(series, cache, snapshot.generation)
    hit_ratio = prefix_hit_ratio(_sum(s.prefix_hits for s in series), _sum(s.prefix_queries for s in series))
    if hit_ratio is None:
        rates = [s.prefix_hit_rate for s in series if s.prefix_hit_rate is not None and 0 <= s.prefix_hit_rate <= 1]
        hit_ratio = math.fsum(rates) / len(rates) if rates else None
    return ModelView(
        model=model,
        engines=len({s.engine for s in series}),
        running=_sum(s.running for s in series),
        waiting=_sum(s.waiting for s in series),
        swapped=_sum(s.swapped for s in series),
        preemptions=_sum(s.preemptions for s in series),
        kv_usage=usage,
        blocks_total=blocks_total,
        blocks_used=used,
        block_size=block_size,
        capacity_tokens=kv_capacity_tokens(cache),
        prefix_hit_ratio=hit_ratio,
        prefill_seconds=_sum(s.prefill_seconds for s in series),
        decode_seconds=_sum(s.decode_seconds for s in series),
        generation_tokens=_sum(s.generation_tokens for s in series),
        step_tokens=_merge_histograms([s.step_tokens for s in series if s.step_tokens is not None]),
        waiting_by_reason=_by_label(pair for s in series for pair in s.waiting_by_reason),
        admission_rejections_by_reason=_by_label(
            (reason, value) for m, reason, value in snapshot.admission_rejections if m == model
        ),
        offload_store_bytes=_sum(s.offload_store_bytes for s in series),
        offload_load_bytes=_sum(s.offload_load_bytes for s in series),
        offload_store_seconds=_sum(s.offload_store_seconds for s in series),
        offload_load_seconds=_sum(s.offload_load_seconds for s in series),
        offload_cpu_usage=_mean(s.offload_cpu_usage for s in series),
        offload_allocation_failures=_sum(s.offload_allocation_failures for s in series),
    )


def model_views(snapshot: EngineSnapshot) -> list[ModelView]:
    """One view per served model, sorted by name."""
    return [model_view(snapshot, m) for m in snapshot.models]


def normalized(snapshot: EngineSnapshot) -> dict[str, object]:
    """The normalized view as plain data (the ``inferwatch metrics derive --json`` object).

    Top-level numbers cover every model together; ``by_model`` has one entry per model.
    """
    combined = EngineSnapshot(
        snapshot.generation,
        tuple(replace(s, model="*") for s in snapshot.series),
        snapshot.cache,
        admission_rejections=tuple(("*", reason, value) for _m, reason, value in snapshot.admission_rejections),
    )
    out = _view_dict(model_view(combined, "*"))
    out.pop("model")
    return {
        "generation": snapshot.generation,
        "models": list(snapshot.models),
        **out,
        "parse_errors": snapshot.parse_errors,
        "unknown_families": list(snapshot.unknown_families),
        "missing": missing_signals(snapshot.generation),
        "by_model": [_view_dict(v) for v in model_views(snapshot)],
    }


def missing_signals(generation: str | None) -> dict[str, str]:
    """The signals the engine of ``generation`` (``sglang``, ``llamacpp``) does not export, each with why: the
    view says they are unknown rather than showing a number nobody measured. Empty for vLLM's generations."""
    engine = next((e for e in Engine if e.value == generation), None)
    if engine is None:
        return {}
    return {signal.name: signal.missing()[engine] for signal in SIGNALS if engine in signal.missing()}


def _view_dict(view: ModelView) -> dict[str, object]:
    return {
        "model": view.model,
        "engines": view.engines,
        "running": view.running,
        "waiting": view.waiting,
        "swapped": view.swapped,
        "preemptions": view.preemptions,
        "kv_usage": view.kv_usage,
        "blocks_total": view.blocks_total,
        "blocks_used": view.blocks_used,
        "block_size": view.block_size,
        "capacity_tokens": view.capacity_tokens,
        "prefix_hit_ratio": view.prefix_hit_ratio,
        "prefill_seconds": view.prefill_seconds,
        "decode_seconds": view.decode_seconds,
        "prefill_share": view.prefill_share,
        "decode_share": view.decode_share,
        "waiting_by_reason": view.waiting_by_reason,
        "admission_rejections": view.admission_rejections,
        "kv_offload": view.kv_offload,
    }


def blocks_of(tokens: int, block_size: int) -> int:
    """KV blocks that ``tokens`` tokens fill: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


def running_entries(
    entries: Sequence[InFlight], running: float | None, block_size: int | None = None,
    usable_blocks: int | None = None,
) -> Sequence[InFlight]:
    """The in-flight requests vLLM is running: ``running`` of them, those receiving tokens first (the latest
    token first), then the oldest.

    vLLM schedules first come, first served, and a preempted request goes back to the head of the
    queue: the requests that wait hold no KV block. The order in which the sidecar saw the requests
    start (their status lines) need not be the order vLLM admitted them, so a stream whose tokens are
    coming (``InFlight.generating``: one lately, so not a preempted one) counts as running before an
    older one still waiting. A running stream gets a token every engine step, so among those, the one
    whose latest token is oldest (``InFlight.quiet_ns``) is the one vLLM has most likely preempted since:
    it counts last.

    With the running count unknown (the latest scrape failed), the streams receiving tokens run, and
    the others join oldest first as long as their blocks fit in ``usable_blocks``, stopping at the
    first that does not fit, as vLLM's scheduler does: it cannot admit more than it has blocks for.
    With neither the count nor the capacity known, all.
    """
    if running is not None:
        ranked = sorted(entries, key=lambda e: (not e.generating, (e.quiet_ns or 0) if e.generating else 0))
        return ranked[: max(round(running), 0)]  # stable: the others in start order
    if not block_size or block_size <= 0 or usable_blocks is None:
        return entries
    held = [entry for entry in entries if entry.generating]
    free = usable_blocks - sum(blocks_of(entry.tokens, block_size) for entry in held)
    for entry in entries:
        if entry.generating:
            continue
        need = blocks_of(entry.tokens, block_size)
        if need > free:
            break
        held.append(entry)
        free -= need
    return held


def fragmentation(
    entries: Iterable[InFlight], block_size: int | None, measured_blocks: float | None = None
) -> list[Fragmentation]:
    """Per model: ``1 - sum(tokens) / sum(ceil(tokens / block_size) * block_size)`` over in-flight requests.

    Requests with no tokens hold no block and are left out; ratio is None when no block is held or the
    block size is unknown. An estimate: blocks shared through the prefix cache are not seen. With
    ``measured_blocks`` (vLLM's own blocks in use, from its stat-logger plugin) the ratio is
    ``1 - tokens / (measured_blocks * block_size)`` instead, at least 0 (shared prefix blocks can make
    the tokens exceed the blocks' slots).
    """
    if not block_size or block_size <= 0:
        return []
    tokens: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for entry in entries:
        if entry.tokens <= 0:
            continue
        tokens[entry.model] = tokens.get(entry.model, 0) + entry.tokens
        blocks[entry.model] = blocks.get(entry.model, 0) + blocks_of(entry.tokens, block_size)
    out = []
    for model in sorted(tokens):
        slots = (measured_blocks if measured_blocks is not None else blocks[model]) * block_size
        ratio = max(1 - tokens[model] / slots, 0.0) if slots else None
        out.append(Fragmentation(model, tokens[model], blocks[model], ratio))
    return out


def counter_delta(previous: float | None, current: float | None) -> float | None:
    """Increase of a cumulative counter between two readings; a drop (restart) counts from zero."""
    if previous is None or current is None:
        return None
    return current if current < previous else current - previous


def energy_used(previous: Mapping[str, float | None], current: Mapping[str, float | None]) -> float | None:
    """Joules the same GPUs used between two readings of their energy counters (GPU -> joules since driver load).

    None, never a guess, when the GPU sets differ, a GPU has no reading at either end (counter not
    supported, GPU lost, call failed) or a counter went backwards: after a driver reload the energy
    used before the reload is unknown, and counting from zero would inflate tokens per joule.
    """
    if not current or set(previous) != set(current):
        return None
    total = 0.0
    for gpu, now in current.items():
        then = previous[gpu]
        if then is None or now is None or now < then:
            return None
        total += now - then
    return total


def tokens_per_joule(previous_tokens: float | None, current_tokens: float | None, joules: float | None) -> float | None:
    """Generated tokens per joule: the token counter's increase over the energy used in the same window."""
    delta = counter_delta(previous_tokens, current_tokens)
    if delta is None or joules is None or joules <= 0:
        return None
    return delta / joules

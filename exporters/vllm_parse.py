"""vLLM ``/metrics`` text -> :class:`EngineSnapshot`, for every vLLM metrics generation.

The text is cut into family blocks (``# HELP``/``# TYPE`` plus their samples). Blocks of other
exporters (``http_*``, ``python_*``, ``process_*``) and ``*_created`` companions are dropped
unparsed; ``vllm:`` blocks that the catalog does not know are counted as unknown; the blocks the
sidecar derives its signals from are parsed with prometheus_client's parser, one block at a time,
so that a malformed family is skipped and counted while the rest still parses. Nothing here raises
on bad input.

Generations: ``v0`` (V0 engine, 0.6–0.9), ``v1`` (V1 engine up to 0.11) and ``v1_engine``
(0.3x). V0 is recognised by its V0-only families, 0.3x by families added after 0.11
(see :data:`CURRENT_ONLY`); anything else with ``vllm:`` families is ``v1``.

Ray Serve LLM exposes the same families under ``ray_vllm:`` or (0.33) ``ray_vllm_``
(:data:`~exporters.catalog.vllm.RAY_PREFIXES`); they are read as ``vllm:`` families, and Ray's
``ReplicaId`` label becomes part of the engine key (``<replica>/<engine>``) so that replicas are
summed like data-parallel engines, never mixed up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import vllm as cat
from exporters.catalog.spec import MetricSpec, MetricType

_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created", "_info", "_gsum", "_gcount")

V0_ONLY: frozenset[str] = frozenset({
    cat.NUM_REQUESTS_SWAPPED.name, cat.CPU_CACHE_USAGE_PERC.name, cat.GPU_PREFIX_CACHE_HIT_RATE.name,
    cat.CPU_PREFIX_CACHE_HIT_RATE.name, cat.KV_CACHE_USAGE_PERC.aliases["v0"],
})
"""Family names only the V0 engine exposed."""

CURRENT_ONLY: frozenset[str] = frozenset({
    cat.NUM_REQUESTS_WAITING_BY_REASON.name, cat.ENGINE_SLEEP_STATE.name, cat.REQUEST_NUM_PREEMPTIONS.name,
    cat.ADMISSION_REJECTIONS.name, f"{cat.ADMISSION_REJECTIONS.name}_total",
})
"""Family names added after vLLM 0.11 (present in 0.32/0.33 by default)."""


def _exposed_names(spec: MetricSpec) -> list[str]:
    names = [spec.name, *spec.aliases.values()]
    if spec.type is MetricType.COUNTER:
        names += [n if n.endswith("_total") else f"{n}_total" for n in list(names)]
    return names


KNOWN: dict[str, MetricSpec] = {name: spec for spec in cat.SPECS for name in _exposed_names(spec)}
"""Every ``# TYPE`` name a vLLM generation used (counters with and without ``_total``) -> spec."""

WANTED: frozenset[str] = frozenset(s.name for s in (
    cat.NUM_REQUESTS_RUNNING, cat.NUM_REQUESTS_WAITING, cat.NUM_REQUESTS_SWAPPED, cat.NUM_PREEMPTIONS,
    cat.KV_CACHE_USAGE_PERC, cat.CACHE_CONFIG_INFO, cat.PREFIX_CACHE_QUERIES, cat.PREFIX_CACHE_HITS,
    cat.GPU_PREFIX_CACHE_HIT_RATE, cat.REQUEST_PREFILL_TIME, cat.REQUEST_DECODE_TIME,
    cat.GENERATION_TOKENS, cat.ITERATION_TOKENS, cat.NUM_REQUESTS_WAITING_BY_REASON, cat.ADMISSION_REJECTIONS,
    cat.CPU_CACHE_USAGE_PERC, cat.KV_OFFLOAD_STORE_BYTES, cat.KV_OFFLOAD_LOAD_BYTES, cat.KV_OFFLOAD_STORE_TIME,
    cat.KV_OFFLOAD_LOAD_TIME, cat.KV_OFFLOAD_CPU_CACHE_USAGE_PERC, cat.KV_OFFLOAD_ALLOCATION_FAILURE,
    cat.KV_OFFLOAD_TOTAL_BYTES, cat.KV_OFFLOAD_TOTAL_TIME,
))
"""Catalog names of the families the derived signals need; only these are parsed sample by sample."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: ``(upper bound, cumulative count)`` pairs, +Inf last, plus sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """The derivation inputs one engine reported for one model (None where the text does not say)."""

    model: str
    engine: str
    running: float | None = None
    waiting: float | None = None
    swapped: float | None = None
    preemptions: float | None = None
    kv_usage: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    prefix_hit_rate: float | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    generation_tokens: float | None = None
    step_tokens: Histogram | None = None
    waiting_by_reason: tuple[tuple[str, float], ...] = ()
    offload_store_bytes: float | None = None
    offload_load_bytes: float | None = None
    offload_store_seconds: float | None = None
    offload_load_seconds: float | None = None
    offload_cpu_usage: float | None = None
    offload_allocation_failures: float | None = None


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """What ``vllm:cache_config_info`` says about one engine's KV cache."""

    engine: str
    block_size: int | None
    num_gpu_blocks: int | None
    kv_cache_size_tokens: int | None


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One parsed exposition: detected generation, per-engine series, cache facts and parse health."""

    generation: str | None
    series: tuple[EngineSeries, ...] = ()
    cache: tuple[CacheInfo, ...] = ()
    parse_errors: int = 0
    unknown_families: tuple[str, ...] = ()
    malformed_families: tuple[str, ...] = ()
    families: int = 0
    admission_rejections: tuple[tuple[str, str, float], ...] = ()
    """``(model, reason, count)`` from vllm:admission_rejections_total (no engine label)."""

    @property
    def models(self) -> tuple[str, ...]:
        """Served model names, sorted."""
        return tuple(sorted({s.model for s in self.series}))

    @property
    def engines(self) -> tuple[str, ...]:
        """Engine indexes seen (``""`` for V0, which has no engine label), sorted."""
        return tuple(sorted({s.engine for s in self.series} | {c.engine for c in self.cache}))


EMPTY = EngineSnapshot(generation=None)


# ---- splitting ---------------------------------------------------------------------------------

def _sample_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " ", "\t"):
        pos = line.find(stop)
        if 0 <= pos < end:
            end = pos
    return line[:end]


def _belongs(sample: str, family: str) -> bool:
    if not sample.startswith(family):
        return False
    return sample[len(family):] in _SUFFIXES


def split_families(text: str) -> tuple[list[tuple[str, list[str]]], int]:
    """Cut an exposition into ``(family name, lines)`` blocks; also return the count of junk lines."""
    blocks: list[tuple[str, list[str]]] = []
    junk = 0
    name: str | None = None
    lines: list[str] = []
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue  # a plain comment
            key = parts[2]
            if key != name:
                if name is not None:
                    blocks.append((name, lines))
                name, lines = key, []
            lines.append(line)
            continue
        sample = _sample_name(line)
        if not sample:
            junk += 1
            continue
        if name is None or not _belongs(sample, name):
            if name is not None:
                blocks.append((name, lines))
            name, lines = sample, []
        lines.append(line)
    if name is not None:
        blocks.append((name, lines))
    return blocks, junk


# ---- parsing -----------------------------------------------------------------------------------

def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _int_label(labels: dict[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    try:
        value = int(float(raw))
    except (ValueError, OverflowError):
        return None
    return value if value >= 0 else None


def engine_key(labels: dict[str, str]) -> str:
    """The engine a sample belongs to: its ``engine`` label, prefixed by Ray's replica id when there is one."""
    engine = labels.get("engine", "")
    replica = labels.get(cat.RAY_REPLICA_LABEL)
    return f"{replica}/{engine}" if replica else engine


def _ray_prefix(name: str) -> str:
    return next((p for p in cat.RAY_PREFIXES if name.startswith(p)), "")


def canonical_name(name: str) -> str:
    """A family name with Ray Serve's ``ray_vllm:`` / ``ray_vllm_`` prefix read as vLLM's ``vllm:``."""
    prefix = _ray_prefix(name)
    return cat.VLLM_PREFIX + name[len(prefix):] if prefix else name


def _renamed(lines: list[str], old: str, new: str) -> list[str]:
    """A Ray family block with every family and sample name moved from ``old`` to ``new``."""
    out = []
    for line in lines:
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2].startswith(old):
                parts[2] = new + parts[2][len(old):]
            out.append(" ".join(parts))
        elif line.startswith(old):
            out.append(new + line[len(old):])
        else:
            out.append(line)
    return out


class _Builder:
    """Mutable accumulator of per-(model, engine) values while a text is being read."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], dict[str, Any]] = {}
        self.legacy: dict[tuple[str, str], dict[str, Any]] = {}
        self.labeled: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
        self.hist: dict[tuple[str, str], dict[str, Any]] = {}
        self.cache: dict[str, CacheInfo] = {}
        self.rejections: dict[tuple[str, str], float] = {}

    def put(self, labels: dict[str, str], fieldname: str, value: float | None, *, legacy: bool = False) -> None:
        if value is None:
            return
        key = (labels.get("model_name", ""), engine_key(labels))
        slot = (self.legacy if legacy else self.values).setdefault(key, {})
        slot[fieldname] = slot.get(fieldname, 0.0) + value

    def put_by(self, labels: dict[str, str], fieldname: str, label: str, value: float | None) -> None:
        if value is None:
            return
        key = (labels.get("model_name", ""), engine_key(labels))
        slot = self.labeled.setdefault(key, {}).setdefault(fieldname, {})
        slot[labels.get(label, "")] = slot.get(labels.get(label, ""), 0.0) + value

    def reject(self, labels: dict[str, str], value: float | None) -> None:
        if value is None:
            return
        key = (labels.get("model_name", ""), labels.get("reason", ""))
        self.rejections[key] = self.rejections.get(key, 0.0) + value

    def add_hist(self, labels: dict[str, str], sample: str, value: float | None) -> None:
        if value is None:
            return
        key = (labels.get("model_name", ""), engine_key(labels))
        slot = self.hist.setdefault(key, {"buckets": {}, "sum": 0.0, "count": 0.0})
        if sample.endswith("_bucket"):
            bound = _finite(labels.get("le")) if labels.get("le") not in ("+Inf", "Inf") else math.inf
            if bound is None:
                return
            slot["buckets"][bound] = slot["buckets"].get(bound, 0.0) + value
        elif sample.endswith("_sum"):
            slot["sum"] += value
        elif sample.endswith("_count"):
            slot["count"] += value

    def freeze(self, generation: str | None, **health: Any) -> EngineSnapshot:
        keys = sorted(set(self.values) | set(self.hist) | set(self.labeled) | set(self.legacy))
        series = []
        for model, engine in keys:
            fields = {**self.legacy.get((model, engine), {}), **self.values.get((model, engine), {})}
            for name, by_label in self.labeled.get((model, engine), {}).items():
                fields[name] = tuple(sorted(by_label.items()))
            hist = self.hist.get((model, engine))
            if hist is not None and hist["buckets"]:
                fields["step_tokens"] = Histogram(
                    tuple(sorted(hist["buckets"].items())), hist["sum"], hist["count"]
                )
            series.append(EngineSeries(model, engine, **fields))
        cache = tuple(self.cache[e] for e in sorted(self.cache))
        rejections = tuple((m, r, v) for (m, r), v in sorted(self.rejections.items()))
        return EngineSnapshot(generation, tuple(series), cache, admission_rejections=rejections, **health)


_FIELDS: dict[str, str] = {
    cat.NUM_REQUESTS_RUNNING.name: "running", cat.NUM_REQUESTS_WAITING.name: "waiting",
    cat.NUM_REQUESTS_SWAPPED.name: "swapped", cat.NUM_PREEMPTIONS.name: "preemptions",
    cat.KV_CACHE_USAGE_PERC.name: "kv_usage", cat.PREFIX_CACHE_QUERIES.name: "prefix_queries",
    cat.PREFIX_CACHE_HITS.name: "prefix_hits", cat.GPU_PREFIX_CACHE_HIT_RATE.name: "prefix_hit_rate",
    cat.GENERATION_TOKENS.name: "generation_tokens",
    cat.KV_OFFLOAD_STORE_BYTES.name: "offload_store_bytes", cat.KV_OFFLOAD_LOAD_BYTES.name: "offload_load_bytes",
    cat.KV_OFFLOAD_STORE_TIME.name: "offload_store_seconds", cat.KV_OFFLOAD_LOAD_TIME.name: "offload_load_seconds",
    cat.KV_OFFLOAD_ALLOCATION_FAILURE.name: "offload_allocation_failures",
}
_MEAN_FIELDS: dict[str, str] = {
    # Fractions, one per engine (derive averages them over engines); V0's swap space is V1's offload space.
    cat.KV_OFFLOAD_CPU_CACHE_USAGE_PERC.name: "offload_cpu_usage", cat.CPU_CACHE_USAGE_PERC.name: "offload_cpu_usage",
}
_LEGACY_TRANSFER: dict[str, dict[str, str]] = {
    cat.KV_OFFLOAD_TOTAL_BYTES.name: {cat.KV_OFFLOAD_STORE_TRANSFER: "offload_store_bytes",
                                      cat.KV_OFFLOAD_LOAD_TRANSFER: "offload_load_bytes"},
    cat.KV_OFFLOAD_TOTAL_TIME.name: {cat.KV_OFFLOAD_STORE_TRANSFER: "offload_store_seconds",
                                     cat.KV_OFFLOAD_LOAD_TRANSFER: "offload_load_seconds"},
}
_HIST_SUM_FIELDS: dict[str, str] = {
    cat.REQUEST_PREFILL_TIME.name: "prefill_seconds", cat.REQUEST_DECODE_TIME.name: "decode_seconds",
}


def _take(builder: _Builder, spec: str, family: Any) -> None:
    for sample in family.samples:
        name, labels, value = sample.name, sample.labels, _finite(sample.value)
        if name.endswith("_created"):
            continue
        if spec == cat.CACHE_CONFIG_INFO.name:
            engine = engine_key(labels)
            builder.cache[engine] = CacheInfo(
                engine, _int_label(labels, "block_size"), _int_label(labels, "num_gpu_blocks"),
                _int_label(labels, "kv_cache_size_tokens"),
            )
        elif spec in _FIELDS:
            builder.put(labels, _FIELDS[spec], value)
        elif spec in _MEAN_FIELDS:
            builder.put(labels, _MEAN_FIELDS[spec], value)
        elif spec in _LEGACY_TRANSFER:
            fieldname = _LEGACY_TRANSFER[spec].get(labels.get("transfer_type", ""))
            if fieldname is not None:
                builder.put(labels, fieldname, value, legacy=True)
        elif spec == cat.NUM_REQUESTS_WAITING_BY_REASON.name:
            builder.put_by(labels, "waiting_by_reason", "reason", value)
        elif spec == cat.ADMISSION_REJECTIONS.name:
            builder.reject(labels, value)
        elif spec in _HIST_SUM_FIELDS:
            if name.endswith("_sum"):
                builder.put(labels, _HIST_SUM_FIELDS[spec], value)
        elif spec == cat.ITERATION_TOKENS.name:
            builder.add_hist(labels, name, value)


def detect_generation(names: set[str]) -> str | None:
    """The vLLM metrics generation from the family names present (None without any ``vllm:`` family)."""
    if names & V0_ONLY:
        return "v0"
    if names & CURRENT_ONLY:
        return "v1_engine"
    if any(n.startswith("vllm:") for n in names):
        return "v1"
    return None


def parse_exposition(text: str) -> EngineSnapshot:
    """Parse a vLLM ``/metrics`` text into a snapshot; never raises, counts what it had to skip."""
    if not isinstance(text, str):
        return EngineSnapshot(generation=None, parse_errors=1)
    blocks, errors = split_families(text)
    builder = _Builder()
    names: set[str] = set()
    unknown: list[str] = []
    malformed: list[str] = []
    families = 0
    for raw_name, raw_lines in blocks:
        name = canonical_name(raw_name)
        if not name.startswith(cat.VLLM_PREFIX):
            continue
        lines = raw_lines if name == raw_name else _renamed(raw_lines, _ray_prefix(raw_name), cat.VLLM_PREFIX)
        if name.endswith("_created"):
            base = name[: -len("_created")]
            if base in KNOWN or f"{base}_total" in KNOWN:
                continue  # the creation time of a known counter or histogram: not data
        spec = KNOWN.get(name)
        families += 1
        names.add(name)
        if spec is None:
            unknown.append(name)
            continue
        if spec.name not in WANTED:
            continue
        try:
            parsed = list(text_string_to_metric_families("\n".join(lines) + "\n"))
            for family in parsed:
                _take(builder, spec.name, family)
        except Exception:  # the parser raises ValueError, IndexError, ...: all mean "malformed"
            errors += 1
            malformed.append(name)
    return builder.freeze(
        detect_generation(names), parse_errors=errors, unknown_families=tuple(unknown),
        malformed_families=tuple(malformed), families=families,
    )

"""The engines inferwatch watches, what each one tells, and the sidecar's series that only some engines feed.

``serve.engine`` names one of :class:`Engine` (or ``auto``: recognized from the upstream's ``/metrics`` names
and endpoints). :data:`SIGNALS` is the table of the README's "Engines" section: for each signal of the engine
view, whether each engine measures it, lets the sidecar derive it, or does not have it (and why). Rules and
panels that read a series some engine does not feed say so (:func:`missing_on`), so that an empty panel or an
alert that cannot fire is never silent about it.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

from exporters import buckets
from exporters.catalog import cutover as cc
from exporters.catalog import engine as ce
from exporters.catalog import request as cr
from exporters.catalog import usage as cu
from exporters.catalog.spec import MetricSpec, MetricType


class Engine(enum.StrEnum):
    """An inference engine behind the sidecar."""

    VLLM = "vllm"
    SGLANG = "sglang"
    OLLAMA = "ollama"
    LLAMACPP = "llamacpp"


AUTO = "auto"
ENGINE_CHOICES = (AUTO, *(e.value for e in Engine))
"""The values ``serve.engine`` takes."""
ENGINE_NAMES = {Engine.VLLM: "vLLM", Engine.SGLANG: "SGLang", Engine.OLLAMA: "Ollama", Engine.LLAMACPP: "llama.cpp"}


class Kind(enum.StrEnum):
    """How the sidecar gets a signal from an engine."""

    MEASURED = "measured"
    DERIVED = "derived"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Signal:
    """One signal of the engine view: the sidecar's series that carry it and how each engine feeds them."""

    name: str
    series: tuple[str, ...]
    how: dict[Engine, tuple[Kind, str]]

    def missing(self) -> dict[Engine, str]:
        """The engines that do not feed it, with why."""
        return {engine: text for engine, (kind, text) in self.how.items() if kind is Kind.MISSING}


# ---- the sidecar's own series about the engine ------------------------------------------------

UPSTREAM_ENGINE = MetricSpec(
    "inferwatch_upstream_engine", MetricType.GAUGE,
    "Value 1; engine = the engine behind the sidecar (vllm, sglang, ollama, llamacpp, or unknown while "
    "serve.engine = auto has not recognized it yet), configured = serve.engine, detected_by = how it was "
    "recognized (config, metrics: the families of /metrics, endpoint: Ollama's root or llama.cpp's /metrics "
    "refusal, none).",
    ("upstream", "engine", "configured", "detected_by"),
)
OLLAMA_MODELS = MetricSpec(
    "inferwatch_ollama_models", MetricType.GAUGE,
    "Models Ollama has pulled (the length of /api/tags' models list, polled every scrape.interval_s).",
    ("upstream",), "models",
)
OLLAMA_MODEL_SIZE = MetricSpec(
    "inferwatch_ollama_model_size_bytes", MetricType.GAUGE,
    "Size on disk of each model Ollama has pulled (/api/tags size).", ("upstream", "model_name"), "bytes",
)
OLLAMA_LOADED_BYTES = MetricSpec(
    "inferwatch_ollama_loaded_model_bytes", MetricType.GAUGE,
    "Memory of each model Ollama holds loaded (/api/ps size); absent when it is unloaded.",
    ("upstream", "model_name"), "bytes",
)
OLLAMA_LOADED_VRAM_BYTES = MetricSpec(
    "inferwatch_ollama_loaded_model_vram_bytes", MetricType.GAUGE,
    "GPU memory of each model Ollama holds loaded (/api/ps size_vram; the rest of size sits in CPU memory).",
    ("upstream", "model_name"), "bytes",
)
OLLAMA_LOADED_EXPIRES = MetricSpec(
    "inferwatch_ollama_loaded_model_expires_timestamp_seconds", MetricType.GAUGE,
    "Unix time at which Ollama unloads each loaded model unless it is used again (/api/ps expires_at).",
    ("upstream", "model_name"), "seconds",
)
OLLAMA_POLL_UP = MetricSpec(
    "inferwatch_ollama_poll_up", MetricType.GAUGE,
    "1 when the last poll of Ollama's /api/tags and /api/ps succeeded, else 0.", ("upstream",),
)
REQUEST_ENGINE_LOAD_SECONDS = MetricSpec(
    "inferwatch_request_engine_load_seconds", MetricType.HISTOGRAM,
    "Seconds Ollama spent loading the model for a request (its final message's load_duration; a cold start "
    "when large), by model, prompt length bucket and outcome.",
    cr.ENGINE_LABELS, "seconds", buckets.REQUEST_LATENCY,
)

M, D, X = Kind.MEASURED, Kind.DERIVED, Kind.MISSING
NO_METRICS = "Ollama has no /metrics"
KV_USAGE_SIGNAL = "KV-cache usage"

SIGNALS: tuple[Signal, ...] = (
    Signal("requests running / waiting", (ce.ENGINE_REQUESTS.name, ce.ENGINE_BATCH_REQUESTS.name), {
        Engine.VLLM: (M, "vllm:num_requests_running, vllm:num_requests_waiting"),
        Engine.SGLANG: (M, "sglang:num_running_reqs, sglang:num_queue_reqs"),
        Engine.LLAMACPP: (M, "llamacpp:requests_processing (busy slots), llamacpp:requests_deferred"),
        Engine.OLLAMA: (X, NO_METRICS + "; the sidecar's own in-flight count stands in"),
    }),
    Signal(KV_USAGE_SIGNAL, (ce.KV_USAGE.name,), {
        Engine.VLLM: (M, "vllm:kv_cache_usage_perc"),
        Engine.SGLANG: (M, "sglang:token_usage (its token pool)"),
        Engine.LLAMACPP: (X, "llama-server exports no KV-cache gauge"),
        Engine.OLLAMA: (X, NO_METRICS),
    }),
    Signal("KV blocks, block size, capacity, in-flight blocks, fragmentation", (
        ce.KV_BLOCKS_TOTAL.name, ce.KV_BLOCKS_USED.name, ce.KV_BLOCK_SIZE.name, ce.KV_CAPACITY_TOKENS.name,
        ce.KV_INFLIGHT_BLOCKS.name, ce.KV_FRAGMENTATION.name,
    ), {
        Engine.VLLM: (D, "vllm:cache_config_info x usage"),
        Engine.SGLANG: (X, "SGLang pages tokens, it exports no block count"),
        Engine.LLAMACPP: (X, "no KV gauge"),
        Engine.OLLAMA: (X, NO_METRICS),
    }),
    Signal("preemptions", (ce.ENGINE_PREEMPTIONS.name,), {
        Engine.VLLM: (M, "vllm:num_preemptions_total"),
        Engine.SGLANG: (M, "sglang:num_retracted_requests_total (retractions)"),
        Engine.LLAMACPP: (X, "llama.cpp never preempts a slot and exports no such counter"),
        Engine.OLLAMA: (X, NO_METRICS),
    }),
    Signal("prefix-cache hit ratio", (ce.ENGINE_PREFIX_CACHE_HIT_RATIO.name,), {
        Engine.VLLM: (D, "prefix_cache_hits / prefix_cache_queries"),
        Engine.SGLANG: (D, "sglang:cached_tokens_total / sglang:prompt_tokens_total"),
        Engine.LLAMACPP: (D, "prompt_tokens_cached / (prompt_tokens + prompt_tokens_cached)"),
        Engine.OLLAMA: (X, NO_METRICS),
    }),
    Signal("prefill / decode seconds and shares", (
        ce.ENGINE_PREFILL_SECONDS.name, ce.ENGINE_DECODE_SECONDS.name, ce.ENGINE_PREFILL_SHARE.name,
        ce.ENGINE_DECODE_SHARE.name,
    ), {
        Engine.VLLM: (M, "vllm:request_prefill_time_seconds_sum, vllm:request_decode_time_seconds_sum"),
        Engine.SGLANG: (X, "SGLang exports no per-phase time sums"),
        Engine.LLAMACPP: (M, "llamacpp:prompt_seconds_total, llamacpp:tokens_predicted_seconds_total"),
        Engine.OLLAMA: (X, NO_METRICS + "; per request from its final message instead"),
    }),
    Signal("generated tokens, tokens per joule", (ce.ENGINE_GENERATION_TOKENS.name,), {
        Engine.VLLM: (M, "vllm:generation_tokens_total"),
        Engine.SGLANG: (M, "sglang:generation_tokens_total"),
        Engine.LLAMACPP: (M, "llamacpp:tokens_predicted_total"),
        Engine.OLLAMA: (X, NO_METRICS + "; inferwatch_completion_tokens_total (eval_count) instead"),
    }),
    Signal("batch size in tokens per step", (ce.ENGINE_STEP_TOKENS.name,), {
        Engine.VLLM: (M, "vllm:iteration_tokens_total"),
        Engine.SGLANG: (X, "no per-step token histogram"),
        Engine.LLAMACPP: (X, "no per-step token histogram"),
        Engine.OLLAMA: (X, NO_METRICS),
    }),
    Signal("queue by reason, engine's own admission rejections", (
        ce.ENGINE_WAITING_BY_REASON.name, ce.ENGINE_ADMISSION_REJECTIONS.name,
    ), {
        Engine.VLLM: (M, "vllm:num_requests_waiting_by_reason, vllm:admission_rejections_total (0.32+)"),
        Engine.SGLANG: (X, "not exported"),
        Engine.LLAMACPP: (X, "not exported"),
        Engine.OLLAMA: (X, NO_METRICS),
    }),
    Signal("per-request engine phases joined to the trace", (
        cr.ENGINE_PREFILL_SECONDS.name, cr.ENGINE_DECODE_SECONDS.name,
    ), {
        Engine.VLLM: (M, "the stat-logger plugin: queue, prefill, decode, preemptions, cached tokens"),
        Engine.SGLANG: (X, "its answers carry no timings"),
        Engine.LLAMACPP: (M, "each answer's timings: prompt_ms, predicted_ms, cache_n"),
        Engine.OLLAMA: (M, "the final message: load, prompt_eval, eval and total durations (ns)"),
    }),
    Signal("engine generation (inferwatch_engine_info)", (ce.ENGINE_INFO.name,), {
        Engine.VLLM: (M, "v0, v1 or v1_engine from the families present"),
        Engine.SGLANG: (M, "generation sglang"),
        Engine.LLAMACPP: (M, "generation llamacpp"),
        Engine.OLLAMA: (X, NO_METRICS + "; inferwatch_upstream_engine names it"),
    }),
    Signal("KV offloading (V1's swap)", (
        ce.KV_SWAP_BYTES.name, ce.KV_SWAP_SECONDS.name, ce.KV_SWAP_CPU_USAGE.name, ce.KV_SWAP_ALLOCATION_FAILURES.name,
    ), {
        Engine.VLLM: (M, "vllm:kv_offload_* with the OffloadingConnector"),
        Engine.SGLANG: (X, "its hierarchical cache has other counters, not read"),
        Engine.LLAMACPP: (X, "no KV offload counters"),
        Engine.OLLAMA: (X, NO_METRICS),
    }),
    Signal("scrape of the engine's /metrics", tuple(spec.name for spec in ce.SCRAPE_HEALTH), {
        Engine.VLLM: (M, "the sidecar's scrape"),
        Engine.SGLANG: (M, "the sidecar's scrape (--enable-metrics)"),
        Engine.LLAMACPP: (M, "the sidecar's scrape (--metrics)"),
        Engine.OLLAMA: (X, NO_METRICS + ": nothing to scrape; inferwatch_ollama_poll_up instead"),
    }),
    Signal("stat-logger plugin's joins and health", (
        cr.ENGINE_STATS_JOINS.name, cr.ENGINE_STATS_RECORDS.name, cr.ENGINE_STATS_PLUGIN_UP.name,
        cr.ENGINE_STATS_PLUGIN_DROPPED.name,
    ), {
        Engine.VLLM: (M, "inferwatch's plugin inside vLLM"),
        Engine.SGLANG: (X, "the plugin is vLLM's"),
        Engine.LLAMACPP: (X, "the plugin is vLLM's; the numbers come in each answer instead"),
        Engine.OLLAMA: (X, "the plugin is vLLM's; the numbers come in each answer instead"),
    }),
    Signal("engine busy seconds (GPU-seconds with basis=engine)", (cu.ENGINE_BUSY_SECONDS.name,), {
        Engine.VLLM: (M, "the stat-logger plugin's step states"),
        Engine.SGLANG: (X, "the plugin is vLLM's"),
        Engine.LLAMACPP: (X, "the plugin is vLLM's"),
        Engine.OLLAMA: (X, "the plugin is vLLM's"),
    }),
    Signal("tokenizer fingerprint", (cc.UPSTREAM_TOKENIZER.name, cc.UPSTREAM_TOKENIZER_CHANGES.name), {
        Engine.VLLM: (M, "vLLM's /tokenize over the probe texts"),
        Engine.SGLANG: (X, "the probe speaks vLLM's /tokenize"),
        Engine.LLAMACPP: (X, "its /tokenize takes another request shape"),
        Engine.OLLAMA: (X, "Ollama has no /tokenize"),
    }),
    Signal("models pulled and loaded, with their memory", (
        OLLAMA_MODELS.name, OLLAMA_MODEL_SIZE.name, OLLAMA_LOADED_BYTES.name, OLLAMA_LOADED_VRAM_BYTES.name,
        OLLAMA_LOADED_EXPIRES.name, OLLAMA_POLL_UP.name,
    ), {
        Engine.VLLM: (X, "one model per server: the KV-cache rows instead"),
        Engine.SGLANG: (X, "one model per server"),
        Engine.LLAMACPP: (X, "one model per server"),
        Engine.OLLAMA: (M, "/api/tags and /api/ps, polled every scrape.interval_s"),
    }),
    Signal("readiness", (cr.UPSTREAM_READY.name,), {
        Engine.VLLM: (M, "GET /health"),
        Engine.SGLANG: (M, "GET /health"),
        Engine.LLAMACPP: (M, "GET /health (503 while the model loads)"),
        Engine.OLLAMA: (M, "GET / (Ollama is running)"),
    }),
    Signal("per-request engine queue, preemptions", (
        cr.ENGINE_QUEUE_SECONDS.name, cr.ENGINE_PREEMPTIONS_PER_REQUEST.name,
    ), {
        Engine.VLLM: (M, "the stat-logger plugin"),
        Engine.SGLANG: (X, "its answers carry no timings"),
        Engine.LLAMACPP: (X, "timings have no queue time"),
        Engine.OLLAMA: (X, "the final message has no queue time"),
    }),
)


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_total")


def families_in(expr: str) -> set[str]:
    """The family names a PromQL expression may read: each identifier, and each with a sample suffix taken off
    (``_bucket``, ``_sum``, ``_count``, ``_total``), so that it matches the catalog's family names."""
    names = set()
    for word in _NAME.findall(expr):
        names.add(word)
        names.update(word.removesuffix(suffix) for suffix in _SAMPLE_SUFFIXES if word.endswith(suffix))
    return names


def missing_on(names: Iterable[str]) -> dict[Engine, str]:
    """The engines that feed none of some of ``names`` (family names), each with the reasons, joined."""
    wanted = set(names)
    out: dict[Engine, str] = {}
    for signal in SIGNALS:
        if wanted & set(signal.series):
            out = merged(out, signal.missing())
    return out


def merged(*missing: dict[Engine, str]) -> dict[Engine, str]:
    """Engines without data from several reads together, their reasons joined once each."""
    reasons: dict[Engine, list[str]] = {}
    for part in missing:
        for engine, text in part.items():
            known = reasons.setdefault(engine, [])
            known += [reason for reason in text.split("; ") if reason not in known]
    return {engine: "; ".join(texts) for engine, texts in reasons.items()}


def described(missing: dict[Engine, str]) -> str:
    """``llama.cpp (why), Ollama (why)``: the engines, by name, each with why; ``""`` for none."""
    return ", ".join(f"{ENGINE_NAMES[engine]} ({why})" for engine, why in sorted(missing.items()))


def missing_note(names: Iterable[str]) -> str:
    """One sentence naming the engines on which a panel reading ``names`` stays empty, or ``""``."""
    engines = described(missing_on(names))
    return f"No data on {engines}." if engines else ""


SPECS: tuple[MetricSpec, ...] = (
    UPSTREAM_ENGINE, OLLAMA_MODELS, OLLAMA_MODEL_SIZE, OLLAMA_LOADED_BYTES, OLLAMA_LOADED_VRAM_BYTES,
    OLLAMA_LOADED_EXPIRES, OLLAMA_POLL_UP, REQUEST_ENGINE_LOAD_SECONDS,
)

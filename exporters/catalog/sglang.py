"""Families SGLang exposes on its ``/metrics`` (``--enable-metrics``) that the engine view reads.

SGLang 0.5.23 (``sglang/srt/observability/metrics_collector.py``; shared/reference/engines.md §2): the
scheduler's gauges carry ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank`` (and
``dp_rank`` with data parallelism), the tokenizer's counters ``model_name``, ``engine_type`` and, on some,
``is_streaming`` or ``cache_source``. Only these are read. Its TTFT, inter-token, e2e and queue-time histograms
and speculative acceptance are not: the sidecar measures TTFT, gaps and e2e itself in front of every engine.
"""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType, Source

PREFIX = "sglang:"
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
G, C = MetricType.GAUGE, MetricType.COUNTER


def _sglang(name: str, type_: MetricType, help_: str, labels: tuple[str, ...], unit: str = "") -> MetricSpec:
    return MetricSpec(name, type_, help_, labels, unit, None, Source.SGLANG)


NUM_RUNNING_REQS = _sglang("sglang:num_running_reqs", G, "Requests in the running batch.", SCHEDULER_LABELS,
                           "requests")
NUM_QUEUE_REQS = _sglang("sglang:num_queue_reqs", G, "Requests waiting in the scheduler's queue.",
                         SCHEDULER_LABELS, "requests")
TOKEN_USAGE = _sglang(
    "sglang:token_usage", G, "Fraction (0-1) of the KV pool in use: max of the full, SWA and Mamba pools' "
    "used / total, where used excludes evictable radix-cache tokens.", SCHEDULER_LABELS, "ratio",
)
NUM_RETRACTED_REQUESTS = _sglang(
    "sglang:num_retracted_requests_total", C,
    "Requests retracted from the running batch to free KV memory (SGLang's preemption; recomputed later).",
    SCHEDULER_LABELS, "requests",
)
PROMPT_TOKENS = _sglang("sglang:prompt_tokens_total", C, "Prompt tokens of finished requests (cached included).",
                        (*TOKENIZER_LABELS, "is_streaming"), "tokens")
GENERATION_TOKENS = _sglang("sglang:generation_tokens_total", C, "Generated tokens of finished requests.",
                            (*TOKENIZER_LABELS, "is_streaming"), "tokens")
CACHED_TOKENS = _sglang("sglang:cached_tokens_total", C, "Prompt tokens served from the prefix cache, by source.",
                        (*TOKENIZER_LABELS, "cache_source"), "tokens")

SPECS: tuple[MetricSpec, ...] = (
    NUM_RUNNING_REQS, NUM_QUEUE_REQS, TOKEN_USAGE, NUM_RETRACTED_REQUESTS, PROMPT_TOKENS, GENERATION_TOKENS,
    CACHED_TOKENS,
)

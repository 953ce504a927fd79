"""Usage and cost by tenant: the showback families (issue 31), and the per-tenant latency histogram.

Labels are bounded: ``tenant`` holds at most ``serve.max_tenants`` names plus ``other`` and
``unknown`` (exporters/tenants.py), ``pool`` three values, ``outcome`` six. At the cap, per model:
66 tenants x 3 pools x 6 outcomes = 1,188 series per counter family, where all of them carry
traffic; the latency histogram is 66 tenants x 13 samples (10 bounds, +Inf, sum, count) = 858 series.
"""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType, Source

USAGE_LABELS = ("tenant", "model_name", "pool", "outcome")
TENANT_LATENCY_BUCKETS = (0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)
"""Bounds of vLLM's own request-latency buckets; the per-tenant latency SLO's threshold
(rules.slo_latency_threshold_s, 10 s by default) must be one of them."""

USAGE_REQUESTS = MetricSpec(
    "inferwatch_usage_requests", MetricType.COUNTER,
    "Inference requests by tenant, model, cost pool (base, long_context, special) and outcome.", USAGE_LABELS,
)
USAGE_PROMPT_TOKENS = MetricSpec(
    "inferwatch_usage_prompt_tokens", MetricType.COUNTER,
    "Prompt tokens (the upstream's usage block) by tenant, model, cost pool and outcome.", USAGE_LABELS, "tokens",
)
USAGE_COMPLETION_TOKENS = MetricSpec(
    "inferwatch_usage_completion_tokens", MetricType.COUNTER,
    "Completion tokens (the upstream's usage block) by tenant, model, cost pool and outcome.", USAGE_LABELS,
    "tokens",
)
USAGE_CACHED_PROMPT_TOKENS = MetricSpec(
    "inferwatch_usage_cached_prompt_tokens", MetricType.COUNTER,
    "Prompt tokens vLLM took from its prefix cache (stat-logger plugin) by tenant, model, cost pool and outcome.",
    USAGE_LABELS, "tokens",
)
USAGE_GPU_SECONDS = MetricSpec(
    "inferwatch_usage_gpu_seconds", MetricType.COUNTER,
    "GPU-seconds by tenant, model, cost pool, outcome and basis: engine = prefill time plus decode time shared "
    "with the running batch (stat-logger plugin); token_estimate = prompt and completion tokens over the "
    "[cost] rates (no plugin).", (*USAGE_LABELS, "basis"), "seconds",
)
USAGE_COST = MetricSpec(
    "inferwatch_usage_cost", MetricType.COUNTER,
    "Cost (cost.currency) by tenant, model, cost pool and outcome: GPU-seconds at cost.gpu_hour_prices plus "
    "tokens at cost.million_token_prices, times the pool's factor.", USAGE_LABELS,
)
USAGE_PREFIX_CACHE_SAVED_COST = MetricSpec(
    "inferwatch_usage_prefix_cache_saved_cost", MetricType.COUNTER,
    "What the prefix cache saved (cost.currency): cached prompt tokens at the request's prefill cost per token.",
    USAGE_LABELS,
)
USAGE_REPEAT_REQUESTS = MetricSpec(
    "inferwatch_usage_repeat_requests", MetricType.COUNTER,
    "Requests whose prompt was answered within cost.repeat_ttl_s before (an answer cache's hits), by tenant, "
    "model, cost pool and outcome.", USAGE_LABELS,
)
USAGE_REPEAT_SAVED_TOKENS = MetricSpec(
    "inferwatch_usage_repeat_saved_tokens", MetricType.COUNTER,
    "Prompt and completion tokens of the repeat requests: what an answer cache with cost.repeat_ttl_s would have "
    "saved.", ("tenant", "model_name", "pool", "kind"), "tokens",
)
USAGE_REPEAT_FORGOTTEN = MetricSpec(
    "inferwatch_usage_repeat_forgotten", MetricType.COUNTER,
    "Prompt hashes forgotten before cost.repeat_ttl_s because cost.repeat_max_entries were held: repeats of them "
    "were missed (the repeat figures' undercount bound).",
)
TENANT_LATENCY_SECONDS = MetricSpec(
    "inferwatch_tenant_request_latency_seconds", MetricType.HISTOGRAM,
    "End-to-end seconds of inference requests by tenant and model (the per-tenant latency SLO).",
    ("tenant", "model_name"), "seconds", TENANT_LATENCY_BUCKETS,
)
ENGINE_BUSY_SECONDS = MetricSpec(
    "inferwatch_engine_busy_seconds", MetricType.COUNTER,
    "Seconds vLLM ran at least one request, from the stat-logger plugin's step states: what GPU-seconds with "
    "basis=engine add up to.", (), "seconds",
)

TENANT_SLO_LABELS = ("tenant", "model_name", "slo")
TENANT_SLO_EVENTS = MetricSpec(
    "inferwatch:tenant_slo_events:sum", MetricType.GAUGE,
    "Every event a per-tenant SLO counts (a sum of counters), per tenant, model and slo.", TENANT_SLO_LABELS,
    source=Source.RECORDING,
)
TENANT_SLO_BAD_EVENTS = MetricSpec(
    "inferwatch:tenant_slo_bad_events:sum", MetricType.GAUGE,
    "The events that miss a per-tenant SLO (a sum of counters), per tenant, model and slo.", TENANT_SLO_LABELS,
    source=Source.RECORDING,
)


def tenant_slo_error_ratio(window: str) -> str:
    """Name of the recorded per-tenant SLO error ratio over ``window`` (a Prometheus duration such as ``3d``)."""
    return f"inferwatch:tenant_slo_error:ratio_rate{window}"


def tenant_slo_events_increase(window: str) -> str:
    """Name of the recorded count of a per-tenant SLO's events over ``window``."""
    return f"inferwatch:tenant_slo_events:increase{window}"


SPECS = (
    USAGE_REQUESTS, USAGE_PROMPT_TOKENS, USAGE_COMPLETION_TOKENS, USAGE_CACHED_PROMPT_TOKENS, USAGE_GPU_SECONDS,
    USAGE_COST, USAGE_PREFIX_CACHE_SAVED_COST, USAGE_REPEAT_REQUESTS, USAGE_REPEAT_SAVED_TOKENS,
    USAGE_REPEAT_FORGOTTEN, TENANT_LATENCY_SECONDS, ENGINE_BUSY_SECONDS, TENANT_SLO_EVENTS, TENANT_SLO_BAD_EVENTS,
)

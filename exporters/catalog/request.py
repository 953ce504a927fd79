"""The sidecar's per-request families, observed by the proxy for every request."""

from __future__ import annotations

from exporters import buckets
from exporters.catalog.spec import MetricSpec, MetricType

OLLAMA_ROUTES = ("/api/generate", "/api/chat")
"""Ollama's native generation routes (NDJSON streams), proxied and measured like the OpenAI ones."""
INFERENCE_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", *OLLAMA_ROUTES)
"""``route`` values of the requests that run the model: the requests the SLOs count."""
ROUTES = (*INFERENCE_ROUTES, "/v1/models")
"""Every ``route`` value but ``other`` (any other path under ``/v1`` or ``/api``)."""
GENERATION_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", *OLLAMA_ROUTES})
"""The routes whose requests generate tokens (a time to first token, vLLM's engine phases)."""

REQUEST_LABELS = ("model_name", "route", "outcome", "length_bucket", "lane", "role")
LATENCY_LABELS = ("model_name", "route", "length_bucket", "lane", "role")
"""``lane`` (``default``/``long``) and ``role`` (``primary``/``canary``): which upstream served the request
(exporters/catalog/upstreams.py). Each takes its second value only where serve.long_prompt_upstream or
serve.canary_upstream is set, so without them the series are as many as without the two labels."""

REQUESTS = MetricSpec(
    "inferwatch_requests", MetricType.COUNTER,
    "Requests proxied, by model, route, outcome class (ok, client_error, upstream_error, timeout, "
    "cancelled, overloaded), prompt length bucket, lane and role.",
    REQUEST_LABELS,
)
REQUESTS_IN_FLIGHT = MetricSpec(
    "inferwatch_requests_in_flight", MetricType.GAUGE,
    "Requests currently being proxied.", ("model_name", "route"),
)
UPSTREAM_ACCEPT_SECONDS = MetricSpec(
    "inferwatch_upstream_accept_seconds", MetricType.HISTOGRAM,
    "Seconds from the request's arrival at the sidecar until the upstream answered with a status line.",
    LATENCY_LABELS, "seconds", buckets.TIME_TO_FIRST_TOKEN,
)
TIME_TO_FIRST_TOKEN_SECONDS = MetricSpec(
    "inferwatch_time_to_first_token_seconds", MetricType.HISTOGRAM,
    "Seconds from arrival until the first content chunk (streaming) or the whole body "
    "(non-streaming) came back. Exemplar: trace_id.",
    LATENCY_LABELS, "seconds", buckets.TIME_TO_FIRST_TOKEN,
)
INTER_TOKEN_LATENCY_SECONDS = MetricSpec(
    "inferwatch_inter_token_latency_seconds", MetricType.HISTOGRAM,
    "Seconds between consecutive content chunks of a streamed response. Exemplar: trace_id.",
    LATENCY_LABELS, "seconds", buckets.INTER_TOKEN_LATENCY,
)
E2E_LATENCY_SECONDS = MetricSpec(
    "inferwatch_e2e_request_latency_seconds", MetricType.HISTOGRAM,
    "Seconds from arrival until the last byte of the response was sent, every outcome included. "
    "Exemplar: trace_id.",
    REQUEST_LABELS, "seconds", buckets.REQUEST_LATENCY,
)
PROMPT_TOKENS = MetricSpec(
    "inferwatch_prompt_tokens", MetricType.COUNTER,
    "Prompt tokens reported by the upstream's usage block.", ("model_name", "route"),
)
COMPLETION_TOKENS = MetricSpec(
    "inferwatch_completion_tokens", MetricType.COUNTER,
    "Completion tokens reported by the upstream's usage block.", ("model_name", "route"),
)
REQUEST_PROMPT_TOKENS = MetricSpec(
    "inferwatch_request_prompt_tokens", MetricType.HISTOGRAM,
    "Prompt tokens per finished request.", ("model_name", "route"), "tokens", buckets.REQUEST_TOKENS,
)
REQUEST_COMPLETION_TOKENS = MetricSpec(
    "inferwatch_request_completion_tokens", MetricType.HISTOGRAM,
    "Completion tokens per finished request.", ("model_name", "route"), "tokens", buckets.REQUEST_TOKENS,
)
FINISH_REASONS = MetricSpec(
    "inferwatch_finish_reasons", MetricType.COUNTER,
    "Finished choices by finish_reason (stop, length, abort, ...).", ("model_name", "finish_reason"),
)
PREFILL_SHARE_RATIO = MetricSpec(
    "inferwatch_request_prefill_share_ratio", MetricType.HISTOGRAM,
    "Per streamed request, the share of end-to-end time before the first token: ttft / e2e.",
    ("model_name",), "ratio", (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
)
UPSTREAM_READY = MetricSpec(
    "inferwatch_upstream_ready", MetricType.GAUGE,
    "1 when the last readiness probe of the upstream (GET /health) returned 200, else 0.", ("upstream",),
)

REQUESTS_NORMALIZED = MetricSpec(
    "inferwatch_requests_normalized", MetricType.COUNTER,
    "Requests whose prompt or message text changed under Unicode NFC normalization (serve.normalize_unicode).",
    (),
)

# ---- vLLM's own per-request numbers, from the stat-logger plugin (serve.engine_stats_listen)

ENGINE_LABELS = ("model_name", "length_bucket", "outcome")

ENGINE_QUEUE_SECONDS = MetricSpec(
    "inferwatch_request_engine_queue_seconds", MetricType.HISTOGRAM,
    "Seconds a request waited in vLLM's scheduler queue before it was first scheduled (vLLM's queued_time, "
    "from the stat-logger plugin), by model, prompt length bucket and outcome.",
    ENGINE_LABELS, "seconds", buckets.TIME_TO_FIRST_TOKEN,
)
ENGINE_PREFILL_SECONDS = MetricSpec(
    "inferwatch_request_engine_prefill_seconds", MetricType.HISTOGRAM,
    "Seconds from a request's first scheduling to its first token in vLLM (prefill_time, preemptions during "
    "prefill included), from the stat-logger plugin.",
    ENGINE_LABELS, "seconds", buckets.TIME_TO_FIRST_TOKEN,
)
ENGINE_DECODE_SECONDS = MetricSpec(
    "inferwatch_request_engine_decode_seconds", MetricType.HISTOGRAM,
    "Seconds from a request's first token to its last in vLLM (decode_time, preemptions during decode "
    "included), from the stat-logger plugin.",
    ENGINE_LABELS, "seconds", buckets.REQUEST_LATENCY,
)
ENGINE_PREEMPTIONS_PER_REQUEST = MetricSpec(
    "inferwatch_request_engine_preemptions", MetricType.HISTOGRAM,
    "Times vLLM preempted a request before it finished (num_preemptions), from the stat-logger plugin.",
    ENGINE_LABELS, "preemptions", (0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0),
)
ENGINE_CACHED_PROMPT_RATIO = MetricSpec(
    "inferwatch_request_engine_cached_prompt_ratio", MetricType.HISTOGRAM,
    "Share of a request's prompt tokens served from vLLM's prefix cache: num_cached_tokens / num_prompt_tokens, "
    "from the stat-logger plugin.",
    ENGINE_LABELS, "ratio", (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0),
)
ENGINE_STATS_RECORDS = MetricSpec(
    "inferwatch_engine_stats_records", MetricType.COUNTER,
    "Records received from vLLM's stat-logger plugin, by kind: request (a finished request), step (the "
    "scheduler's state), invalid (a datagram that was not the plugin's format).",
    ("kind",),
)
ENGINE_STATS_JOINS = MetricSpec(
    "inferwatch_engine_stats_joins", MetricType.COUNTER,
    "Successful generation requests whose engine numbers were joined to them (joined) or had not arrived "
    "within serve.engine_stats_wait_ms (missed).",
    ("result",),
)
ENGINE_STATS_PLUGIN_UP = MetricSpec(
    "inferwatch_engine_stats_plugin_up", MetricType.GAUGE,
    "1 while vLLM's stat-logger plugin is heard on serve.engine_stats_listen (a datagram in the last 30 s: it "
    "sends at least every 0.1 s while vLLM steps and every 10 s while it idles), 0 while it is silent (not "
    "installed, INFERWATCH_ENGINE_STATS naming another address, vLLM down). While 0 the plugin's families are "
    "absent, not 0, and the KV in-flight blocks and fragmentation are the sidecar's estimate.",
)
ENGINE_STATS_PLUGIN_DROPPED = MetricSpec(
    "inferwatch_engine_stats_plugin_dropped", MetricType.GAUGE,
    "Datagrams the stat-logger plugin could not send since vLLM started, as it last reported (it never blocks "
    "vLLM's loop: a full socket buffer or a refused destination drops). Absent while the plugin is silent.",
)
ENGINE_PLUGIN_KV_CACHE_USAGE = MetricSpec(
    "inferwatch_engine_plugin_kv_cache_usage_ratio", MetricType.GAUGE,
    "vLLM's KV-cache usage after its latest step, exactly as its scheduler reports it (from the plugin). "
    "Absent while the plugin is silent.",
    unit="ratio",
)
ENGINE_PLUGIN_REQUESTS = MetricSpec(
    "inferwatch_engine_plugin_requests", MetricType.GAUGE,
    "Requests in vLLM's scheduler after its latest step, by state: running, waiting (for capacity), deferred "
    "(waiting on a transient constraint), from the plugin. Absent while the plugin is silent.",
    ("state",),
)
ENGINE_SPECS: tuple[MetricSpec, ...] = (
    ENGINE_QUEUE_SECONDS, ENGINE_PREFILL_SECONDS, ENGINE_DECODE_SECONDS, ENGINE_PREEMPTIONS_PER_REQUEST,
    ENGINE_CACHED_PROMPT_RATIO, ENGINE_STATS_RECORDS, ENGINE_STATS_JOINS, ENGINE_STATS_PLUGIN_UP,
    ENGINE_STATS_PLUGIN_DROPPED,
    ENGINE_PLUGIN_KV_CACHE_USAGE, ENGINE_PLUGIN_REQUESTS,
)

WORKER_RECORDS = MetricSpec(
    "inferwatch_worker_records", MetricType.COUNTER,
    "Request records the primary process received from each other process of `serve --workers N` (its own "
    "requests are not counted here); every request is in the request families whichever process served it.",
    ("worker",),
)

FAST_RETRIES = MetricSpec(
    "inferwatch_fast_retries", MetricType.COUNTER,
    "Requests the same client (serve.client_header or User-Agent, and tenant) sent again to the same route with the "
    "same body within serve.fast_retry_window_ms of the end of the previous one: retries without "
    "backoff, which "
    "pile onto an engine that is already failing. Counted when the repeat ends, by model.",
    ("model_name",),
)

SPECS: tuple[MetricSpec, ...] = (
    FAST_RETRIES, REQUESTS, REQUESTS_IN_FLIGHT, UPSTREAM_ACCEPT_SECONDS, TIME_TO_FIRST_TOKEN_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS, E2E_LATENCY_SECONDS, PROMPT_TOKENS, COMPLETION_TOKENS,
    REQUEST_PROMPT_TOKENS, REQUEST_COMPLETION_TOKENS, FINISH_REASONS, PREFILL_SHARE_RATIO,
    UPSTREAM_READY, REQUESTS_NORMALIZED, WORKER_RECORDS, *ENGINE_SPECS,
)

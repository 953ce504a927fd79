"""The sidecar's per-request families, observed by the proxy for every request."""

from __future__ import annotations

from exporters import buckets
from exporters.catalog.spec import MetricSpec, MetricType

REQUEST_LABELS = ("model_name", "route", "outcome", "length_bucket")
LATENCY_LABELS = ("model_name", "route", "length_bucket")

REQUESTS = MetricSpec(
    "inferwatch_requests", MetricType.COUNTER,
    "Requests proxied, by model, route, outcome class (ok, client_error, upstream_error, timeout, "
    "cancelled, overloaded) and prompt length bucket.",
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
    ("model_name", "route", "outcome", "length_bucket"), "seconds", buckets.REQUEST_LATENCY,
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

SPECS: tuple[MetricSpec, ...] = (
    REQUESTS, REQUESTS_IN_FLIGHT, UPSTREAM_ACCEPT_SECONDS, TIME_TO_FIRST_TOKEN_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS, E2E_LATENCY_SECONDS, PROMPT_TOKENS, COMPLETION_TOKENS,
    REQUEST_PROMPT_TOKENS, REQUEST_COMPLETION_TOKENS, FINISH_REASONS, PREFILL_SHARE_RATIO,
    UPSTREAM_READY, REQUESTS_NORMALIZED,
)

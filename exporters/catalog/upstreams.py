"""Families of the upstream choice: the long-prompt lane, priority classes and shadow traffic.

The request families (``request``) carry ``lane`` and ``role`` themselves; what is here is counted
apart, in bounded families of its own, so the request histograms gain no other label.
"""

from __future__ import annotations

from exporters import buckets
from exporters.catalog.spec import MetricSpec, MetricType

LANES = ("default", "long")
"""``lane`` values: ``long`` for requests sent to serve.long_prompt_upstream."""
ROLES = ("primary", "canary")
"""``role`` values: ``canary`` for requests sent to serve.canary_upstream."""
PRIORITY_CLASSES = ("high", "default", "low")
"""``priority_class`` values: the priority header above 0, 0 (or none), below 0."""
SHADOW_RESULTS = ("match", "mismatch", "not_compared")
"""``result`` of a shadowed request both upstreams answered."""
SHADOW_DROP_REASONS = ("full", "slow", "down")
"""Why a shadow copy was dropped: serve.shadow_max_inflight reached, past serve.shadow_timeout_s, no answer."""

LONG_LANE_FALLBACKS = MetricSpec(
    "inferwatch_long_lane_fallbacks", MetricType.COUNTER,
    "Long prompts the long lane did not take, by model, reason (not_ready: its last readiness probe failed; "
    "unreachable: it refused the connection) and what they got instead (serve.long_prompt_fallback: main or "
    "refuse).",
    ("model_name", "reason", "fallback"),
)
PROMPT_ESTIMATE_RATIO = MetricSpec(
    "inferwatch_prompt_estimate_to_usage_ratio", MetricType.HISTOGRAM,
    "Per finished request with an estimated prompt size (what chooses its lane, and the live token counts): "
    "estimate / usage, the usage being the prompt_tokens the upstream returned. 1 is exact; below 1 the "
    "estimate was short (a long prompt could have stayed in the default lane), above 1 long.",
    ("model_name", "lane"), "ratio", (0.5, 0.75, 0.9, 0.95, 0.99, 1.0, 1.01, 1.05, 1.1, 1.25, 1.5, 2.0),
)
PRIORITY_TTFT_SECONDS = MetricSpec(
    "inferwatch_priority_time_to_first_token_seconds", MetricType.HISTOGRAM,
    "Time to first token by priority class (serve.pass_priority), as inferwatch_time_to_first_token_seconds.",
    ("model_name", "priority_class"), "seconds", buckets.TIME_TO_FIRST_TOKEN,
)
PRIORITY_E2E_SECONDS = MetricSpec(
    "inferwatch_priority_e2e_request_latency_seconds", MetricType.HISTOGRAM,
    "End-to-end latency by priority class (serve.pass_priority), as inferwatch_e2e_request_latency_seconds.",
    ("model_name", "priority_class"), "seconds", buckets.REQUEST_LATENCY,
)
PRIORITY_ENGINE_QUEUE_SECONDS = MetricSpec(
    "inferwatch_priority_engine_queue_seconds", MetricType.HISTOGRAM,
    "vLLM's own queue time (the stat-logger plugin's queued_time) by priority class (serve.pass_priority).",
    ("model_name", "priority_class"), "seconds", buckets.TIME_TO_FIRST_TOKEN,
)
SHADOW_REQUESTS = MetricSpec(
    "inferwatch_shadow_requests", MetricType.COUNTER,
    "Shadowed requests both upstreams answered, by model and result: match (same output), mismatch, "
    "not_compared (a side without text: an error answer).",
    ("model_name", "result"),
)
SHADOW_DROPPED = MetricSpec(
    "inferwatch_shadow_dropped", MetricType.COUNTER,
    "Shadow copies dropped, by model and reason: full (serve.shadow_max_inflight copies in flight), slow "
    "(past serve.shadow_timeout_s), down (no answer: refused, reset).",
    ("model_name", "reason"),
)
SHADOW_OUTCOMES = MetricSpec(
    "inferwatch_shadow_outcomes", MetricType.COUNTER,
    "Outcomes of the shadowed requests on each side (primary: what the client got; shadow: its copy), by model.",
    ("model_name", "side", "outcome"),
)
SHADOW_TTFT_SECONDS = MetricSpec(
    "inferwatch_shadow_time_to_first_token_seconds", MetricType.HISTOGRAM,
    "Time to first token of the shadowed requests on each side (primary, shadow), by model.",
    ("model_name", "side"), "seconds", buckets.TIME_TO_FIRST_TOKEN,
)
SHADOW_E2E_SECONDS = MetricSpec(
    "inferwatch_shadow_e2e_request_latency_seconds", MetricType.HISTOGRAM,
    "End-to-end latency of the shadowed requests on each side (primary, shadow), by model.",
    ("model_name", "side"), "seconds", buckets.REQUEST_LATENCY,
)
SHADOW_OUTPUT_DISTANCE_RATIO = MetricSpec(
    "inferwatch_shadow_output_distance_ratio", MetricType.HISTOGRAM,
    "Per compared shadowed request, the normalised edit distance between the two outputs' whitespace tokens "
    "(0 the same, 1 nothing in common).",
    ("model_name",), "ratio", (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0),
)
SHADOW_IN_FLIGHT = MetricSpec(
    "inferwatch_shadow_in_flight", MetricType.GAUGE,
    "Shadow copies in flight now (at most serve.shadow_max_inflight).",
)

SPECS: tuple[MetricSpec, ...] = (
    LONG_LANE_FALLBACKS, PROMPT_ESTIMATE_RATIO, PRIORITY_TTFT_SECONDS, PRIORITY_E2E_SECONDS,
    PRIORITY_ENGINE_QUEUE_SECONDS, SHADOW_REQUESTS, SHADOW_DROPPED, SHADOW_OUTCOMES, SHADOW_TTFT_SECONDS,
    SHADOW_E2E_SECONDS, SHADOW_OUTPUT_DISTANCE_RATIO, SHADOW_IN_FLIGHT,
)

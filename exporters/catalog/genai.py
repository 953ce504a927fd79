"""OpenTelemetry's GenAI model-server histograms under Prometheus' names (``serve.genai_metrics``, off by default).

The conventions name them ``gen_ai.server.request.duration``, ``gen_ai.server.time_to_first_token``
and ``gen_ai.server.time_per_output_token`` (unit ``s``); Prometheus' translation of OTLP names
(dots to underscores, the unit as a suffix) gives the names below, and attributes become labels
the same way, so dashboards made for the conventions find them. Buckets are the conventions'
advised boundaries. They repeat what the ``inferwatch_`` families measure, with the conventions'
labels instead of ours (no length bucket or outcome class).
"""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType

GENAI_LABELS = (
    "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model",
    "server_address", "server_port",
)

SERVER_REQUEST_DURATION = MetricSpec(
    "gen_ai_server_request_duration_seconds", MetricType.HISTOGRAM,
    "gen_ai.server.request.duration: seconds from the request's arrival to the last byte of the answer, "
    "every outcome; error_type is set on failures (empty otherwise).",
    (*GENAI_LABELS, "error_type"), "seconds",
    (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
)
SERVER_TIME_TO_FIRST_TOKEN = MetricSpec(
    "gen_ai_server_time_to_first_token_seconds", MetricType.HISTOGRAM,
    "gen_ai.server.time_to_first_token: seconds from arrival to the first content chunk of a successful "
    "streamed response (a non-streamed answer has no first token to time).",
    GENAI_LABELS, "seconds",
    (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
)
SERVER_TIME_PER_OUTPUT_TOKEN = MetricSpec(
    "gen_ai_server_time_per_output_token_seconds", MetricType.HISTOGRAM,
    "gen_ai.server.time_per_output_token: (e2e - ttft) / (completion_tokens - 1) of a successful streamed "
    "response with at least two completion tokens (usage from the upstream).",
    GENAI_LABELS, "seconds",
    (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
)

SPECS: tuple[MetricSpec, ...] = (SERVER_REQUEST_DURATION, SERVER_TIME_TO_FIRST_TOKEN, SERVER_TIME_PER_OUTPUT_TOKEN)

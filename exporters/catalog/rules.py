"""The embedded rule engine's own families (``inferwatch_rule_`` prefix)."""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType

RULE_EVALUATION_SECONDS = MetricSpec(
    "inferwatch_rule_evaluation_seconds", MetricType.HISTOGRAM,
    "Seconds one ingest-and-evaluate cycle of the embedded rule engine took.", (), "seconds",
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
RULE_EVALUATION_FAILURES = MetricSpec(
    "inferwatch_rule_evaluation_failures", MetricType.COUNTER,
    "Rule evaluations that failed (a rule's expression errored, or the cycle itself raised).", (),
)
RULE_NOTIFICATIONS = MetricSpec(
    "inferwatch_rule_notifications", MetricType.COUNTER,
    "Alerts sent by the embedded engine, by target (alertmanager, webhook, stdout) and result (sent, failed).",
    ("target", "result"),
)
RULE_ALERTS = MetricSpec(
    "inferwatch_rule_alerts", MetricType.GAUGE,
    "Alerts the embedded engine holds, by state (pending, firing).", ("state",),
)
RULE_STORED_SERIES = MetricSpec(
    "inferwatch_rule_stored_series", MetricType.GAUGE,
    "Series held in the embedded engine's in-memory store.", (), "series",
)
RULE_DROPPED_SAMPLES = MetricSpec(
    "inferwatch_rule_dropped_samples", MetricType.COUNTER,
    "Samples the store refused, by reason (out_of_order, series_limit).", ("reason",),
)

SPECS: tuple[MetricSpec, ...] = (
    RULE_EVALUATION_SECONDS, RULE_EVALUATION_FAILURES, RULE_NOTIFICATIONS, RULE_ALERTS,
    RULE_STORED_SERIES, RULE_DROPPED_SAMPLES,
)

"""Series Prometheus itself writes (``up``, ``ALERTS``) or exposes on its own /metrics.

Dashboards read them; no rule uses them, since the embedded evaluator has no such series.
Their names are checked against a real Prometheus 2.42 exposition in the dashboard tests.
"""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType, Source

G, C = MetricType.GAUGE, MetricType.COUNTER

UP = MetricSpec("up", G, "1 when the last scrape of a target succeeded (synthesised by Prometheus).",
                ("job", "instance"), source=Source.PROMETHEUS)
ALERTS = MetricSpec("ALERTS", G, "One series per pending or firing alert, label alertstate (synthesised).",
                    ("alertname", "alertstate"), source=Source.PROMETHEUS)
RULE_GROUP_LAST_DURATION = MetricSpec(
    "prometheus_rule_group_last_duration_seconds", G, "Seconds the last evaluation of a rule group took.",
    ("rule_group",), "seconds", source=Source.PROMETHEUS,
)
RULE_EVALUATION_FAILURES = MetricSpec(
    "prometheus_rule_evaluation_failures", C, "Rule evaluations that failed.", ("rule_group",),
    source=Source.PROMETHEUS,
)
NOTIFICATIONS_SENT = MetricSpec(
    "prometheus_notifications_sent", C, "Alert notifications sent, per Alertmanager.", ("alertmanager",),
    source=Source.PROMETHEUS,
)
NOTIFICATIONS_ERRORS = MetricSpec(
    "prometheus_notifications_errors", C, "Alert notifications that failed to send, per Alertmanager.",
    ("alertmanager",), source=Source.PROMETHEUS,
)
NOTIFICATIONS_DROPPED = MetricSpec(
    "prometheus_notifications_dropped", C, "Alert notifications dropped (queue full or no Alertmanager).",
    source=Source.PROMETHEUS,
)

SYNTHETIC: tuple[MetricSpec, ...] = (UP, ALERTS)
"""Series Prometheus synthesises rather than exposes on its /metrics."""

SPECS: tuple[MetricSpec, ...] = (
    UP, ALERTS, RULE_GROUP_LAST_DURATION, RULE_EVALUATION_FAILURES, NOTIFICATIONS_SENT,
    NOTIFICATIONS_ERRORS, NOTIFICATIONS_DROPPED,
)

"""Series that Prometheus itself creates or exposes, which some panels read.

They are not inferwatch's or vLLM's families, so they are not in ``exporters.catalog``; they are
declared here, once, with their type so the lint's counter rule can check their use. Their names
are checked against a real Prometheus 2.42 exposition in the dashboard tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporters.catalog.spec import MetricType


@dataclass(frozen=True, slots=True)
class ExternalSeries:
    """One series name written by Prometheus, with its type."""

    name: str
    type: MetricType
    help: str
    synthetic: bool = False
    """True for series Prometheus synthesises (``up``, ``ALERTS``) rather than exposes on /metrics."""


UP = ExternalSeries("up", MetricType.GAUGE, "1 when the last scrape of a target succeeded.", synthetic=True)
ALERTS = ExternalSeries(
    "ALERTS", MetricType.GAUGE, "One series per pending or firing alert (label alertstate).", synthetic=True
)
RULE_GROUP_LAST_DURATION = ExternalSeries(
    "prometheus_rule_group_last_duration_seconds", MetricType.GAUGE,
    "Seconds the last evaluation of a rule group took.",
)
RULE_EVALUATION_FAILURES = ExternalSeries(
    "prometheus_rule_evaluation_failures_total", MetricType.COUNTER, "Rule evaluations that failed.",
)
NOTIFICATIONS_SENT = ExternalSeries(
    "prometheus_notifications_sent_total", MetricType.COUNTER, "Alert notifications sent, per Alertmanager.",
)
NOTIFICATIONS_ERRORS = ExternalSeries(
    "prometheus_notifications_errors_total", MetricType.COUNTER,
    "Alert notifications that failed to send, per Alertmanager.",
)
NOTIFICATIONS_DROPPED = ExternalSeries(
    "prometheus_notifications_dropped_total", MetricType.COUNTER,
    "Alert notifications dropped (queue full or no Alertmanager).",
)

SERIES: tuple[ExternalSeries, ...] = (
    UP, ALERTS, RULE_GROUP_LAST_DURATION, RULE_EVALUATION_FAILURES, NOTIFICATIONS_SENT,
    NOTIFICATIONS_ERRORS, NOTIFICATIONS_DROPPED,
)
BY_NAME: dict[str, ExternalSeries] = {s.name: s for s in SERIES}

__all__ = ["BY_NAME", "SERIES", "ExternalSeries"]

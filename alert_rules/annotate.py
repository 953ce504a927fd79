"""Post-passes applied to every alert after generation: shared labels, severity overrides, links."""

from __future__ import annotations

import dataclasses

from alert_rules.config import RulesConfig
from alert_rules.spec import AlertRule, RuleGroup, Severity
from exporters.catalog.engines import families_in, missing_engines


def runbook_url(config: RulesConfig, alert: AlertRule) -> str:
    """The runbook link of an alert, from the configured pattern."""
    return config.runbook_url_pattern.replace("{anchor}", alert.runbook_anchor)


ENGINES_ANNOTATION = "engines_without_data"
"""The annotation naming the engines whose upstream never feeds a series the alert reads (it cannot fire there)."""


def engines_without_data(alert: AlertRule) -> str:
    """One sentence naming the engines on which ``alert`` cannot fire, and why (exporters/catalog/engines.py);
    ``""`` when every engine feeds what it reads."""
    engines = missing_engines(families_in(alert.expr))
    return f"Cannot fire in front of {engines}: it reads what they do not export." if engines else ""


def annotate_alert(config: RulesConfig, alert: AlertRule) -> AlertRule:
    """Add the ``service`` label and ``runbook_url``, apply any configured severity override, and name the
    engines on which the alert cannot fire (``engines_without_data``)."""
    severity = Severity(config.severity_of(alert.name, str(alert.severity)))
    extra = {"runbook_url": runbook_url(config, alert)}
    gaps = engines_without_data(alert)
    if gaps:
        extra[ENGINES_ANNOTATION] = gaps
    return dataclasses.replace(
        alert,
        severity=severity,
        labels={**alert.labels, "service": config.service},
        annotations={**alert.annotations, **extra},
    )


def annotate(config: RulesConfig, groups: tuple[RuleGroup, ...]) -> tuple[RuleGroup, ...]:
    """Every group with its alerts annotated; recording rules are left as they are."""
    return tuple(
        dataclasses.replace(
            group,
            rules=tuple(annotate_alert(config, r) if isinstance(r, AlertRule) else r for r in group.rules),
        )
        for group in groups
    )


__all__ = ["ENGINES_ANNOTATION", "annotate", "annotate_alert", "engines_without_data", "runbook_url"]

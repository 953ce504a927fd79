"""Post-passes applied to every alert after generation: shared labels, severity overrides, links."""

from __future__ import annotations

import dataclasses

from alert_rules.config import RulesConfig
from alert_rules.spec import AlertRule, RuleGroup, Severity


def runbook_url(config: RulesConfig, alert: AlertRule) -> str:
    """The runbook link of an alert, from the configured pattern."""
    return config.runbook_url_pattern.replace("{anchor}", alert.runbook_anchor)


def annotate_alert(config: RulesConfig, alert: AlertRule) -> AlertRule:
    """Add the ``service`` label and ``runbook_url``, and apply any configured severity override."""
    severity = Severity(config.severity_of(alert.name, str(alert.severity)))
    return dataclasses.replace(
        alert,
        severity=severity,
        labels={**alert.labels, "service": config.service},
        annotations={**alert.annotations, "runbook_url": runbook_url(config, alert)},
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


__all__ = ["annotate", "annotate_alert", "runbook_url"]

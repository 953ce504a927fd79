"""Post-passes applied to every alert after generation: shared labels, severity overrides, links."""

from __future__ import annotations

import dataclasses

from alert_rules.config import RulesConfig
from alert_rules.promql import UnsupportedExpression, parse_expr
from alert_rules.promql.ast import Aggregate, Binary, Call, Negate, Node, RangeSelector, Selector, Subquery
from alert_rules.spec import AlertRule, RuleGroup, Severity
from exporters.catalog.engines import Engine, described, families_in, merged, missing_on


def runbook_url(config: RulesConfig, alert: AlertRule) -> str:
    """The runbook link of an alert, from the configured pattern."""
    return config.runbook_url_pattern.replace("{anchor}", alert.runbook_anchor)


ENGINES_ANNOTATION = "engines_without_data"
"""The annotation naming the engines whose upstream never feeds a series the alert reads (it cannot fire there)."""


def engines_unable(node: Node) -> dict[Engine, str]:
    """The engines in front of which an expression can have no result, each with why: those that do not feed a
    family it selects, except through the right side of ``unless``, one side only of ``or``, or ``absent()``
    (whose result needs nothing)."""
    match node:
        case Selector(name=name):
            return missing_on(families_in(name)) if name else {}
        case RangeSelector(selector=selector):
            return engines_unable(selector)
        case Subquery(expr=inner) | Negate(expr=inner) | Aggregate(expr=inner):
            return engines_unable(inner)
        case Call(func="absent" | "absent_over_time"):
            return {}
        case Call(args=args):
            return merged(*(engines_unable(arg) for arg in args))
        case Binary(op="unless", lhs=lhs):
            return engines_unable(lhs)
        case Binary(op="or", lhs=lhs, rhs=rhs):
            left, right = engines_unable(lhs), engines_unable(rhs)
            both = merged(left, right)
            return {engine: why for engine, why in both.items() if engine in left and engine in right}
        case Binary(lhs=lhs, rhs=rhs):
            return merged(engines_unable(lhs), engines_unable(rhs))
    return {}


def engines_without_data(alert: AlertRule) -> str:
    """One sentence naming the engines in front of which ``alert`` cannot fire, and why
    (exporters/catalog/engines.py, :func:`engines_unable`); ``""`` when it can fire in front of every engine."""
    try:
        unable = engines_unable(parse_expr(alert.expr))
    except UnsupportedExpression:
        unable = missing_on(families_in(alert.expr))  # outside the embedded subset: every family it names
    engines = described(unable)
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


__all__ = ["ENGINES_ANNOTATION", "annotate", "annotate_alert", "engines_unable", "engines_without_data", "runbook_url"]

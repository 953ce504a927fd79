"""promtool unit tests for every alert: each fires, and stays quiet, on both sides of ``for:``.

Each alert brings its scenario (``AlertRule.scenario``, see ``alert_rules.scenario``); this module
turns it into a promtool file that checks: absent (pending) one step before the alert may fire,
firing with its exact labels and annotations when it may, and, for ``keep_firing_for``, still
firing until that runs out after the inputs stop. A second test feeds the quiet inputs.
"""

from __future__ import annotations

import math
import re
from typing import Any

from alert_rules.config import RulesConfig
from alert_rules.promql.evaluate import Evaluator
from alert_rules.promql.template import QueryFunc, TemplateData, expand
from alert_rules.promql.values import Labels
from alert_rules.promtool_runner import load_series
from alert_rules.scenario import Case, Scenario, Series, ceil_to
from alert_rules.spec import AlertRule, RuleGroup, duration
from alert_rules.store import SeriesStore

_TEMPLATE = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def render_annotations(alert: AlertRule, labels: dict[str, str], query: QueryFunc | None = None,
                       value: float = math.nan) -> dict[str, str]:
    """The annotations as Prometheus renders them for an alert instance with these labels.

    Without ``query`` only ``$labels.NAME`` is rendered; with it (the scenario's inputs at the evaluation time),
    the embedded template engine expands everything, context queries included. promtool then checks the text
    against Prometheus' own expansion.
    """
    out = {}
    for key, text in alert.all_annotations.items():
        if query is not None:
            rendered = expand(text, TemplateData(labels, value, {}, query=query))
            if rendered.startswith("<error expanding template"):
                raise ValueError(f"alert {alert.name}: annotation {key}: {rendered}")
        else:
            rendered = _TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), text)
            if "{{" in rendered:
                raise ValueError(f"alert {alert.name}: annotation {key} uses a template testgen cannot render")
        out[key] = rendered
    return out


def scenario_query(scenario: Scenario, t: int, inputs: tuple[Series, ...] | None = None) -> QueryFunc:
    """Instant queries over the scenario's firing inputs (or ``inputs``) at ``t`` seconds (what a template query
    sees then)."""
    store = SeriesStore()
    load_series(store, [s.to_dict() for s in (scenario.firing if inputs is None else inputs)], scenario.step_s * 1000)
    evaluator = Evaluator(store)

    def query(text: str) -> list[tuple[Labels, float]]:
        value = evaluator.query(text, t * 1000)
        return [((), value)] if isinstance(value, float) else value

    return query


def _expected(alert: AlertRule, scenario: Scenario, t: int, case: Case | None = None) -> list[dict[str, Any]]:
    """The alert as promtool should list it at ``t``, labels and annotations as expanded at the evaluation ``t``
    (over the inputs of ``case`` when given)."""
    base = scenario.labels if case is None or case.fires_with is None else case.fires_with
    query = scenario_query(scenario, t, None if case is None else case.inputs)
    value = _instance_value(alert, base, query)
    series = {k: x for k, x in base.items() if k not in alert.all_labels}
    data = TemplateData(series, value, {})
    labels = {**base, **{name: expand(text, data) for name, text in alert.all_labels.items()}}
    annotations = render_annotations(alert, labels, query, value)
    return [{"exp_labels": dict(sorted(labels.items())), "exp_annotations": annotations}]


def _instance_value(alert: AlertRule, base: dict[str, str], query: QueryFunc) -> float:
    """The expression's value for the instance ``base`` names, where a template reads ``$value`` (else NaN)."""
    if not any("$value" in text for text in (*alert.all_labels.values(), *alert.all_annotations.values())):
        return math.nan
    series = {k: x for k, x in base.items() if k not in alert.all_labels}
    values = [v for labels, v in query(alert.expr) if all(dict(labels).get(k) == x for k, x in series.items())]
    if len(values) != 1:
        raise ValueError(f"alert {alert.name}: {len(values)} instances with labels {base} in its scenario")
    return values[0]


def _check(alert: AlertRule, t: int, expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": duration(t), "alertname": alert.name, "exp_alerts": expected}


def fire_time(alert: AlertRule, scenario: Scenario) -> int:
    """The first evaluation at which the alert fires in its scenario."""
    return scenario.active_at_s + ceil_to(alert.for_s, scenario.step_s)


def promtool_file(alert: AlertRule, scenario: Scenario, rule_files: list[str]) -> dict[str, Any]:
    """The promtool test file of one alert."""
    step = scenario.step_s
    fires = fire_time(alert, scenario)
    checks = []
    before = fires - step
    if before >= 0:
        checks.append(_check(alert, before, []))  # pending (or not yet active): no alert
    checks.append(_check(alert, fires, _expected(alert, scenario, fires)))
    if scenario.false_from_s is not None:
        keep = ceil_to(alert.keep_firing_for_s, step)
        if keep:
            # Kept firing: the annotations stay as expanded at the last evaluation where the expression held.
            last_true = _expected(alert, scenario, scenario.false_from_s - step)
            checks.append(_check(alert, scenario.false_from_s + keep - step, last_true))
        checks.append(_check(alert, scenario.false_from_s + keep, []))
    quiet_checks = [_check(alert, fires, []), _check(alert, fires + step, [])]
    interval = duration(step)
    tests = [
        {"name": f"{alert.name} fires", "interval": interval,
         "input_series": [s.to_dict() for s in scenario.firing], "alert_rule_test": checks},
        {"name": f"{alert.name} stays quiet", "interval": interval,
         "input_series": [s.to_dict() for s in scenario.quiet], "alert_rule_test": quiet_checks},
    ]
    for case in scenario.cases:
        at = fires if case.active_at_s is None else case.active_at_s + ceil_to(alert.for_s, step)
        if case.fires_with is None:
            case_checks = [_check(alert, at, []), _check(alert, at + step, [])]
        else:
            firing = _check(alert, at, _expected(alert, scenario, at, case))
            case_checks = [_check(alert, at - step, []), firing] if at >= step else [firing]
        tests.append({"name": f"{alert.name}: {case.name}", "interval": interval,
                      "input_series": [s.to_dict() for s in case.inputs], "alert_rule_test": case_checks})
    return {"rule_files": rule_files, "evaluation_interval": interval, "tests": tests}


def promtool_files(config: RulesConfig, groups: tuple[RuleGroup, ...], length_edges: tuple[int, ...],
               rules_dir: str = "../rules") -> dict[str, dict[str, Any]]:
    """Alert name -> its promtool test file, loading every rule file (recordings included)."""
    files = sorted({f"{rules_dir}/{g.file}.yml" for g in groups})
    out: dict[str, dict[str, Any]] = {}
    for group in groups:
        for alert in group.alerts():
            scenario = alert.scenario(config, alert, tuple(length_edges))
            out[alert.name] = promtool_file(alert, scenario, files)
    return out


__all__ = ["fire_time", "promtool_file", "promtool_files", "render_annotations", "scenario_query"]

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
from alert_rules.scenario import Scenario, ceil_to
from alert_rules.spec import AlertRule, RuleGroup, duration
from alert_rules.store import SeriesStore

_TEMPLATE = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def render_annotations(alert: AlertRule, labels: dict[str, str], query: QueryFunc | None = None) -> dict[str, str]:
    """The annotations as Prometheus renders them for an alert instance with these labels.

    Without ``query`` only ``$labels.NAME`` is rendered; with it (the scenario's inputs at the evaluation time),
    the embedded template engine expands everything, context queries included. promtool then checks the text
    against Prometheus' own expansion.
    """
    out = {}
    for key, text in alert.all_annotations.items():
        if query is not None:
            rendered = expand(text, TemplateData(labels, math.nan, {}, query=query))
            if rendered.startswith("<error expanding template"):
                raise ValueError(f"alert {alert.name}: annotation {key}: {rendered}")
        else:
            rendered = _TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), text)
            if "{{" in rendered:
                raise ValueError(f"alert {alert.name}: annotation {key} uses a template testgen cannot render")
        out[key] = rendered
    return out


def scenario_query(scenario: Scenario, t: int) -> QueryFunc:
    """Instant queries over the scenario's firing inputs at ``t`` seconds (what a template query sees then)."""
    store = SeriesStore()
    load_series(store, [s.to_dict() for s in scenario.firing], scenario.step_s * 1000)
    evaluator = Evaluator(store)

    def query(text: str) -> list[tuple[Labels, float]]:
        value = evaluator.query(text, t * 1000)
        return [((), value)] if isinstance(value, float) else value

    return query


def _expected(alert: AlertRule, scenario: Scenario, t: int) -> list[dict[str, Any]]:
    """The alert as promtool should list it at ``t``, annotations as expanded at the evaluation ``t``."""
    labels = {**scenario.labels, **alert.all_labels}
    annotations = render_annotations(alert, labels, scenario_query(scenario, t))
    return [{"exp_labels": dict(sorted(labels.items())), "exp_annotations": annotations}]


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
    return {
        "rule_files": rule_files,
        "evaluation_interval": interval,
        "tests": [
            {"name": f"{alert.name} fires", "interval": interval,
             "input_series": [s.to_dict() for s in scenario.firing], "alert_rule_test": checks},
            {"name": f"{alert.name} stays quiet", "interval": interval,
             "input_series": [s.to_dict() for s in scenario.quiet], "alert_rule_test": quiet_checks},
        ],
    }


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

"""The dashboard lint: our boards pass it, and each rule catches what it is for."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from alert_rules.config import RulesConfig
from dashboards.build import dashboards
from dashboards.config import DashboardConfig
from dashboards.lint import lint

BOARD_FILES = sorted(dashboards(DashboardConfig(), RulesConfig()))


@pytest.mark.parametrize("name", BOARD_FILES)
def test_every_board_is_lint_clean(boards: dict[str, dict[str, Any]], name: str) -> None:
    """Every generated board passes every lint rule."""
    assert [str(f) for f in lint(boards[name])] == []


def _first_panel(data: dict[str, Any]) -> dict[str, Any]:
    return next(p for p in data["panels"] if p["type"] != "row")


def _rules(data: dict[str, Any]) -> set[str]:
    return {f.rule for f in lint(data)}


def _mutated(boards: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return copy.deepcopy(boards["inferwatch-slo.json"])


def _set_expr(data: dict[str, Any], expr: str) -> None:
    for panel in data["panels"]:
        if panel["type"] == "timeseries":
            panel["targets"][0]["expr"] = expr
            return


@pytest.mark.parametrize(("expr", "rule"), [
    ("sum(rate(inferwatch_requests_total{model_name=~\"$model_name\"}[5m]))", "target-rate-interval-rule"),
    ("sum(inferwatch_requests_total{model_name=~\"$model_name\"})", "target-counter-agg-rule"),
    ("sum(rate(inferwatch_requests_total[$__rate_interval]))", "target-selector-rule"),
    ("sum(rate(inferwatch_requests_total{model_name=~\"$model_name\"}[$__rate_interval])", "target-promql-rule"),
    ("max(vllm:num_requests_running{model_name=~\"$model_name\"})", "target-selector-rule"),
], ids=["a fixed rate window", "a raw counter", "a selector without the model filter",
        "an unbalanced parenthesis", "a vLLM selector without the engine filter"])
def test_target_rules_catch_bad_queries(boards: dict[str, dict[str, Any]], expr: str, rule: str) -> None:
    """A bad query in a panel is reported under the rule that covers it."""
    data = _mutated(boards)
    _set_expr(data, expr)
    assert rule in _rules(data)


def test_counter_rule_reads_types_from_the_catalog(boards: dict[str, dict[str, Any]]) -> None:
    """A gauge named like a count is not a counter; a histogram's _count is."""
    data = _mutated(boards)
    _set_expr(data, "max(inferwatch_gpu_count)")
    assert "target-counter-agg-rule" not in _rules(data)
    _set_expr(data, "sum(inferwatch_request_prompt_tokens_count{model_name=~\"$model_name\"})")
    assert "target-counter-agg-rule" in _rules(data)


def test_panel_rules_catch_missing_description_unit_and_targets(boards: dict[str, dict[str, Any]]) -> None:
    """A panel without description, with an unknown unit and no targets gets three findings."""
    data = _mutated(boards)
    panel = _first_panel(data)
    panel["description"] = ""
    panel["fieldConfig"]["defaults"]["unit"] = "secs"
    panel["targets"] = []
    assert {"panel-title-description-rule", "panel-units-rule", "panel-no-targets-rule"} <= _rules(data)


def test_datasource_rules(boards: dict[str, dict[str, Any]]) -> None:
    """A hard-coded panel datasource and a missing datasource variable are both reported."""
    data = _mutated(boards)
    _first_panel(data)["datasource"] = {"type": "prometheus", "uid": "ddyfngn31dg5cf"}
    data["templating"]["list"] = [t for t in data["templating"]["list"] if t["type"] != "datasource"]
    assert {"panel-datasource-rule", "template-datasource-rule"} <= _rules(data)


def test_template_rules(boards: dict[str, dict[str, Any]]) -> None:
    """A model variable refreshed on load, single-select, with a bare query is reported three ways."""
    data = _mutated(boards)
    var = next(t for t in data["templating"]["list"] if t["name"] == "model_name")
    var.update(refresh=1, multi=False, query="up")
    assert {"template-on-time-change-reload-rule", "template-selector-rule",
            "template-label-promql-rule"} <= _rules(data)


def test_structure_rules(boards: dict[str, dict[str, Any]]) -> None:
    """Overlapping panels, a duplicated id, an editable board and a long uid are reported."""
    data = _mutated(boards)
    panels = [p for p in data["panels"] if p["type"] != "row"]
    panels[1]["gridPos"] = dict(panels[0]["gridPos"])
    panels[1]["id"] = panels[0]["id"]
    data["editable"] = True
    data["uid"] = "x" * 41
    findings = [f for f in lint(data) if f.rule in ("structure-rule", "uneditable-dashboard")]
    messages = " ".join(f.message for f in findings)
    assert "overlaps" in messages
    assert "unique" in messages
    assert "uid" in messages
    assert any(f.rule == "uneditable-dashboard" for f in findings)


@pytest.mark.parametrize(("expr", "rule"), [
    ('sum(rate(inferwatch_requests_total{model_name=~"$model_name"}[$__rate_interval]))', "target-selector-rule"),
    ('max by (engine) (vllm:num_requests_running{model_name=~"$model_name", engine=~"$engine", '
     'instance=~"$instance"})', "target-instance-grouping-rule"),
    ('sum(rate(inferwatch_requests_total{model_name=~"$model_name", instance=~"$pod"}[$__rate_interval]))',
     "template-variable-defined-rule"),
], ids=["a sidecar selector without the instance filter", "per-engine series added up across replicas",
        "an undefined variable"])
def test_replica_rules_catch_bad_queries(boards: dict[str, dict[str, Any]], expr: str, rule: str) -> None:
    """Fleet queries filter on $instance and never add engine 0 of one pod to engine 0 of another."""
    data = _mutated(boards)
    _set_expr(data, expr)
    assert rule in _rules(data)


def test_instance_filter_is_for_scraped_families_only(boards: dict[str, dict[str, Any]]) -> None:
    """Prometheus' own series (``up``, whose instance is any job's target) need no $instance filter."""
    data = _mutated(boards)
    _set_expr(data, 'min by (job) (up) + 0 * sum(rate(inferwatch_requests_total{model_name=~"$model_name", '
                    'instance=~"$instance"}[$__rate_interval]))')
    assert _rules(data) == set()


def test_instance_variable_rules(boards: dict[str, dict[str, Any]]) -> None:
    """A single-select instance variable is reported; a board whose queries use $instance needs it."""
    data = _mutated(boards)
    var = next(t for t in data["templating"]["list"] if t["name"] == "instance")
    var.update(multi=False)
    assert "template-selector-rule" in _rules(data)
    data["templating"]["list"] = [t for t in data["templating"]["list"] if t["name"] != "instance"]
    assert "template-variable-defined-rule" in _rules(data)

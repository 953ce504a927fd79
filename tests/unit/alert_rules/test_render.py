"""The rendered rule set: the evaluator interface, catalog names only, the evaluator's subset."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import alert_rules
from alert_rules import render, slo
from alert_rules.annotate import ENGINES_ANNOTATION
from alert_rules.config import RulesConfig
from alert_rules.promql import ast, check_supported, parse_expr
from exporters.catalog import sample_names
from exporters.errors import ConfigError
from exporters.records import DEFAULT_LENGTH_EDGES

EDGES = DEFAULT_LENGTH_EDGES
OWN_MODULES = ("spec", "config", "windows", "slo", "intervene", "annotate", "render", "alertmanager",
               "scenario", "testgen", "runbooks", "build")


def _rules(config: RulesConfig | None = None) -> list[dict[str, object]]:
    data = render.rule_groups(config or RulesConfig(), EDGES)
    return [rule for group in data["groups"] for rule in group["rules"]]


def _names(node: object) -> Iterator[str]:
    if isinstance(node, ast.Selector):
        if node.name:
            yield node.name
        return
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            for item in value if isinstance(value, tuple) else (value,):
                yield from _names(item)


def test_rule_groups_is_a_prometheus_rule_file_structure() -> None:
    """The interface dict has groups with name, interval and rules of record or alert shape."""
    data = render.rule_groups(RulesConfig(), EDGES)
    assert [g["name"] for g in data["groups"]] == ["inferwatch-slo", "inferwatch-intervene", "inferwatch-cutover",
                                                 "inferwatch-tenant-slo"]
    for group in data["groups"]:
        assert group["interval"] == "15s"
        for rule in group["rules"]:
            assert ("record" in rule) != ("alert" in rule)


def test_every_expression_is_in_the_evaluator_subset() -> None:
    """Every rule, with an SLA table too, passes the embedded evaluator's build-time check."""
    for rule in _rules(RulesConfig(sla_seconds={"llama": 2.0, "qwen": 8.0})):
        check_supported(str(rule["expr"]))


def test_every_metric_name_comes_from_the_catalog_or_our_recordings() -> None:
    """Every selector names a catalog series or one of the SLO recording rules."""
    known = set(sample_names())
    recorded = {str(r["record"]) for r in _rules() if "record" in r}
    for rule in _rules():
        for name in _names(parse_expr(str(rule["expr"]))):
            assert name in known or name in recorded, f"{name} in {rule}"


def test_no_metric_name_is_spelled_in_the_rule_sources() -> None:
    """Rule modules spell metric names only through catalog specs (recording names use ``inferwatch:``)."""
    folder = Path(alert_rules.__file__).parent
    for module in OWN_MODULES:
        text = (folder / f"{module}.py").read_text()
        assert re.findall(r"vllm:|\binferwatch_[a-z]", text) == [], module


def test_every_alert_is_annotated_with_service_runbook_and_text() -> None:
    """Every alert carries service and severity labels, summary, description and runbook_url (and intervene-now
    alerts their context, alerts reading what some engine does not export the engines they cannot fire for)."""
    for rule in _rules(RulesConfig(service="chat")):
        if "alert" in rule:
            labels, notes = rule["labels"], rule["annotations"]
            assert labels["service"] == "chat"  # type: ignore[index]
            assert labels["severity"] in ("critical", "warning", "info")  # type: ignore[index]
            assert set(notes) - {"context", ENGINES_ANNOTATION} == {  # type: ignore[arg-type]
                "summary", "description", "runbook_url"}
            assert notes["runbook_url"].endswith("#" + str(rule["alert"]).lower())  # type: ignore[index]


def test_severity_override_changes_one_alert() -> None:
    """A configured override replaces the built-in severity of that alert only."""
    rules = {r.get("alert"): r for r in _rules(RulesConfig(severity_overrides={"InferwatchGpuMemoryHigh": "critical"}))}
    assert rules["InferwatchGpuMemoryHigh"]["labels"]["severity"] == "critical"  # type: ignore[index]
    assert rules["InferwatchKVCacheNearlyFull"]["labels"]["severity"] == "warning"  # type: ignore[index]


def test_override_of_an_unknown_alert_is_a_config_error() -> None:
    """A typo in an override's alert name is reported with the key."""
    with pytest.raises(ConfigError, match="severity_overrides"):
        render.rule_groups(RulesConfig(severity_overrides={"InferwatchNope": "info"}), EDGES)


def test_rule_files_split_by_area_and_yaml_is_deterministic() -> None:
    """Two renders give the same bytes, and the YAML reads back to the same structure."""
    files = render.rule_files(RulesConfig(), EDGES)
    assert sorted(files) == ["cutover", "intervene", "slo"]
    text = render.to_yaml(files["slo"])
    assert text == render.to_yaml(render.rule_files(RulesConfig(), EDGES)["slo"])
    assert yaml.safe_load(text) == files["slo"]


def test_recording_names_are_declared_once() -> None:
    """The SLO recordings use the names slo.py declares."""
    recorded = {str(r["record"]) for r in _rules() if "record" in r}
    assert {slo.EVENTS, slo.BAD_EVENTS, slo.error_ratio_name(300)} <= recorded


def test_rule_groups_accepts_settings_duck_typed() -> None:
    """Settings-like objects (.rules and .serve.length_bucket_edges) give the same groups."""
    from serving.config import defaults

    assert render.rule_groups(defaults()) == render.rule_groups(RulesConfig(), EDGES)


def test_a_rule_the_evaluator_cannot_run_is_refused_naming_group_rule_and_construct(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`rules build` refuses, before writing anything, a rule outside what the embedded evaluator speaks."""
    from alert_rules.spec import RecordingRule, RuleGroup

    bad = RuleGroup("extra", (RecordingRule("job:x:smooth", "holt_winters(x[5m], 0.5, 0.5)"),))
    real = slo.rule_groups
    monkeypatch.setattr(slo, "rule_groups", lambda config: (*real(config), bad))
    with pytest.raises(ConfigError, match=r"group 'extra', record 'job:x:smooth': PromQL syntax.*holt_winters"):
        render.build_groups(RulesConfig())

"""``rules build --format prometheus-operator``: PrometheusRule and AlertmanagerConfig objects.

The objects are checked against the prometheus-operator CRD schemas (see kubernetes_schemas.py),
against the plain files ``rules build`` writes, and against golden files for a tuned config,
``tests/data/kubernetes/prometheus-operator/*.yaml``. Regenerate those with
``INFERWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/deploy/test_prometheus_operator.py``.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from alert_rules import prometheus_operator
from alert_rules.build import outputs as plain_outputs
from serving.cli import main
from serving.config import Settings, build_settings
from tests.unit.deploy.golden import assert_golden
from tests.unit.deploy.kubernetes_schemas import schema_errors

TUNED_TOML = """
[serve]
length_bucket_edges = [1024, 4096, 16384]

[rules]
service = "chat"
sla_seconds = { "llama" = 4.0 }
sla_default_s = 8.0
slo_objective = 0.995
alertmanager_group_wait_s = 10
alertmanager_repeat_interval_s = 3600
alertmanager_receivers = { "page" = "http://pager.example:8080/hook", "ticket" = "", "info" = "" }
"""
CONFIGS = {"defaults": {}, "tuned": tomllib.loads(TUNED_TOML)}


@pytest.fixture(params=sorted(CONFIGS))
def settings(request: pytest.FixtureRequest) -> Settings:
    """Settings for each config: the defaults and a tuned one."""
    return build_settings(copy.deepcopy(CONFIGS[request.param]))


def _objects(settings: Settings) -> dict[str, dict[str, Any]]:
    texts = prometheus_operator.outputs(settings.rules, tuple(settings.serve.length_bucket_edges))
    return {path: yaml.safe_load(text) for path, text in texts.items()}


def _plain(settings: Settings) -> dict[str, Any]:
    texts = plain_outputs(settings.rules, tuple(settings.serve.length_bucket_edges))
    return {path: yaml.safe_load(text) for path, text in texts.items() if not path.startswith(("tests/", "docs/"))}


def test_each_prometheus_rule_holds_exactly_its_rule_files_groups(settings: Settings) -> None:
    """One PrometheusRule per plain rule file, its spec equal to that file as written."""
    objects = _objects(settings)
    plain = _plain(settings)
    rule_files = {p.removeprefix("rules/").removesuffix(".yml"): d for p, d in plain.items() if p.startswith("rules/")}
    rules = {p: o for p, o in objects.items() if o["kind"] == "PrometheusRule"}
    assert sorted(rules) == sorted(f"prometheus-operator/prometheusrule-{name}.yaml" for name in rule_files)
    for name, data in rule_files.items():
        rule = rules[f"prometheus-operator/prometheusrule-{name}.yaml"]
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["metadata"]["name"] == f"inferwatch-{name}"
        assert rule["spec"] == data


def test_every_object_validates_against_its_crd_schema(settings: Settings) -> None:
    """PrometheusRule and AlertmanagerConfig (child routes included) match prometheus-operator's CRDs."""
    for path, obj in _objects(settings).items():
        assert schema_errors(obj) == [], path


@pytest.mark.parametrize(
    ("file", "mutate", "expected"),
    [
        ("prometheusrule-intervene.yaml", lambda o: o["spec"]["groups"][0]["rules"][0].update({"fro": "5m"}), "fro"),
        ("prometheusrule-slo.yaml", lambda o: o["spec"]["groups"][0].update({"interval": "15 s"}), "pattern"),
        ("alertmanagerconfig.yaml", lambda o: o["spec"]["route"]["routes"][0].update({"matcher": []}), "matcher"),
        ("alertmanagerconfig.yaml", lambda o: o["spec"]["receivers"][0]["webhookConfigs"][0].update(
            {"sendResolved": "yes please"}), "sendResolved"),
    ],
    ids=["unknown rule field", "bad duration", "unknown child-route field", "wrong type"],
)
def test_crd_schemas_reject_a_broken_object(file: str, mutate: Any, expected: str) -> None:
    """A misspelled field, a malformed duration or a wrong type fails the CRD check."""
    obj = _objects(build_settings({}))[f"prometheus-operator/{file}"]
    mutate(obj)
    errors = schema_errors(obj)
    assert any(expected in e for e in errors), errors


def test_alertmanager_config_keeps_the_routing_of_alertmanager_yml(settings: Settings) -> None:
    """Timings, grouping, receivers and the inhibit rule are those of alertmanager.yml, in CRD spelling."""
    plain = _plain(settings)["alertmanager.yml"]
    spec = _objects(settings)["prometheus-operator/alertmanagerconfig.yaml"]["spec"]
    route = spec["route"]
    assert (route["receiver"], route["groupBy"], route["groupWait"], route["groupInterval"],
            route["repeatInterval"]) == tuple(plain["route"][k] for k in (
                "receiver", "group_by", "group_wait", "group_interval", "repeat_interval"))
    written = [[f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in child["matchers"]] for child in route["routes"]]
    assert written == [child["matchers"] for child in plain["route"]["routes"]]
    assert [child["receiver"] for child in route["routes"]] == [child["receiver"] for child in plain["route"]["routes"]]
    receivers = {r["name"]: [w["url"] for w in r.get("webhookConfigs", [])] for r in spec["receivers"]}
    assert receivers == {r["name"]: [w["url"] for w in r.get("webhook_configs", [])] for r in plain["receivers"]}
    used = {route["receiver"], *(child["receiver"] for child in route["routes"])}
    assert used <= set(receivers)
    (inhibit,) = spec["inhibitRules"]
    (plain_inhibit,) = plain["inhibit_rules"]
    assert inhibit["equal"] == plain_inhibit["equal"]
    for side, plain_side in (("sourceMatch", "source_matchers"), ("targetMatch", "target_matchers")):
        assert [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in inhibit[side]] == plain_inhibit[plain_side]


@pytest.mark.parametrize(
    "config",
    [
        {"global": {"resolve_timeout": "5m"}},
        {"route": {"receiver": "x", "matchers": ['team="a\\"b"']}},
        {"route": {"receiver": "x", "routes": [{"receiver": "y", "mute_time_intervals": ["nights"]}]}},
        {"receivers": [{"name": "x", "email_configs": [{"to": "a@b"}]}]},
    ],
    ids=["global", "escaped matcher value", "mute time intervals", "email receiver"],
)
def test_what_does_not_map_raises(config: dict[str, Any]) -> None:
    """A key or matcher without an AlertmanagerConfig counterpart is an error, never dropped."""
    with pytest.raises(ValueError, match="does not map"):
        prometheus_operator.alertmanager_config_object(config)


def test_rules_build_writes_the_objects_only_with_the_format(tmp_path: Path) -> None:
    """``--format prometheus-operator`` adds DIR/prometheus-operator/; the default writes the plain files only."""
    assert main(["rules", "build", "--out", str(tmp_path / "plain")]) == 0
    assert main(["rules", "build", "--format", "prometheus-operator", "--out", str(tmp_path / "op")]) == 0
    plain = {p.relative_to(tmp_path / "plain").as_posix() for p in (tmp_path / "plain").rglob("*") if p.is_file()}
    both = {p.relative_to(tmp_path / "op").as_posix() for p in (tmp_path / "op").rglob("*") if p.is_file()}
    assert both - plain == set(prometheus_operator.outputs(build_settings({}).rules))
    assert not any(p.startswith("prometheus-operator/") for p in plain)


def test_rules_build_rejects_an_unknown_format(tmp_path: Path) -> None:
    """An unknown ``--format`` is bad usage: exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(["rules", "build", "--format", "helm", "--out", str(tmp_path)])
    assert exit_info.value.code == 2


def test_objects_match_their_golden_files(tmp_path: Path) -> None:
    """The tuned config's objects, as ``rules build --format prometheus-operator`` writes them, equal the goldens."""
    config = tmp_path / "tuned.toml"
    config.write_text(TUNED_TOML)
    assert main(["rules", "build", "--format", "prometheus-operator", "--config", str(config),
                 "--out", str(tmp_path / "out")]) == 0
    written = sorted((tmp_path / "out" / "prometheus-operator").glob("*.yaml"))
    assert [p.name for p in written] == ["alertmanagerconfig.yaml", "prometheusrule-cutover.yaml",
                                          "prometheusrule-intervene.yaml", "prometheusrule-slo.yaml"]
    for path in written:
        assert_golden(f"prometheus-operator/{path.name}", path.read_text())


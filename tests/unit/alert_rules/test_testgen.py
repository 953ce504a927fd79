"""Generated promtool tests: every alert, firing and quiet, on both sides of for:."""

from __future__ import annotations

from typing import Any

import pytest

from alert_rules import render, scenario, testgen
from alert_rules.config import RulesConfig
from alert_rules.spec import duration

EDGES = (512, 2048, 8192, 32768)
CONFIGS = {
    "defaults": RulesConfig(),
    "tuned": RulesConfig(sla_seconds={"llama": 4.0, "qwen": 12.0}, sla_default_s=8.0, swap_for_s=120,
                         kv_cache_ratio=0.8, kv_cache_for_s=90, rollback_error_ratio=0.05,
                         breaker_keep_firing_for_s=120, slo_objective=0.995, slo_latency_threshold_s=5.0,
                         max_num_seqs=64, oom_count=2, oom_window_s=20, upstream_down_for_s=45),
}


def _files(config: RulesConfig | None = None) -> dict[str, dict[str, Any]]:
    config = config or RulesConfig()
    return testgen.promtool_files(config, render.build_groups(config, EDGES), EDGES, "../rules")


def test_every_alert_has_a_test_file() -> None:
    """A test file exists for each generated alert."""
    alerts = {a.name for a in render.alerts(RulesConfig(), EDGES)}
    assert set(_files()) == alerts


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_each_file_fires_and_stays_quiet(config: RulesConfig) -> None:
    """Each file has a firing test with a non-empty expectation and a quiet test expecting nothing."""
    for name, data in _files(config).items():
        fires, quiet, *_cases = data["tests"]
        assert any(c["exp_alerts"] for c in fires["alert_rule_test"]), name
        assert all(c["exp_alerts"] == [] for c in quiet["alert_rule_test"]), name


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_alerts_with_for_are_checked_on_both_sides(config: RulesConfig) -> None:
    """With for:, the step before firing expects nothing and the firing step expects the alert."""
    alerts = {a.name: a for a in render.alerts(config, EDGES)}
    for name, data in _files(config).items():
        alert = alerts[name]
        if not alert.for_s:
            continue
        checks = data["tests"][0]["alert_rule_test"]
        step = data["evaluation_interval"]
        assert checks[0]["exp_alerts"] == [], name
        assert checks[1]["exp_alerts"], name
        assert checks[0]["eval_time"] != checks[1]["eval_time"], step


def test_keep_firing_for_is_tested_until_it_runs_out() -> None:
    """The rollback alert is still firing one step before keep_firing_for runs out, and gone after."""
    checks = _files()["InferwatchCircuitBreakerRollback"]["tests"][0]["alert_rule_test"]
    assert checks[-2]["exp_alerts"]
    assert checks[-1]["exp_alerts"] == []


def test_inputs_follow_the_config() -> None:
    """A different KV threshold and for: move the scenario's values and firing time."""
    data = _files(RulesConfig(kv_cache_ratio=0.5, kv_cache_for_s=120))["InferwatchKVCacheNearlyFull"]
    fires = data["tests"][0]
    assert fires["input_series"][0]["values"].startswith("0.75x")
    assert [c["eval_time"] for c in fires["alert_rule_test"]] == ["1m", duration(120)]


def test_expected_annotations_are_rendered_with_the_labels() -> None:
    """Templates in annotations are filled with the scenario's labels, as Prometheus renders them."""
    data = _files()["InferwatchQueueBacklog"]
    (expected,) = data["tests"][0]["alert_rule_test"][1]["exp_alerts"]
    assert scenario.MODEL in expected["exp_annotations"]["description"]
    assert "{{" not in expected["exp_annotations"]["description"]


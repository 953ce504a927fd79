"""Rule values: durations, float literals, selectors and alert validation."""

from __future__ import annotations

import pytest

from alert_rules.config import RulesConfig
from alert_rules.runbooks import Runbook
from alert_rules.scenario import Scenario, Series
from alert_rules.spec import AlertRule, RecordingRule, RuleGroup, Severity, any_of, duration, number, selector


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (10, "10s"), (60, "1m"), (90, "1m30s"), (3600, "1h"), (86400 * 3, "3d"), (3660, "1h1m")],
    ids=["zero", "seconds", "a minute", "mixed", "an hour", "days", "hour and minute"],
)
def test_duration_spells_prometheus_durations(seconds: int, text: str) -> None:
    """Whole seconds are written in the largest units Prometheus reads back to the same value."""
    assert duration(seconds) == text


def test_duration_refuses_fractions() -> None:
    """A fractional second cannot be written as a rule duration."""
    with pytest.raises(ValueError, match="whole number"):
        duration(1.5)


@pytest.mark.parametrize("value", [0.0144, 0.1 + 0.2, 1e-05, 30.0, 0.999])
def test_number_round_trips_exactly(value: float) -> None:
    """A float literal reads back as the very same float, so both evaluators compare the same threshold."""
    assert float(number(value)) == value


def test_selector_escapes_quotes_and_backslashes() -> None:
    """Label values with quotes or backslashes are escaped as PromQL strings."""
    assert selector("m", ("a", "=", 'x"y\\z')) == 'm{a="x\\"y\\\\z"}'


def test_any_of_refuses_regex_metacharacters() -> None:
    """Only plain values go into an unescaped alternation regex."""
    assert any_of(("a", "b-c")) == "a|b-c"
    with pytest.raises(ValueError, match="not plain"):
        any_of(("a.b",))


def _scenario(_config: RulesConfig, _alert: AlertRule, _edges: tuple[int, ...]) -> Scenario:
    series = (Series("x", "1x3"),)
    return Scenario(60, series, series, 0)


def _alert(**changes: object) -> AlertRule:
    base: dict[str, object] = {
        "name": "InferwatchX", "expr": "vector(1)", "severity": Severity.INFO,
        "summary": "Something happened.", "description": "Details.",
        "runbook": Runbook("It happened.", ("Look.",), ("Fix it.",)), "scenario": _scenario,
    }
    return AlertRule(**{**base, **changes})  # type: ignore[arg-type]


def test_an_alert_without_scenario_cannot_be_defined() -> None:
    """The promtool scenario is a required field, so an untested alert fails where it is written."""
    with pytest.raises(TypeError, match="scenario"):
        AlertRule(name="InferwatchX", expr="vector(1)", severity=Severity.INFO,  # type: ignore[call-arg]
                  summary="Something happened.", description="Details.",
                  runbook=Runbook("It happened.", ("Look.",), ("Fix it.",)))


def test_runbook_and_scenario_stay_out_of_the_rule_file() -> None:
    """The rule dict Prometheus reads has no trace of the runbook or the scenario."""
    assert set(_alert().to_dict()) == {"alert", "expr", "labels", "annotations"}


def test_alert_names_need_the_shared_prefix() -> None:
    """Alert names are CamelCase with the Inferwatch prefix (monitoring-mixin convention)."""
    with pytest.raises(ValueError, match="Inferwatch"):
        _alert(name="HighLatency")


def test_alert_summary_is_a_sentence() -> None:
    """A summary without a final period is refused."""
    with pytest.raises(ValueError, match="period"):
        _alert(summary="no period")


def test_alert_renders_severity_for_and_keep_firing_for() -> None:
    """The rule dict carries for, keep_firing_for, severity and both required annotations."""
    out = _alert(for_s=300, keep_firing_for_s=60, labels={"action": "x"}).to_dict()
    assert out["for"] == "5m"
    assert out["keep_firing_for"] == "1m"
    assert out["labels"] == {"action": "x", "severity": "info"}
    assert set(out["annotations"]) == {"summary", "description"}


def test_zero_for_is_left_out() -> None:
    """An alert without for: or keep_firing_for: omits both keys, as Prometheus writes them."""
    assert "for" not in _alert().to_dict()
    assert "keep_firing_for" not in _alert().to_dict()


def test_group_renders_interval_and_rules_in_order() -> None:
    """A group keeps its rule order (recordings before the alerts reading them)."""
    group = RuleGroup("g", (RecordingRule("a:b", "vector(1)"), _alert()), 15)
    out = group.to_dict()
    assert out["interval"] == "15s"
    assert [r.get("record", r.get("alert")) for r in out["rules"]] == ["a:b", "InferwatchX"]


def test_recording_rule_name_is_checked() -> None:
    """A recording rule name that is not a metric name is refused."""
    with pytest.raises(ValueError, match="not a valid metric name"):
        RecordingRule("bad name", "vector(1)")

"""The [rules] config section: every threshold validated, errors naming the key."""

from __future__ import annotations

import pytest

from alert_rules.config import RulesConfig
from exporters.configuring import from_mapping
from exporters.errors import ConfigError


def _build(**values: object) -> RulesConfig:
    return from_mapping(RulesConfig, values, "rules")


def test_defaults_follow_production_practice() -> None:
    """Defaults are the issue's numbers: 5 min swapping, 1.5 x SLA, 90 % GPU memory, 1 % / 3 % breaker."""
    c = RulesConfig()
    assert (c.swap_for_s, c.sla_factor, c.gpu_memory_ratio, c.gpu_memory_for_s) == (300, 1.5, 0.9, 600)
    assert (c.degrade_error_ratio, c.degrade_p99_s, c.rollback_error_ratio) == (0.01, 2.0, 0.03)
    assert (c.oom_count, c.oom_window_s, c.leak_growth_per_hour, c.leak_window_s) == (3, 10, 0.05, 3600)
    assert (c.kv_cache_ratio, c.kv_cache_for_s, c.upstream_down_for_s) == (0.95, 600, 60)
    assert (c.slo_objective, c.slo_period_days, c.batch_raise_factor) == (0.999, 30, 1.25)


def test_latency_threshold_must_be_a_bucket_bound_and_the_error_names_them() -> None:
    """A latency SLO threshold between bucket bounds is refused, listing the bounds that exist."""
    with pytest.raises(ConfigError) as err:
        _build(slo_latency_threshold_s=7)
    assert err.value.key == "rules.slo_latency_threshold_s"
    assert "5, 10, 15" in str(err.value)


def test_latency_threshold_on_a_bound_is_accepted() -> None:
    """An integer threshold equal to a bound is accepted and stored as a float."""
    assert _build(slo_latency_threshold_s=5).slo_latency_threshold_s == 5.0


@pytest.mark.parametrize("objective", [99.9, 1.0, 0.0])
def test_objective_is_a_ratio(objective: float) -> None:
    """The SLO objective is a ratio strictly between 0 and 1, never a percent."""
    with pytest.raises(ConfigError, match=r"rules\.slo_objective"):
        _build(slo_objective=objective)


def test_durations_are_whole_seconds() -> None:
    """A for: duration with a fraction of a second is refused."""
    with pytest.raises(ConfigError, match="whole number"):
        _build(swap_for_s=1.5)


def test_sla_table_per_model_with_default() -> None:
    """A model in the SLA table gets its own SLA; others get the default."""
    c = _build(sla_seconds={"llama": 5}, sla_default_s=12)
    assert (c.sla_for("llama"), c.sla_for("other")) == (5.0, 12.0)


def test_severity_overrides_are_checked() -> None:
    """An override to an unknown severity is refused."""
    with pytest.raises(ConfigError, match="severity"):
        _build(severity_overrides={"InferwatchGpuMemoryHigh": "page"})


def test_receivers_need_page_ticket_and_info() -> None:
    """The Alertmanager receiver table must name all three receivers."""
    with pytest.raises(ConfigError, match="missing 'info'"):
        _build(alertmanager_receivers={"page": "", "ticket": ""})


def test_runbook_pattern_needs_the_anchor_placeholder() -> None:
    """A runbook URL pattern without {anchor} is refused."""
    with pytest.raises(ConfigError, match="anchor"):
        _build(runbook_url_pattern="https://example.invalid/runbooks")

"""SLO recording rules and multi-window burn-rate alerts."""

from __future__ import annotations

import pytest

from alert_rules import slo
from alert_rules.config import RulesConfig
from exporters.catalog.request import E2E_LATENCY_SECONDS, REQUESTS
from exporters.errors import ConfigError

ROUTES = 'route=~"/v1/chat/completions|/v1/completions|/v1/embeddings|/v1/responses|/api/generate|/api/chat"'
"""The matcher of the inference routes, the only requests the SLOs count."""


def test_le_value_matches_the_exporter_formatting() -> None:
    """Bucket bounds are written as prometheus_client writes them: 10 -> "10.0" (pitfall 10)."""
    assert (slo.le_value(10), slo.le_value(2.5), slo.le_value(0.3)) == ("10.0", "2.5", "0.3")


def test_latency_slo_counts_requests_above_the_bucket() -> None:
    """Bad latency events are count minus the bucket at the threshold, with its exact le string."""
    latency = slo.latency(5.0)
    assert f'{E2E_LATENCY_SECONDS.bucket}{{{ROUTES}, le="5.0"}}' in latency.bad_events
    assert f"{E2E_LATENCY_SECONDS.count}{{{ROUTES}}}" in latency.bad_events


def test_latency_threshold_off_a_bound_is_refused() -> None:
    """A threshold that is no bucket bound raises ConfigError naming the bounds."""
    with pytest.raises(ConfigError, match="7680"):
        slo.latency(3.0)


def test_availability_counts_error_outcomes_and_never_lacks_a_series() -> None:
    """Bad events are the error outcomes, with a zero fallback so the first error is counted."""
    bad = slo.availability().bad_events
    assert 'outcome=~"upstream_error|timeout|overloaded"' in bad
    assert f"or (sum by (model_name, instance) ({REQUESTS.series}{{{ROUTES}}}) * 0)" in bad


def test_long_windows_read_recorded_sums_not_raw_series() -> None:
    """Every error-ratio rule reads only the recorded event sums, so raw samples need no 3-day retention."""
    ratios = [r for r in slo.recording_rules(RulesConfig()) if r.record.startswith("inferwatch:slo_error")]
    assert [r.record.rsplit("rate", 1)[1] for r in ratios] == ["5m", "30m", "1h", "6h", "3d"]
    for rule in ratios:
        assert REQUESTS.series not in rule.expr
        assert slo.BAD_EVENTS in rule.expr
        assert slo.EVENTS in rule.expr


def test_page_alert_is_the_workbook_expression() -> None:
    """The page is (1h and 5m above 14.4 x budget) or (6h and 30m above 6 x budget)."""
    page = next(a for a in slo.burn_alerts(RulesConfig()) if a.name == "InferwatchAvailabilityBudgetBurnPage")
    assert 'inferwatch:slo_error:ratio_rate1h{slo="availability"} > 0.0144' in page.expr
    assert 'inferwatch:slo_error:ratio_rate5m{slo="availability"} > 0.0144' in page.expr
    assert 'inferwatch:slo_error:ratio_rate6h{slo="availability"} > 0.006' in page.expr
    assert page.severity == "critical"


def test_ticket_alert_is_1x_over_3d_and_6h() -> None:
    """The ticket burns 1 x budget over 3d and 6h, with warning severity."""
    ticket = next(a for a in slo.burn_alerts(RulesConfig()) if a.name == "InferwatchLatencyBudgetBurnTicket")
    assert 'ratio_rate3d{slo="latency"} > 0.001' in ticket.expr
    assert 'ratio_rate6h{slo="latency"} > 0.001' in ticket.expr
    assert ticket.severity == "warning"


def test_objective_changes_every_threshold() -> None:
    """A 99 % objective gives a 0.144 fast-page threshold."""
    page = slo.burn_alerts(RulesConfig(slo_objective=0.99))[0]
    assert "> 0.144 and" in page.expr


def test_recordings_come_before_the_alerts() -> None:
    """Within the SLO group, recordings precede alerts so alerts read this evaluation's ratios."""
    (group,) = slo.rule_groups(RulesConfig())
    kinds = [type(r).__name__ for r in group.rules]
    assert kinds == sorted(kinds, key=lambda k: k != "RecordingRule")

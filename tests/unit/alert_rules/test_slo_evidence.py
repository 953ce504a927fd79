"""A page needs evidence: a minimum of the SLO's requests, and only the requests the SLO is about.

A promtool-format test over the built rules, run here by the embedded evaluator (``inferwatch rules
test``'s code) and by the real promtool in tests/integration/test_rules_promtool.py. One sidecar's
counters every 5 s (its scrape interval), rules evaluated every 15 s (the default):

- the issue's night: with no other traffic, one failed chat request and 35 s later two more page
  nobody (neither the burn-rate page nor the circuit breaker's rollback) and open no ticket (a
  100 % error ratio over three requests);
- ``/v1/models`` (a health checker's polls) and another path under ``/v1`` failing while inference is
  fine page nobody;
- a total outage at 10 requests/s after six hours of clean traffic (every page window full) pages at
  the workbook's detection time (51.84 s: absent at the evaluation before it, firing at the first one
  after it);
- a total outage at 10 requests/s from a cold start (no traffic before) pages once the hour holds
  ``rules.slo_min_requests`` (1000) requests: 100 s in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alert_rules.config import RulesConfig
from alert_rules.promtool_runner import run_file
from alert_rules.render import build_groups
from alert_rules.spec import duration, selector
from alert_rules.testgen import render_annotations
from exporters.catalog.request import E2E_LATENCY_SECONDS, REQUESTS
from tests.unit.alert_rules.rule_test_files import write_rule_test

LATENCY = "InferwatchLatencyAboveSLA"
PAGE = "InferwatchAvailabilityBudgetBurnPage"
TICKET = "InferwatchAvailabilityBudgetBurnTicket"
ROLLBACK = "InferwatchCircuitBreakerRollback"
DEGRADE = "InferwatchCircuitBreakerDegrade"
MODEL = "m"
STEP_S = 5
EVAL_S = 15
T0 = 3600
"""Where the quiet cases and the cold start begin: after an hour of samples (zeros, or clean traffic)."""
T0_FULL = 6 * 3600
"""Where the outage under traffic begins: after six hours of clean traffic, so every page window is full."""
RATE = 10
"""Requests per second of the traffic cases."""


def _requests(route: str, outcome: str, values: str, model: str = MODEL) -> dict[str, str]:
    labels = (("instance", "=", "sidecar:9100"), ("length_bucket", "=", "le512"), ("model_name", "=", model),
              ("outcome", "=", outcome), ("route", "=", route))
    return {"series": selector(REQUESTS.series, *labels), "values": values}


def _counter(steps_before: int, per_step_before: float, steps_after: int, per_step_after: float) -> str:
    """A counter growing by one amount per step until T0, then by another."""
    at_t0 = steps_before * per_step_before
    return f"0+{per_step_before:g}x{steps_before} {at_t0 + per_step_after:g}+{per_step_after:g}x{steps_after}"


def _quiet(name: str, series: list[dict[str, str]], until_s: int) -> dict[str, Any]:
    """A test expecting no burn-rate or circuit-breaker alert at every minute up to ``until_s``."""
    checks = [{"eval_time": duration(t), "alertname": alert, "exp_alerts": []}
              for t in range(T0, until_s + 1, 60) for alert in (PAGE, TICKET, ROLLBACK, DEGRADE)]
    return {"name": name, "interval": duration(STEP_S), "input_series": series, "alert_rule_test": checks}


def _slow_requests(values_slow: str, steps: int) -> list[dict[str, str]]:
    """End-to-end latency buckets of model m: requests of about 100 s (between the 60 s and 120 s bounds)."""
    def bucket(le: str, values: str) -> dict[str, str]:
        labels = (("instance", "=", "sidecar:9100"), ("model_name", "=", MODEL), ("le", "=", le))
        return {"series": selector(E2E_LATENCY_SECONDS.bucket, *labels), "values": values}
    return [bucket("60.0", f"0x{steps}"), bucket("120.0", values_slow), bucket("+Inf", values_slow)]


def _page(config: RulesConfig) -> list[dict[str, Any]]:
    """The page as promtool lists it for model m."""
    alert = next(a for g in build_groups(config) for a in g.alerts() if a.name == PAGE)
    labels = {"model_name": MODEL, **alert.all_labels}
    return [{"exp_labels": labels, "exp_annotations": render_annotations(alert, labels)}]


def _pages(name: str, series: list[dict[str, str]], absent_at_s: int, firing_at_s: int,
           config: RulesConfig) -> dict[str, Any]:
    """A test expecting the page absent at ``absent_at_s`` and firing at ``firing_at_s``."""
    return {"name": name, "interval": duration(STEP_S), "input_series": series, "alert_rule_test": [
        {"eval_time": duration(absent_at_s), "alertname": PAGE, "exp_alerts": []},
        {"eval_time": duration(firing_at_s), "alertname": PAGE, "exp_alerts": _page(config)},
    ]}


def evidence_test_file(root: Path, config: RulesConfig | None = None) -> Path:
    """Write the built rules and the promtool test of the burn alerts' evidence under ``root``."""
    config = config or RulesConfig()
    before, hour = T0 // STEP_S, 3600 // STEP_S
    chat, models = "/v1/chat/completions", "/v1/models"
    # The issue: counters at 0 (pre-created at start), one failure at T0, two more 35 s later, nothing else.
    three = f"0x{before - 1} 1x7 3x{hour + 60}"
    three_failures = [_requests(chat, "ok", f"0x{before + hour + 60}"), _requests(chat, "upstream_error", three)]
    # /v1/models fails at 1 request/s while chat serves 10/s fine; a GET without a body names no model
    # ("unknown"), and one of a model's own, e.g. a route that takes a model name ("other").
    models_failing = [_requests(chat, "ok", _counter(before, RATE * STEP_S, hour, RATE * STEP_S)),
                      _requests(chat, "upstream_error", f"0x{before + hour}"),
                      _requests(models, "upstream_error", _counter(before, 0, hour, STEP_S), "unknown"),
                      _requests("other", "upstream_error", _counter(before, 0, hour, STEP_S))]
    # Every request fails from T0 on, after six hours of clean traffic / after an hour of nothing.
    after, full = 600 // STEP_S, T0_FULL // STEP_S
    outage = [_requests(chat, "ok", _counter(full, RATE * STEP_S, after, 0)),
              _requests(chat, "upstream_error", _counter(full, 0, after, RATE * STEP_S))]
    cold = [_requests(chat, "ok", f"0x{before + after}"),
            _requests(chat, "upstream_error", _counter(before, 0, after, RATE * STEP_S))]
    # Two requests of about 100 s (over 1.5 x the 20 s SLA), three minutes apart, and nothing else: their p99 is
    # over the limit for eight minutes, longer than the latency page's `for`.
    two_slow = _slow_requests(f"0x{before - 1} 1x35 2x{hour + 60}", before + hour + 60)
    doc: dict[str, Any] = {
        "rule_files": ["../rules/slo.yml", "../rules/intervene.yml"],
        "evaluation_interval": duration(EVAL_S),
        "tests": [
            _quiet("one failure, two more 35 s later, no other traffic: no page, no ticket", three_failures,
                   T0 + 3600 + 120),
            _quiet("/v1/models and other paths failing while inference is fine: no page, no ticket", models_failing,
                   T0 + 3600),
            {"name": "two slow requests three minutes apart, no other traffic: no latency page",
             "interval": duration(STEP_S), "input_series": two_slow,
             "alert_rule_test": [{"eval_time": duration(t), "alertname": LATENCY, "exp_alerts": []}
                                 for t in range(T0, T0 + 1200 + 1, 60)]},
            # Workbook: 51.84 s after the start; evaluations at +45 s and +60 s.
            _pages("a total outage under 10 requests/s pages at 51.84 s", outage, T0_FULL + 45, T0_FULL + 60,
                   config),
            # 1000 requests at 10/s: 100 s after T0; evaluations at T0 + 90 s and T0 + 105 s.
            _pages("a total outage from a cold start pages once the hour holds 1000 requests", cold, T0 + 90,
                   T0 + 105, config),
        ],
    }
    return write_rule_test(root, config, "slo_evidence.yml", doc)


def test_embedded_evaluator_needs_evidence_to_page(tmp_path: Path) -> None:
    """Three failures, a failing /v1/models and two slow requests page nobody; a total outage under traffic pages
    in time."""
    result = run_file(evidence_test_file(tmp_path))
    assert result.errors == []
    assert result.failures == []

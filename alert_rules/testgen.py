"""promtool unit tests for every alert: each fires, and stays quiet, on both sides of ``for:``.

One scenario per alert, built from the same config values as the rule, so a changed threshold
moves the test inputs with it. Each scenario feeds a series that makes the expression true from
``active_at`` on and checks: absent (pending) one step before it may fire, firing with its exact
labels and annotations when it may, and, for ``keep_firing_for``, still firing until that runs out
after the inputs stop. A second test feeds values on the quiet side of the threshold.
Input samples and evaluations share one step per alert (``evaluation_interval`` = ``interval``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from alert_rules import slo
from alert_rules.config import RulesConfig
from alert_rules.spec import AlertRule, RuleGroup, duration, number, selector
from alert_rules.windows import budget
from exporters import buckets
from exporters.catalog.engine import ENGINE_BATCH_REQUESTS, ENGINE_PREEMPTIONS, ENGINE_REQUESTS, KV_USAGE, SCRAPE_UP
from exporters.catalog.gpu import GPU_MEMORY_TOTAL, GPU_MEMORY_USED
from exporters.catalog.pipeline import LOG_RECORDS_DROPPED
from exporters.catalog.process import PROCESS_OOM_EVENTS, PROCESS_RESIDENT_MEMORY
from exporters.catalog.request import E2E_LATENCY_SECONDS, REQUESTS
from exporters.errors import ConfigError
from exporters.records import length_bucket_labels, long_length_buckets

MODEL = "test-model"
UPSTREAM = "http://127.0.0.1:8000"
_TEMPLATE = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


@dataclass(frozen=True, slots=True)
class Series:
    """One promtool input series: a selector and its expanding-notation values."""

    series: str
    values: str

    def to_dict(self) -> dict[str, str]:
        """The series as promtool reads it."""
        return {"series": self.series, "values": self.values}


@dataclass(frozen=True, slots=True)
class Scenario:
    """Inputs that make an alert's expression true from ``active_at_s``, and inputs that keep it false.

    ``stop_at_s``: the firing inputs end after this sample; ``false_from_s``: the first evaluation
    at which the expression is false again (needed to test ``keep_firing_for``).
    """

    step_s: int
    firing: tuple[Series, ...]
    quiet: tuple[Series, ...]
    active_at_s: int
    labels: dict[str, str] = field(default_factory=dict)
    false_from_s: int | None = None


def _values_counter(per_step: float, steps: int, start: float = 0) -> str:
    return f"{number(start)}+{number(per_step)}x{steps}"


def _values_gauge(value: float, steps: int) -> str:
    return f"{number(value)}x{steps}"


def _step_for(window_s: float, cap: int = 60) -> int:
    """An input step that leaves at least two samples in a window."""
    return max(1, min(cap, int(window_s) // 2))


def _first_eval_after(t: float, step: int) -> int:
    return int(math.floor(t / step) + 1) * step


def _ceil_to(t: float, step: int) -> int:
    return math.ceil(t / step) * step


def _above(threshold: float) -> float:
    """A value clearly above a ratio threshold, below 1 when the threshold is."""
    return min(threshold * 2, (threshold + 1) / 2) if threshold < 1 else threshold * 2 + 1


def _steps_needed(scenario_end_s: float, step: int) -> int:
    return int(scenario_end_s // step) + 3


def _request_series(model: str, per_step_ok: float, per_step_bad: float, steps: int,
                    length_bucket: str = "le512") -> tuple[Series, ...]:
    base = (("model_name", "=", model), ("route", "=", "/v1/completions"), ("length_bucket", "=", length_bucket))
    return (
        Series(selector(REQUESTS.series, *base, ("outcome", "=", "ok")), _values_counter(per_step_ok, steps)),
        Series(selector(REQUESTS.series, *base, ("outcome", "=", "upstream_error")),
               _values_counter(per_step_bad, steps)),
    )


def _ratio_traffic(ratio: float, total: int = 100000) -> tuple[float, float]:
    bad = round(total * ratio)
    return total - bad, bad


# --- one scenario per alert ---------------------------------------------------------------------------


def _swapped(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = _steps_needed(c.swap_for_s + 120, 60)
    s = selector(ENGINE_REQUESTS.series, ("model_name", "=", MODEL), ("state", "=", "swapped"))
    return Scenario(60, (Series(s, _values_gauge(3, n)),), (Series(s, _values_gauge(0, n)),), 0, {"model_name": MODEL})


def _preemption(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = _step_for(c.preemption_window_s)
    n = _steps_needed(c.preemption_for_s + 4 * step, step)
    s = selector(ENGINE_PREEMPTIONS.series, ("model_name", "=", MODEL))
    return Scenario(step, (Series(s, _values_counter(5, n)),), (Series(s, _values_gauge(7, n)),), step,
                    {"model_name": MODEL})


def _le_series(spec_bucket: str, model: str, per_step: dict[str, float], steps: int) -> tuple[Series, ...]:
    return tuple(
        Series(selector(spec_bucket, ("model_name", "=", model), ("le", "=", le)), _values_counter(v, steps))
        for le, v in per_step.items()
    )


def _latency_buckets(limit: float, slow: bool, steps: int) -> tuple[Series, ...]:
    """E2E histogram series whose p99 is above ``limit`` (slow) or clearly below it."""
    bounds = buckets.REQUEST_LATENCY
    above = next((b for b in bounds if b > limit), None)
    below = max((b for b in bounds if b < limit), default=None)
    les: dict[str, float] = {}
    if below is not None:
        les[slo.le_value(below)] = 0 if slow else 10
    if above is not None:
        les[slo.le_value(above)] = 0 if slow else 10
    les["+Inf"] = 10
    if below is None and not slow:
        raise ConfigError("rules", f"a latency limit of {limit:g} s is below every histogram bucket bound")
    return _le_series(E2E_LATENCY_SECONDS.bucket, MODEL, les, steps)


def _latency_sla(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = _step_for(c.sla_window_s)
    n = _steps_needed(c.sla_for_s + 4 * step, step)
    limit = c.sla_factor * c.sla_for(MODEL)
    if limit >= buckets.REQUEST_LATENCY[-1]:
        raise ConfigError("rules.sla_factor", "x the SLA is above the latency histogram's highest bound", limit)
    return Scenario(step, _latency_buckets(limit, True, n), _latency_buckets(limit, False, n), step,
                    {"model_name": MODEL})


def _gpu_memory(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = _steps_needed(c.gpu_memory_for_s + 120, 60)
    gpu = (("gpu", "=", "0"), ("uuid", "=", "GPU-0"))
    total = Series(selector(GPU_MEMORY_TOTAL.series, *gpu), _values_gauge(80e9, n))
    used = selector(GPU_MEMORY_USED.series, *gpu)
    return Scenario(
        60, (total, Series(used, _values_gauge(80e9 * _above(c.gpu_memory_ratio), n))),
        (total, Series(used, _values_gauge(80e9 * c.gpu_memory_ratio / 2, n))), 0, {"gpu": "0", "uuid": "GPU-0"},
    )


def _breaker(ratio_firing: float, ratio_quiet: float, c: RulesConfig, alert: AlertRule) -> Scenario:
    step = _step_for(c.breaker_window_s)
    fire_at = step + _ceil_to(c.breaker_for_s, step)
    stop = fire_at + 2 * step
    keep = alert.keep_firing_for_s
    end = (stop + c.breaker_window_s + keep + 2 * step) if keep else stop
    n = _steps_needed(end, step)
    firing = _request_series(MODEL, *_ratio_traffic(ratio_firing), (stop // step) if keep else n)
    quiet = _request_series(MODEL, *_ratio_traffic(ratio_quiet), n)
    # After the last sample at ``stop``, rate() needs two samples in [t - window, t]: false from here.
    false_from = _first_eval_after(stop - step + c.breaker_window_s, step) if keep else None
    return Scenario(step, firing, quiet, step, {"model_name": MODEL}, false_from)


def _degrade(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    between = (c.degrade_error_ratio + c.rollback_error_ratio) / 2
    firing = between if c.degrade_error_ratio < c.rollback_error_ratio else _above(c.degrade_error_ratio)
    return _breaker(firing, c.degrade_error_ratio / 2, c, alert)


def _rollback(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    return _breaker(_above(c.rollback_error_ratio), c.rollback_error_ratio / 2, c, alert)


def _oom(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = _step_for(c.oom_window_s, cap=5)
    s = selector(PROCESS_OOM_EVENTS.series, ("source", "=", "response_body"))
    jump = 3 * step
    n_before = jump // step
    after = _steps_needed(c.oom_window_s + 2 * step, step)
    firing = f"0x{n_before - 1} {c.oom_count}x{after}"
    quiet = f"0x{n_before - 1} {c.oom_count - 1}x{after}"
    # The jump lands at ``jump``; the window [t - w, t] sees both values until t - w passes ``jump - step``.
    false_from = _first_eval_after(jump - step + c.oom_window_s, step)
    return Scenario(step, (Series(s, firing),), (Series(s, quiet),), jump, {}, false_from)


def _leak(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = _step_for(c.leak_window_s)
    n = _steps_needed(c.leak_for_s + 4 * step, step)
    base = 4e9
    growth = base * 2 * c.leak_growth_per_hour * step / 3600  # twice the threshold's growth per step
    s = PROCESS_RESIDENT_MEMORY.series
    return Scenario(step, (Series(s, _values_counter(growth, n, base)),), (Series(s, _values_gauge(base, n)),), step)


def _long_context(c: RulesConfig, alert: AlertRule, edges: tuple[int, ...]) -> Scenario:
    step = _step_for(c.long_context_window_s)
    n = _steps_needed(c.long_context_for_s + 4 * step, step)
    long_bucket = long_length_buckets(edges, above=c.long_context_tokens)[0]
    short_bucket = length_bucket_labels(edges)[0]
    # Plenty of healthy short traffic: averaged together, the long prompts' failures would vanish.
    short = _request_series(MODEL, 10**6, 0, n, short_bucket)
    firing = short + _request_series(MODEL, *_ratio_traffic(_above(c.long_context_error_ratio), 1000), n, long_bucket)
    quiet = short + _request_series(MODEL, *_ratio_traffic(c.long_context_error_ratio / 2, 1000), n, long_bucket)
    return Scenario(step, firing, quiet, step, {"model_name": MODEL})


def _queue(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = _steps_needed(c.queue_for_s + 120, 60)
    s = selector(ENGINE_REQUESTS.series, ("model_name", "=", MODEL), ("state", "=", "waiting"))
    return Scenario(60, (Series(s, _values_gauge(c.queue_waiting * 2 + 1, n)),),
                    (Series(s, _values_gauge(c.queue_waiting / 2, n)),), 0, {"model_name": MODEL})


def _upstream_down(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = 60 if c.upstream_down_for_s % 60 == 0 else 15
    n = _steps_needed(c.upstream_down_for_s + 2 * step, step)
    s = selector(SCRAPE_UP.series, ("upstream", "=", UPSTREAM))
    return Scenario(step, (Series(s, _values_gauge(0, n)),), (Series(s, _values_gauge(1, n)),), 0,
                    {"upstream": UPSTREAM})


def _kv_cache(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = _steps_needed(c.kv_cache_for_s + 120, 60)
    s = selector(KV_USAGE.series, ("model_name", "=", MODEL))
    return Scenario(60, (Series(s, _values_gauge(_above(c.kv_cache_ratio), n)),),
                    (Series(s, _values_gauge(c.kv_cache_ratio / 2, n)),), 0, {"model_name": MODEL})


def _log_drops(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = _step_for(c.log_drops_window_s)
    n = _steps_needed(4 * step, step)
    full = Series(selector(LOG_RECORDS_DROPPED.series, ("reason", "=", "queue_full")), _values_counter(10, n))
    flat = Series(full.series, _values_gauge(4, n))
    # Sampling drops are by design: they never alert.
    sampled = Series(selector(LOG_RECORDS_DROPPED.series, ("reason", "=", "sampling")), _values_counter(50, n))
    return Scenario(step, (full, sampled), (flat, sampled), step)


def _batch(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    bounds = ENGINE_BATCH_REQUESTS.buckets or ()
    if not bounds or not bounds[0] < c.max_num_seqs <= bounds[-1]:
        raise ConfigError(
            "rules.max_num_seqs",
            f"must lie above {bounds[0]:g} and at most {bounds[-1]:g}, the batch-size histogram's bounds",
            c.max_num_seqs,
        )
    step = _step_for(c.batch_window_s)
    n = _steps_needed(c.batch_window_s + 4 * step, step)
    les = [slo.le_value(b) for b in bounds] + ["+Inf"]
    small = dict.fromkeys(les, 10.0)  # every batch of one request: p75 <= the lowest bound
    full = {le: (10.0 if le == "+Inf" else 0.0) for le in les}  # every batch above the top bound
    return Scenario(
        step, _le_series(ENGINE_BATCH_REQUESTS.bucket, MODEL, small, n),
        _le_series(ENGINE_BATCH_REQUESTS.bucket, MODEL, full, n), step, {"model_name": MODEL},
    )


def _availability(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = _steps_needed(600, 60)
    quiet_ratio = budget(c.slo_objective) / 2
    return Scenario(60, _request_series(MODEL, *_ratio_traffic(0.5), n),
                    _request_series(MODEL, *_ratio_traffic(float(quiet_ratio), 10**6), n), 60,
                    {"model_name": MODEL, "slo": "availability"})


def _latency_slo(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = _steps_needed(600, 60)
    le = slo.le_value(c.slo_latency_threshold_s)
    quiet_ratio = float(budget(c.slo_objective) / 2)

    def series(bad_ratio: float) -> tuple[Series, ...]:
        total = 10**6
        fast = total - round(total * bad_ratio)
        model = ("model_name", "=", MODEL)
        return (
            Series(selector(E2E_LATENCY_SECONDS.count, model), _values_counter(total, n)),
            Series(selector(E2E_LATENCY_SECONDS.bucket, model, ("le", "=", le)), _values_counter(fast, n)),
        )

    return Scenario(60, series(0.5), series(quiet_ratio), 60, {"model_name": MODEL, "slo": "latency"})


ScenarioBuilder = Callable[[RulesConfig, AlertRule, tuple[int, ...]], Scenario]

SCENARIOS: dict[str, ScenarioBuilder] = {
    "InferwatchRequestsSwapped": _swapped,
    "InferwatchPreemptionStorm": _preemption,
    "InferwatchLatencyAboveSLA": _latency_sla,
    "InferwatchGpuMemoryHigh": _gpu_memory,
    "InferwatchCircuitBreakerDegrade": _degrade,
    "InferwatchCircuitBreakerRollback": _rollback,
    "InferwatchOOMBurst": _oom,
    "InferwatchUpstreamMemoryLeak": _leak,
    "InferwatchLongContextFailures": _long_context,
    "InferwatchQueueBacklog": _queue,
    "InferwatchUpstreamDown": _upstream_down,
    "InferwatchKVCacheNearlyFull": _kv_cache,
    "InferwatchLogRecordsDropped": _log_drops,
    "InferwatchBatchSizeAdvice": _batch,
    "InferwatchAvailabilityBudgetBurnPage": _availability,
    "InferwatchAvailabilityBudgetBurnTicket": _availability,
    "InferwatchLatencyBudgetBurnPage": _latency_slo,
    "InferwatchLatencyBudgetBurnTicket": _latency_slo,
}
"""Alert name -> scenario. A test fails when an alert has none."""


def render_annotations(alert: AlertRule, labels: dict[str, str]) -> dict[str, str]:
    """The annotations as Prometheus renders them for an alert instance with these labels."""
    out = {}
    for key, text in alert.all_annotations.items():
        rendered = _TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), text)
        if "{{" in rendered:
            raise ValueError(f"alert {alert.name}: annotation {key} uses a template testgen cannot render")
        out[key] = rendered
    return out


def _expected(alert: AlertRule, scenario: Scenario) -> list[dict[str, Any]]:
    labels = {**scenario.labels, **alert.all_labels}
    return [{"exp_labels": dict(sorted(labels.items())), "exp_annotations": render_annotations(alert, labels)}]


def _check(alert: AlertRule, t: int, expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": duration(t), "alertname": alert.name, "exp_alerts": expected}


def fire_time(alert: AlertRule, scenario: Scenario) -> int:
    """The first evaluation at which the alert fires in its scenario."""
    return scenario.active_at_s + _ceil_to(alert.for_s, scenario.step_s)


def promtool_file(alert: AlertRule, scenario: Scenario, rule_files: list[str]) -> dict[str, Any]:
    """The promtool test file of one alert."""
    step = scenario.step_s
    fires = fire_time(alert, scenario)
    expected = _expected(alert, scenario)
    checks = []
    before = fires - step
    if before >= 0:
        checks.append(_check(alert, before, []))  # pending (or not yet active): no alert
    checks.append(_check(alert, fires, expected))
    if scenario.false_from_s is not None:
        keep = _ceil_to(alert.keep_firing_for_s, step)
        if keep:
            checks.append(_check(alert, scenario.false_from_s + keep - step, expected))
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
    """Alert name -> its promtool test file, loading every rule file (recordings included).

    Raises:
        KeyError: an alert has no scenario (every alert must be tested).
    """
    files = sorted({f"{rules_dir}/{g.file}.yml" for g in groups})
    out: dict[str, dict[str, Any]] = {}
    for group in groups:
        for alert in group.alerts():
            if alert.name not in SCENARIOS:
                raise KeyError(f"alert {alert.name} has no promtool scenario in alert_rules.testgen.SCENARIOS")
            scenario = SCENARIOS[alert.name](config, alert, tuple(length_edges))
            out[alert.name] = promtool_file(alert, scenario, files)
    return out


__all__ = ["SCENARIOS", "Scenario", "Series", "fire_time", "promtool_file", "promtool_files", "render_annotations"]

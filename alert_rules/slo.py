"""SLOs on the sidecar's request metrics: SLI recording rules and multi-window burn-rate alerts.

Two SLOs per model: availability (share of requests whose outcome is an error) and latency
(share of requests slower than a latency bucket bound). Raw samples are read only at the
evaluation instant: a recording rule sums each SLO's event counters per model, and every
window's error ratio is a ``rate()`` over those recorded sums. So the long windows (6h, 3d)
read recording-rule outputs, never raw series, and the embedded evaluator's memory stays
bounded by the number of models, not by the number of raw series.

A recorded sum of counters drops when one of its series disappears (the sidecar restarts and
all of them reset together, which ``rate()`` handles as one reset).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from alert_rules.config import RulesConfig
from alert_rules.spec import AlertRule, RecordingRule, RuleGroup, Severity, any_of, duration, number, selector
from alert_rules.windows import WINDOW_PAIRS, WindowPair, threshold, windows_used
from exporters import buckets
from exporters.catalog.recordings import SLO_BAD_EVENTS, SLO_EVENTS, slo_error_ratio
from exporters.catalog.request import E2E_LATENCY_SECONDS, REQUESTS
from exporters.errors import ConfigError
from exporters.records import Outcome

EVENTS = SLO_EVENTS.series
"""Recorded: every event an SLO counts, per model and ``slo``."""
BAD_EVENTS = SLO_BAD_EVENTS.series
"""Recorded: the events that miss the SLO, per model and ``slo``."""

BY = "model_name"


def error_outcomes() -> tuple[str, ...]:
    """Outcomes that count against availability, as label values."""
    return tuple(str(o) for o in Outcome if o.is_error)


def le_value(bound: float) -> str:
    """The ``le`` label value the exporter writes for a bucket bound (``10`` -> ``10.0``)."""
    return str(floatToGoString(bound))


def error_ratio_name(window_s: int) -> str:
    """Name of the recorded error ratio over a window."""
    return slo_error_ratio(duration(window_s))


@dataclass(frozen=True, slots=True)
class Slo:
    """One SLO: its name, the PromQL of all events and of bad events (counters, summed per model)."""

    name: str
    title: str
    events: str
    bad_events: str


def availability() -> Slo:
    """Availability: requests whose outcome is an upstream error, a timeout or an overload are bad."""
    total = f"sum by ({BY}) ({REQUESTS.series})"
    errors = f"sum by ({BY}) ({selector(REQUESTS.series, ('outcome', '=~', any_of(error_outcomes())))})"
    # A model without any error series yet still gets a 0, so its first error is counted.
    return Slo("availability", "availability", total, f"{errors} or ({total} * 0)")


def latency(threshold_s: float) -> Slo:
    """Latency: requests slower than ``threshold_s`` (a bucket bound of the e2e histogram) are bad."""
    if threshold_s not in buckets.REQUEST_LATENCY:
        bounds = ", ".join(f"{b:g}" for b in buckets.REQUEST_LATENCY)
        raise ConfigError(
            "rules.slo_latency_threshold_s",
            f"must equal a bucket bound of the end-to-end latency histogram; the bounds are {bounds}",
            threshold_s,
        )
    total = f"sum by ({BY}) ({E2E_LATENCY_SECONDS.count})"
    fast = f"sum by ({BY}) ({selector(E2E_LATENCY_SECONDS.bucket, ('le', '=', le_value(threshold_s)))})"
    return Slo("latency", f"latency (requests slower than {threshold_s:g} s)", total, f"{total} - {fast}")


def slos(config: RulesConfig) -> tuple[Slo, ...]:
    """The SLOs the config asks for."""
    return (availability(), latency(config.slo_latency_threshold_s))


def recording_rules(config: RulesConfig) -> tuple[RecordingRule, ...]:
    """Per-SLO event sums, then one error-ratio rule per window covering every SLO."""
    rules: list[RecordingRule] = []
    for slo in slos(config):
        rules.append(RecordingRule(EVENTS, slo.events, {"slo": slo.name}))
        rules.append(RecordingRule(BAD_EVENTS, slo.bad_events, {"slo": slo.name}))
    for window in windows_used(WINDOW_PAIRS):
        w = duration(window)
        expr = f"rate({BAD_EVENTS}[{w}]) / rate({EVENTS}[{w}])"
        rules.append(RecordingRule(error_ratio_name(window), expr))
    return tuple(rules)


def _pair_condition(slo: Slo, pair: WindowPair, config: RulesConfig) -> str:
    limit = number(threshold(pair, config.slo_objective, config.slo_period_days))
    long_ = selector(error_ratio_name(pair.long_s), ("slo", "=", slo.name))
    short = selector(error_ratio_name(pair.short_s), ("slo", "=", slo.name))
    return f"({long_} > {limit} and {short} > {limit})"


def _describe(pair: WindowPair, config: RulesConfig) -> str:
    factor = pair.factor(config.slo_period_days)
    limit = threshold(pair, config.slo_objective, config.slo_period_days)
    return (
        f"{factor.normalize():f}x the budget rate (error ratio above {limit * 100:g} %) over both "
        f"{duration(pair.long_s)} and {duration(pair.short_s)}"
    )


def burn_alerts(config: RulesConfig) -> tuple[AlertRule, ...]:
    """A page and a ticket alert per SLO, each the OR of its window pairs."""
    alerts: list[AlertRule] = []
    objective = f"{config.slo_objective * 100:g} %"
    for slo in slos(config):
        for severity, suffix, what in (
            (Severity.CRITICAL, "Page", "fast enough to page"),
            (Severity.WARNING, "Ticket", "steadily enough to need a ticket"),
        ):
            pairs = [p for p in WINDOW_PAIRS if p.severity is severity]
            expr = "\n  or\n".join(_pair_condition(slo, p, config) for p in pairs)
            conditions = "; or ".join(_describe(p, config) for p in pairs)
            name = f"Inferwatch{slo.name.capitalize()}BudgetBurn{suffix}"
            alerts.append(AlertRule(
                name=name,
                expr=expr,
                severity=severity,
                labels={"slo": slo.name},
                summary=f"A model is burning its {slo.name} error budget {what}.",
                description=(
                    f"Model {{{{ $labels.model_name }}}} misses its {slo.title} SLO of {objective} "
                    f"over {config.slo_period_days} days at {conditions}."
                ),
            ))
    return tuple(alerts)


def rule_groups(config: RulesConfig) -> tuple[RuleGroup, ...]:
    """The SLO group: recordings first, so the alerts read this evaluation's ratios."""
    rules = (*recording_rules(config), *burn_alerts(config))
    return (RuleGroup("inferwatch-slo", rules, config.evaluation_interval_s, file="slo"),)


__all__ = [
    "BAD_EVENTS", "EVENTS", "Slo", "availability", "burn_alerts", "error_outcomes",
    "error_ratio_name", "latency", "le_value", "recording_rules", "rule_groups", "slos",
]

"""SLOs on the sidecar's request metrics: SLI recording rules and multi-window burn-rate alerts.

Two SLOs per model: availability (share of requests whose outcome is an error) and latency
(share of requests slower than a latency bucket bound). Raw samples are read only at the
evaluation instant: a recording rule sums each SLO's event counters per model and scrape target
(``instance``: one sidecar), and every window's error ratio sums the ``rate()`` of those recorded
sums over the instances of a model, then divides (bad over all, summed over replicas). So the
long windows (6h, 3d) read recording-rule outputs, never raw series, and the embedded
evaluator's memory stays bounded by the number of models and replicas, not by the number of raw
series.

A recorded sum of counters drops when one of its series disappears: one sidecar restarts and all
of its counters reset together, which ``rate()`` handles as one reset of that instance's sum. The
sum is per instance for that reason: summed across replicas, one pod's restart would look like a
reset of the whole fleet's sum, and ``rate()`` would count every other pod's total as new events.
The embedded evaluator reads its own sidecar's series, which have no ``instance``: one group.

vLLM's own admission rejections (its admission-rejection counter, 0.33: 503s at
``--max-num-queued-reqs`` / ``--max-num-queued-tokens``) count against availability, once. A rejection
of a request that came through the sidecar is already one of its ``overloaded`` outcomes; one that
bypassed the sidecar is seen only in vLLM's counter. The sidecar cannot tell them apart request by
request, so over each window and per instance the unseen ones are estimated as
``max(0, rate(vLLM's rejections) - rate(the sidecar's overloaded answers))`` and added to both bad and
all events. It never double counts a rejection the sidecar forwarded; it undercounts bypassing
rejections while the sidecar itself sheds or forwards 429s in the same window (those fill the
``overloaded`` side). Without vLLM's counter (before 0.33, or no scrape) the ratio is the sidecar's
alone.

Both SLOs count only the requests that run the model: the inference routes
(:data:`exporters.catalog.request.INFERENCE_ROUTES`: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/v1/responses``); ``/v1/models`` (polled by health checks and gateways) and
``other`` (unknown paths) do not count.

A burn-rate condition needs evidence as well as a ratio: its long window must hold at least
``rules.slo_min_requests`` of the SLO's requests (a recorded count per window, the ratio's
denominator), so a few failures with no other traffic, an error ratio of 100 %, page nobody.

Each SLO carries the promtool scenario of its burn alerts; their runbooks are written here too.
"""

from __future__ import annotations

from dataclasses import dataclass

from alert_rules.config import RulesConfig
from alert_rules.runbooks import EXPLAIN_SLOWEST, KV_FIXES, ROLLBACK, SHED, Runbook
from alert_rules.scenario import (
    MODEL,
    Scenario,
    ScenarioBuilder,
    Series,
    counter_values,
    ratio_traffic,
    request_series,
    steps_needed,
)
from alert_rules.spec import AlertRule, RecordingRule, RuleGroup, Severity, any_of, duration, number, selector
from alert_rules.windows import WINDOW_PAIRS, WindowPair, budget, long_windows, threshold, windows_used
from exporters import buckets
from exporters.catalog.engine import ENGINE_ADMISSION_REJECTIONS
from exporters.catalog.recordings import (
    SLO_BAD_EVENTS,
    SLO_ENGINE_REJECTIONS,
    SLO_EVENTS,
    SLO_OVERLOADED_SEEN,
    slo_error_ratio,
    slo_events_increase,
)
from exporters.catalog.request import E2E_LATENCY_SECONDS, INFERENCE_ROUTES, REQUESTS
from exporters.errors import ConfigError
from exporters.records import Outcome

EVENTS = SLO_EVENTS.series
"""Recorded: every event an SLO counts, per model and ``slo``."""
BAD_EVENTS = SLO_BAD_EVENTS.series
"""Recorded: the events that miss the SLO, per model and ``slo``."""
ENGINE_REJECTIONS = SLO_ENGINE_REJECTIONS.series
"""Recorded: vLLM's own admission rejections per model and instance (``slo="availability"``)."""
OVERLOADED_SEEN = SLO_OVERLOADED_SEEN.series
"""Recorded: the sidecar's overloaded answers per model and instance (``slo="availability"``)."""

BY = "model_name, instance"
"""Event sums are kept per model and scrape target, so each one resets only with its own sidecar."""
RATIO_BY = "model_name, slo"
"""Error ratios aggregate across instances: the rates of the per-instance sums, summed by model and SLO."""
SERVED = ("route", "=~", any_of(INFERENCE_ROUTES))
"""The matcher of the requests the SLOs count: the inference routes."""


def error_outcomes() -> tuple[str, ...]:
    """Outcomes that count against availability, as label values."""
    return tuple(str(o) for o in Outcome if o.is_error)


def le_value(bound: float) -> str:
    """The ``le`` label value the exporter writes for a bucket bound (``10`` -> ``10.0``)."""
    return buckets.le_label(bound)


def error_ratio_name(window_s: int) -> str:
    """Name of the recorded error ratio over a window."""
    return slo_error_ratio(duration(window_s))


def events_count_name(window_s: int) -> str:
    """Name of the recorded count of an SLO's requests over a window."""
    return slo_events_increase(duration(window_s))


@dataclass(frozen=True, slots=True)
class Slo:
    """One SLO: its name, the PromQL of all events and of bad events (counters, summed per model).

    ``bad_requests`` names the bad events in the runbooks; ``scenario`` tests its burn alerts.
    """

    name: str
    title: str
    events: str
    bad_events: str
    bad_requests: str
    scenario: ScenarioBuilder


def _availability_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    """Firing: the sidecar sees almost no errors, but vLLM rejects as many requests again that bypassed it.

    Quiet: every vLLM rejection came through the sidecar as an ``overloaded`` answer, at 0.6 x the budget;
    counted twice it would be 1.2 x the budget and the ticket alert would fire.
    """
    n = steps_needed(600, 60)
    quiet_ratio = float(budget(c.slo_objective)) / 4
    model = ("model_name", "=", MODEL)
    rejected = selector(ENGINE_ADMISSION_REJECTIONS.series, model, ("reason", "=", "max_num_queued_reqs"))
    overloaded = selector(REQUESTS.series, model, ("route", "=", "/v1/completions"), ("length_bucket", "=", "le512"),
                          ("outcome", "=", "overloaded"))
    firing = (*request_series(MODEL, *ratio_traffic(quiet_ratio), n), Series(rejected, counter_values(10**5, n)))
    total, seen = 10**6, round(10**6 * float(budget(c.slo_objective)) * 0.6)
    quiet = (*request_series(MODEL, total - seen, 0, n), Series(overloaded, counter_values(seen, n)),
             Series(rejected, counter_values(seen, n)))
    return Scenario(60, firing, quiet, 60, {"model_name": MODEL, "slo": "availability"})


def _latency_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = steps_needed(600, 60)
    le = le_value(c.slo_latency_threshold_s)
    quiet_ratio = float(budget(c.slo_objective) / 2)

    def series(bad_ratio: float) -> tuple[Series, ...]:
        total = 10**6
        fast = total - round(total * bad_ratio)
        model, route = ("model_name", "=", MODEL), ("route", "=", "/v1/chat/completions")
        return (
            Series(selector(E2E_LATENCY_SECONDS.count, model, route), counter_values(total, n)),
            Series(selector(E2E_LATENCY_SECONDS.bucket, model, route, ("le", "=", le)), counter_values(fast, n)),
        )

    return Scenario(60, series(0.5), series(quiet_ratio), 60, {"model_name": MODEL, "slo": "latency"})


def availability() -> Slo:
    """Availability: inference requests whose outcome is an upstream error, a timeout or an overload are bad."""
    total = f"sum by ({BY}) ({selector(REQUESTS.series, SERVED)})"
    errors = f"sum by ({BY}) ({selector(REQUESTS.series, SERVED, ('outcome', '=~', any_of(error_outcomes())))})"
    # A model without any error series yet still gets a 0, so its first error is counted.
    return Slo("availability", "availability", total, f"{errors} or ({total} * 0)", "failing requests",
               _availability_scenario)


def latency(threshold_s: float) -> Slo:
    """Latency: inference requests slower than ``threshold_s`` (a bucket bound of the e2e histogram) are bad."""
    if threshold_s not in buckets.REQUEST_LATENCY:
        bounds = ", ".join(f"{b:g}" for b in buckets.REQUEST_LATENCY)
        raise ConfigError(
            "rules.slo_latency_threshold_s",
            f"must equal a bucket bound of the end-to-end latency histogram; the bounds are {bounds}",
            threshold_s,
        )
    total = f"sum by ({BY}) ({selector(E2E_LATENCY_SECONDS.count, SERVED)})"
    fast = f"sum by ({BY}) ({selector(E2E_LATENCY_SECONDS.bucket, SERVED, ('le', '=', le_value(threshold_s)))})"
    return Slo("latency", f"latency (requests slower than {threshold_s:g} s)", total, f"{total} - {fast}",
               "slow requests", _latency_scenario)


def slos(config: RulesConfig) -> tuple[Slo, ...]:
    """The SLOs the config asks for."""
    return (availability(), latency(config.slo_latency_threshold_s))


def recording_rules(config: RulesConfig) -> tuple[RecordingRule, ...]:
    """Per-SLO event sums per instance, one error-ratio rule per window covering every SLO and model, then the
    count of events over each long window (the burn alerts' minimum)."""
    rules: list[RecordingRule] = []
    for slo in slos(config):
        rules.append(RecordingRule(EVENTS, slo.events, {"slo": slo.name}))
        rules.append(RecordingRule(BAD_EVENTS, slo.bad_events, {"slo": slo.name}))
    avail = {"slo": "availability"}
    every = f"sum by ({BY}) ({selector(REQUESTS.series, SERVED)})"
    rules.append(RecordingRule(ENGINE_REJECTIONS, f"sum by ({BY}) ({ENGINE_ADMISSION_REJECTIONS.series})", avail))
    overloaded = f"sum by ({BY}) ({selector(REQUESTS.series, SERVED, ('outcome', '=', 'overloaded'))})"
    rules.append(RecordingRule(OVERLOADED_SEEN, f"{overloaded} or ({every} * 0)", avail))
    for window in windows_used(WINDOW_PAIRS):
        w = duration(window)
        bad = f"sum by ({RATIO_BY}) (rate({BAD_EVENTS}[{w}]))"
        every_rate = f"sum by ({RATIO_BY}) (rate({EVENTS}[{w}]))"
        # vLLM's rejections the sidecar did not answer itself (see the module docstring): never below 0.
        unseen = f"sum by ({RATIO_BY}) (clamp_min(rate({ENGINE_REJECTIONS}[{w}]) - rate({OVERLOADED_SEEN}[{w}]), 0))"
        expr = f"({bad} + {unseen}) / ({every_rate} + {unseen}) or {bad} / {every_rate}"
        rules.append(RecordingRule(error_ratio_name(window), expr))
    for window in long_windows(WINDOW_PAIRS):
        # The same events as the ratio's denominator, as a count: the SLO's requests plus unseen rejections.
        w = duration(window)
        count = f"sum by ({RATIO_BY}) (increase({EVENTS}[{w}]))"
        unseen = (f"sum by ({RATIO_BY}) (clamp_min(increase({ENGINE_REJECTIONS}[{w}]) - "
                  f"increase({OVERLOADED_SEEN}[{w}]), 0))")
        rules.append(RecordingRule(events_count_name(window), f"{count} + {unseen} or {count}"))
    return tuple(rules)


def _pair_condition(slo: Slo, pair: WindowPair, config: RulesConfig) -> str:
    limit = number(threshold(pair, config.slo_objective, config.slo_period_days))
    long_ = selector(error_ratio_name(pair.long_s), ("slo", "=", slo.name))
    short = selector(error_ratio_name(pair.short_s), ("slo", "=", slo.name))
    if not config.slo_min_requests:
        return f"({long_} > {limit} and {short} > {limit})"
    count = selector(events_count_name(pair.long_s), ("slo", "=", slo.name))
    return f"({long_} > {limit} and {short} > {limit} and {count} >= {config.slo_min_requests})"


def _describe(pair: WindowPair, config: RulesConfig) -> str:
    factor = pair.factor(config.slo_period_days)
    limit = threshold(pair, config.slo_objective, config.slo_period_days)
    text = (
        f"{factor.normalize():f}x the budget rate (error ratio above {limit * 100:g} %) over both "
        f"{duration(pair.long_s)} and {duration(pair.short_s)}"
    )
    if config.slo_min_requests:
        text += f" with at least {config.slo_min_requests} requests in the {duration(pair.long_s)}"
    return text


_BURN_CHECKS = (
    "Check which outcome or length bucket carries the errors, and what changed last.",
    "Look at queue length, preemptions and KV cache usage for saturation.",
)
_REJECTION_CHECK = (
    "Admission rejections on the engine board: vLLM's own 503s at `--max-num-queued-reqs` / "
    "`--max-num-queued-tokens` count against availability once each. Those that came through the sidecar "
    "are its `overloaded` answers; those that bypassed it are the excess of vLLM's count over the sidecar's "
    "overloaded answers in the same window (an excess while nobody should bypass the sidecar means clients "
    "talk to vLLM directly)."
)


def _evidence(config: RulesConfig) -> str:
    """What the SLO counts, and the minimum of requests a burn condition needs, in runbook words."""
    routes = ", ".join(f"`{r}`" for r in INFERENCE_ROUTES)
    text = f" Only inference requests count ({routes}; not `/v1/models` or other paths)"
    if not config.slo_min_requests:
        return text + "."
    return (text + f", and a condition holds only with at least {config.slo_min_requests} of them in its long "
            "window (`rules.slo_min_requests`): at lower traffic this alert stays silent, so check the error "
            "ratio on the SLO board when traffic is low.")


def _burn_runbook(slo: Slo, severity: Severity, config: RulesConfig) -> Runbook:
    """A page: the budget will be gone in hours to days; a ticket: the SLO will be missed this period."""
    bad = slo.bad_requests.capitalize()
    checks = (*_BURN_CHECKS, _REJECTION_CHECK) if slo.name == "availability" else (*_BURN_CHECKS, EXPLAIN_SLOWEST)
    if severity is Severity.CRITICAL:
        return Runbook(
            f"{bad} are spending the {slo.name} error budget so fast that, at this pace, "
            f"it will be gone in hours to days (multi-window burn rate: 14.4x over 1h and 5m, or 6x over "
            f"6h and 30m).{_evidence(config)}",
            checks,
            (ROLLBACK, SHED, *KV_FIXES[:2], "Send long prompts to a separate queue."),
        )
    return Runbook(
        f"{bad} spend the {slo.name} error budget at least as fast as it accrues "
        f"(1x over 3d and 6h): the SLO will be missed by the end of the period.{_evidence(config)}",
        checks,
        ("Find and fix the steady source of bad requests in working hours.", *KV_FIXES[:2]),
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
                runbook=_burn_runbook(slo, severity, config),
                scenario=slo.scenario,
            ))
    return tuple(alerts)


def rule_groups(config: RulesConfig) -> tuple[RuleGroup, ...]:
    """The SLO group: recordings first, so the alerts read this evaluation's ratios."""
    rules: tuple[RecordingRule | AlertRule, ...] = (*recording_rules(config), *burn_alerts(config))
    return (RuleGroup("inferwatch-slo", rules, config.evaluation_interval_s, file="slo"),)


__all__ = [
    "BAD_EVENTS", "EVENTS", "Slo", "availability", "burn_alerts", "error_outcomes",
    "error_ratio_name", "latency", "le_value", "recording_rules", "rule_groups", "slos",
]

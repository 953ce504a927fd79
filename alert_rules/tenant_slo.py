"""Per-tenant SLOs: each tenant's availability and latency against the models' objective, with a ticket naming it.

The same two SLOs as :mod:`alert_rules.slo`, per tenant and model, read from the usage family
(``inferwatch_usage_requests``: inference requests only, by outcome) and the per-tenant latency
histogram (exporters/catalog/usage.py). Tenants are bounded labels (``serve.max_tenants`` named,
then ``other``), so these rules stay bounded too. Only the ticket pair (3d and 6h at 1x the budget)
is evaluated: a page per tenant would page for one customer's bad prompts, while the model-wide
pages already cover an outage. Like the model-wide SLOs, a condition needs
``rules.slo_min_requests`` of the tenant's requests in the long window.
"""

from __future__ import annotations

from alert_rules.config import RulesConfig
from alert_rules.scenario import MODEL, Scenario, Series, counter_values, steps_needed
from alert_rules.slo import error_outcomes, le_value
from alert_rules.spec import (
    AlertRule,
    RecordingRule,
    RuleGroup,
    Runbook,
    Severity,
    any_of,
    duration,
    number,
    selector,
)
from alert_rules.windows import TICKET, budget, threshold
from exporters.catalog import usage as cat
from exporters.errors import ConfigError

TENANT = "acme"
"""The tenant of the scenario's series."""
BY = "tenant, model_name, instance"
RATIO_BY = "tenant, model_name, slo"
ALERT = "InferwatchTenantBudgetBurnTicket"


def _events(threshold_s: float) -> tuple[tuple[str, str, str], ...]:
    """(slo, all events, bad events) per tenant, model and instance."""
    if threshold_s not in cat.TENANT_LATENCY_BUCKETS:
        bounds = ", ".join(f"{b:g}" for b in cat.TENANT_LATENCY_BUCKETS)
        raise ConfigError("rules.slo_latency_threshold_s",
                          f"must equal a bucket bound of the per-tenant latency histogram; the bounds are {bounds}",
                          threshold_s)
    requests = f"sum by ({BY}) ({cat.USAGE_REQUESTS.series})"
    errors = f"sum by ({BY}) ({selector(cat.USAGE_REQUESTS.series, ('outcome', '=~', any_of(error_outcomes())))})"
    latency = f"sum by ({BY}) ({cat.TENANT_LATENCY_SECONDS.count})"
    fast = (f"sum by ({BY}) "
            f"({selector(cat.TENANT_LATENCY_SECONDS.bucket, ('le', '=', le_value(threshold_s)))})")
    return (("availability", requests, f"{errors} or ({requests} * 0)"), ("latency", latency, f"{latency} - {fast}"))


def recording_rules(config: RulesConfig) -> tuple[RecordingRule, ...]:
    """Event sums per tenant, model and instance; the ticket windows' ratios and the long window's count."""
    rules: list[RecordingRule] = []
    for slo, every, bad in _events(config.slo_latency_threshold_s):
        rules.append(RecordingRule(cat.TENANT_SLO_EVENTS.series, every, {"slo": slo}))
        rules.append(RecordingRule(cat.TENANT_SLO_BAD_EVENTS.series, bad, {"slo": slo}))
    for window in (TICKET.long_s, TICKET.short_s):
        w = duration(window)
        bad = f"sum by ({RATIO_BY}) (rate({cat.TENANT_SLO_BAD_EVENTS.series}[{w}]))"
        every = f"sum by ({RATIO_BY}) (rate({cat.TENANT_SLO_EVENTS.series}[{w}]))"
        rules.append(RecordingRule(cat.tenant_slo_error_ratio(w), f"{bad} / {every}"))
    long_ = duration(TICKET.long_s)
    rules.append(RecordingRule(cat.tenant_slo_events_increase(long_),
                               f"sum by ({RATIO_BY}) (increase({cat.TENANT_SLO_EVENTS.series}[{long_}]))"))
    return tuple(rules)


def _scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    """Firing: half the tenant's requests fail. Quiet: a quarter of the budget fails."""
    n = steps_needed(600, 60)

    def series(bad_ratio: float) -> tuple[Series, ...]:
        total = 10**6
        bad = round(total * bad_ratio)
        labels = (("tenant", "=", TENANT), ("model_name", "=", MODEL), ("pool", "=", "base"))
        return (Series(selector(cat.USAGE_REQUESTS.series, *labels, ("outcome", "=", "ok")),
                       counter_values(total - bad, n)),
                Series(selector(cat.USAGE_REQUESTS.series, *labels, ("outcome", "=", "upstream_error")),
                       counter_values(bad, n)))

    return Scenario(60, series(0.5), series(float(budget(c.slo_objective)) / 4), 60,
                    {"tenant": TENANT, "model_name": MODEL, "slo": "availability"})


def burn_ticket(config: RulesConfig) -> AlertRule:
    """The ticket: a tenant's error ratio above the budget over both 3d and 6h, with enough of its requests."""
    limit = number(threshold(TICKET, config.slo_objective, config.slo_period_days))
    long_, short = duration(TICKET.long_s), duration(TICKET.short_s)
    expr = f"{cat.tenant_slo_error_ratio(long_)} > {limit} and {cat.tenant_slo_error_ratio(short)} > {limit}"
    if config.slo_min_requests:
        expr += f" and {cat.tenant_slo_events_increase(long_)} >= {config.slo_min_requests}"
    objective = f"{config.slo_objective * 100:g} %"
    return AlertRule(
        name=ALERT, expr=expr, severity=Severity.WARNING,
        summary="A tenant is burning its error budget steadily enough to need a ticket.",
        description=(
            f"Tenant {{{{ $labels.tenant }}}} misses the {{{{ $labels.slo }}}} SLO of {objective} on model "
            f"{{{{ $labels.model_name }}}}: its error ratio is above the budget ({limit}) over both {long_} and "
            f"{short}" + (f" with at least {config.slo_min_requests} of its requests in the {long_}."
                          if config.slo_min_requests else ".")
        ),
        runbook=Runbook(
            "One tenant's requests fail (availability) or are slow (latency, slower than "
            "rules.slo_latency_threshold_s) at least as fast as the budget accrues, over 3d and 6h, while the "
            "model-wide SLO may be fine: something about that tenant's traffic. The tenant is the one named "
            "(`serve.max_tenants` are named, the rest share `other`).",
            ("The Tenants board: the tenant's outcomes, cost pool and latency against the others'.",
             "Its requests' prompt lengths and pools (long_context?), and `inferwatch explain --slowest 10 --since "
             "1h` for its slow ones.",
             "Whether its requests are the ones shed or overloaded (priority header, serve.max_inflight)."),
            ("Tell the tenant what fails and why (too long prompts, too many at once).",
             "Give its traffic its own lane or priority if it is high-value; else shed it before others."),
        ),
        scenario=_scenario,
        labels={"scope": "tenant"},
    )


def rule_groups(config: RulesConfig) -> tuple[RuleGroup, ...]:
    """The per-tenant SLO group: recordings first, then the ticket."""
    rules: tuple[RecordingRule | AlertRule, ...] = (*recording_rules(config), burn_ticket(config))
    return (RuleGroup("inferwatch-tenant-slo", rules, config.evaluation_interval_s, file="slo"),)

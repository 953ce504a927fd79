"""The Tenants board's queries: usage, cost and per-tenant SLOs, one function each, from the usage catalog.

Tenants are bounded labels (``serve.max_tenants`` named, then ``other``); time series show the top
:data:`TOP` tenants, tables every tenant over the board's time range (``$__range``).
"""

from __future__ import annotations

from alert_rules.config import RulesConfig
from alert_rules.spec import duration, number
from alert_rules.windows import TICKET
from dashboards.queries import RANGE, Query, by, rate, sel
from exporters.catalog import usage
from exporters.catalog.spec import MetricSpec

TOP = 10


def _top(expr: str) -> str:
    return f"topk({TOP}, {expr})"


def _over_range(spec: MetricSpec, group: str = "tenant", *extra: str) -> str:
    return by(group, f"increase({sel(spec, *extra)}[{RANGE}])")


def requests_by_tenant() -> Query:
    """Inference requests per second of the busiest tenants."""
    return Query(_top(by("tenant", rate(usage.USAGE_REQUESTS))), "{{tenant}}")


def tokens_by_tenant() -> Query:
    """Prompt plus completion tokens per second of the busiest tenants."""
    both = f"{by('tenant', rate(usage.USAGE_PROMPT_TOKENS))} + {by('tenant', rate(usage.USAGE_COMPLETION_TOKENS))}"
    return Query(_top(f"({both})"), "{{tenant}}")


def gpus_by_tenant() -> Query:
    """GPU-seconds per second (GPUs kept busy) of the busiest tenants."""
    return Query(_top(by("tenant", rate(usage.USAGE_GPU_SECONDS))), "{{tenant}}")


def gpus_by_pool_and_basis() -> Query:
    """GPU-seconds per second by cost pool and basis (engine numbers or the token estimate)."""
    return Query(by("pool, basis", rate(usage.USAGE_GPU_SECONDS)), "{{pool}} ({{basis}})")


def engine_reconciliation() -> list[Query]:
    """GPU-seconds from vLLM's numbers against vLLM's busy time (the plugin's step states), per second."""
    engine = rate(usage.USAGE_GPU_SECONDS, 'basis="engine"')
    return [Query(f"sum({engine})", "GPU-seconds (engine basis)"),
            Query(f"sum({rate(usage.ENGINE_BUSY_SECONDS)})", "engine busy")]


def cost_per_hour_by_tenant() -> Query:
    """Cost per hour of the busiest tenants (cost.currency)."""
    return Query(_top(f"{by('tenant', rate(usage.USAGE_COST))} * 3600"), "{{tenant}}")


def cost_share() -> Query:
    """Each tenant's share of the cost over the time range."""
    every = f"scalar(sum(increase({sel(usage.USAGE_COST)}[{RANGE}])))"
    return Query(f"{_over_range(usage.USAGE_COST)} / {every}", "{{tenant}}", instant=True, table=True)


def cost_by_pool() -> Query:
    """Cost over the time range by cost pool."""
    return Query(_over_range(usage.USAGE_COST, "pool"), "{{pool}}", instant=True)


def top_tenants() -> list[Query]:
    """Requests, tokens, GPU-seconds and cost of every tenant over the time range (one table)."""
    return [Query(_over_range(spec), spec.name, instant=True, table=True) for spec in (
        usage.USAGE_REQUESTS, usage.USAGE_PROMPT_TOKENS, usage.USAGE_COMPLETION_TOKENS, usage.USAGE_GPU_SECONDS,
        usage.USAGE_COST)]


def savings() -> list[Query]:
    """What the prefix cache saved, and what an answer cache would have saved, over the time range."""
    return [Query(f"sum(increase({sel(usage.USAGE_PREFIX_CACHE_SAVED_COST)}[{RANGE}]))", "prefix cache (cost)",
                  instant=True),
            Query(f"sum(increase({sel(usage.USAGE_REPEAT_SAVED_TOKENS)}[{RANGE}]))", "answer cache (tokens)",
                  instant=True)]


def repeat_share() -> Query:
    """Share of each busy tenant's requests that repeated a prompt answered within the answer-cache TTL."""
    repeats = by("tenant", rate(usage.USAGE_REPEAT_REQUESTS))
    every = by("tenant", rate(usage.USAGE_REQUESTS))
    return Query(_top(f"({repeats} or {every} * 0) / {every}"), "{{tenant}}")


def tenant_p99() -> Query:
    """p99 end-to-end latency of the busiest tenants."""
    spec = usage.TENANT_LATENCY_SECONDS
    return Query(_top(f"histogram_quantile(0.99, {by('le, tenant', rate(spec, series=spec.bucket))})"),
                 "{{tenant}}")


def tenant_budget_left(rules: RulesConfig) -> Query:
    """Share of each tenant's error budget left over the SLO period (recorded per-tenant event sums)."""
    period = duration(rules.slo_period_days * 86400)
    bad = by("tenant, slo", f'increase({usage.TENANT_SLO_BAD_EVENTS.series}{{model_name=~"$model_name"}}[{period}])')
    every = by("tenant, slo", f'increase({usage.TENANT_SLO_EVENTS.series}{{model_name=~"$model_name"}}[{period}])')
    budget = number(round(1 - rules.slo_objective, 12))
    return Query(f"1 - (({bad} / {every}) / {budget})", "{{tenant}} {{slo}}", instant=True, table=True)


def tenant_burn_rates(rules: RulesConfig) -> list[Query]:
    """The ticket's burn rates (error ratio / budget) over its two windows, for the tenants burning fastest."""
    budget = number(round(1 - rules.slo_objective, 12))
    return [Query(_top(f'{usage.tenant_slo_error_ratio(duration(w))}{{model_name=~"$model_name"}} / {budget}'),
                  f"{{{{tenant}}}} {{{{slo}}}} {duration(w)}") for w in (TICKET.long_s, TICKET.short_s)]

"""Tenants: who used what and what it cost, by tenant and cost pool, and each tenant's SLO budget."""

from __future__ import annotations

from grafanalib import core

from alert_rules.config import RulesConfig
from dashboards import usage_queries as q
from dashboards.board import dashboard
from dashboards.config import DashboardConfig
from dashboards.panels import Row, Spec, stat, table, timeseries

TITLE = "Tenants"


def items(_config: DashboardConfig, rules: RulesConfig) -> list[Spec | Row]:
    """The board's rows and panels, in order."""
    return [
        Row("Usage"),
        timeseries("Requests by tenant", f"Inference requests per second of the {q.TOP} busiest tenants "
                   "(serve.max_tenants are named, the rest are 'other').", "reqps", q.requests_by_tenant()),
        timeseries("Tokens by tenant", "Prompt plus completion tokens per second.", "short", q.tokens_by_tenant()),
        timeseries("GPUs by tenant", "GPU-seconds per second: vLLM's prefill time plus decode time shared with its "
                   "batch (plugin), else the token estimate.", "short", q.gpus_by_tenant()),
        timeseries("GPUs by cost pool", "GPU-seconds per second by cost pool, and whether they are vLLM's numbers "
                   "(engine) or the token-based estimate.", "short", q.gpus_by_pool_and_basis(), stacked=True),
        timeseries("GPU-seconds against engine busy time", "Engine-basis GPU-seconds per second and vLLM's busy "
                   "time (a request running) per second: they differ by the prefills that ran beside other "
                   "requests (each counts whole).", "short", q.engine_reconciliation()),
        timeseries("Cost per hour by tenant", "Cost per hour (cost.currency) of the busiest tenants.", "short",
                   q.cost_per_hour_by_tenant()),
        Row("Cost share over the time range"),
        table("Top tenants", "Requests, prompt and completion tokens, GPU-seconds and cost of every tenant over the "
              "time range.", "short", q.top_tenants(), width=12),
        table("Cost share", "Each tenant's share of the cost over the time range.", "percentunit", q.cost_share(),
              width=6),
        stat("Cost by pool", "Cost over the time range by cost pool.", "short", q.cost_by_pool(), width=6),
        stat("Savings", "What the prefix cache saved (cost), and the tokens an answer cache with cost.repeat_ttl_s "
             "would have saved, over the time range.", "short", q.savings(), width=6),
        timeseries("Repeat prompts", "Share of each busy tenant's requests repeating a prompt answered within "
                   "cost.repeat_ttl_s (what an answer cache would have served).", "percentunit", q.repeat_share(),
                   min_value=0, max_value=1),
        Row("Per-tenant SLOs"),
        table("Error budget left by tenant", f"Share of each tenant's error budget left over "
              f"{rules.slo_period_days} days, per SLO (1 = untouched, below 0 = overspent).", "percentunit",
              q.tenant_budget_left(rules), width=8),
        timeseries("Tenant burn rates", "Error ratio over the budget, over the ticket's 3d and 6h windows: above 1 "
                   "in both, InferwatchTenantBudgetBurnTicket names the tenant.", "short", q.tenant_burn_rates(rules),
                   thresholds=[("green", None), ("red", 1.0)], lines=True),
        timeseries("p99 latency by tenant", "p99 end-to-end seconds of the busiest tenants.", "s", q.tenant_p99()),
    ]


def build(config: DashboardConfig, rules: RulesConfig, _length_edges: tuple[int, ...]) -> core.Dashboard:
    """The Tenants board."""
    return dashboard(config, "tenants", TITLE, "Usage and cost by tenant and cost pool, the cost share, savings "
                     "and each tenant's SLO budget.", items(config, rules))

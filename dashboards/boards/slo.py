"""LLM serving — SLOs and traffic: what users get, against the objectives the alerts enforce."""

from __future__ import annotations

from grafanalib import core

from alert_rules.config import RulesConfig
from alert_rules.spec import duration
from alert_rules.windows import WINDOW_PAIRS
from dashboards import explain
from dashboards import queries as q
from dashboards.board import dashboard
from dashboards.config import DashboardConfig
from dashboards.panels import Item, Row, slowest_requests, stat, table, timeseries
from exporters.catalog import request
from exporters.records import context_32k_bucket

TITLE = "LLM serving — SLOs and traffic"


def _slowest(config: DashboardConfig) -> list[Item]:
    """The slowest-requests table, where the boards know the sidecar's address (dashboards.explain_base_url)."""
    if not config.explain_base_url:
        return []
    return [slowest_requests(
        "Slowest requests", f"The {explain.SLOWEST_ROWS} slowest requests of the board's time range that the sidecar "
        "still holds (its ring of recent requests, serve.explain_ring_size), slowest first, each with its top cause "
        "and a one-line reason (inferwatch explain --slowest). Click a trace id for the whole explanation: the "
        "request's time split into its phases, the engine's state at that moment, its peers' p50. Read by Grafana "
        "from BASE/admin/requests (dashboards.explain_base_url; the /admin access rule applies).",
        explain.slowest_url(config), explain.request_url(config))]


def _context_32k(rules: RulesConfig, length_edges: tuple[int, ...]) -> Item:
    """The class the 32k alert watches, drawn with that alert's class and threshold."""
    bucket = context_32k_bucket(length_edges)
    return timeseries(
        f"32k class ({bucket}): failed and refused", f"The length class a 32,000-token prompt lands in ({bucket}, "
        "from serve.length_bucket_edges) on its own, per model: the share of its requests that failed (upstream "
        "errors, timeouts, overloaded: what InferwatchContext32kFailures counts, over "
        f"{duration(rules.long_context_window_s)}; the dashed line is its threshold, rules.context_32k_error_ratio) "
        "and the share refused as the client's error (mostly prompts over the model's context; no alert counts "
        "them). Long prompts are the first to hit OOM, preemption and timeouts, and the overall error ratio "
        "averages them away.", "percentunit", q.class_failures(bucket), width=8,
        thresholds=[("green", None), ("red", rules.context_32k_error_ratio)], lines=True, min_value=0)


def items(config: DashboardConfig, rules: RulesConfig, length_edges: tuple[int, ...]) -> list[Item]:
    """The board's rows and panels, in order."""
    objective = rules.slo_objective
    factors = sorted({float(p.factor(rules.slo_period_days)) for p in WINDOW_PAIRS})
    burn_levels = [("green", None), *[(c, f) for c, f in zip(("yellow", "orange", "red"), factors, strict=False)]]
    return [
        Row("SLOs"),
        stat("SLO compliance", f"Share of good events over the {rules.slo_period_days}-day SLO period, per model "
             f"and SLO (availability, latency); the objective is {objective * 100:g} %.", "percentunit",
             q.slo_compliance(rules), width=6, thresholds=[("red", None), ("green", objective)]),
        stat("Error budget left", "Share of the error budget not yet spent over the SLO period: 1 - error ratio / "
             "(1 - objective). Below 0 the SLO is missed.", "percentunit", q.error_budget_left(rules), width=6,
             thresholds=[("red", None), ("orange", 0.0), ("green", 0.25)]),
        timeseries("Burn rate by window", "Error ratio divided by the error budget over each window the burn-rate "
                   "alerts use; the dashed lines are the alerts' burn-rate factors (page and ticket).", "none",
                   q.burn_rates(rules), width=8, thresholds=burn_levels, lines=True),
        stat("Alerts firing", "Alerts Prometheus has firing now (0 when none is; no data when Prometheus "
             "reports no rule groups).", "short",
             q.alerts_firing(), width=4, thresholds=[("green", None), ("red", 1.0)]),
        Row("Traffic and errors"),
        timeseries("Requests by outcome", "Requests per second through the sidecar, by outcome class.", "reqps",
                   q.requests_by_outcome(), stacked=True),
        timeseries("Error ratio", "Share of requests that failed (upstream error, timeout, overload), over every "
                   "selected instance (failed / all, summed over replicas); the dashed lines are the circuit "
                   "breaker's degrade and rollback thresholds.", "percentunit",
                   q.error_ratio(), thresholds=[("green", None), ("orange", rules.degrade_error_ratio),
                                                ("red", rules.rollback_error_ratio)], lines=True, min_value=0),
        timeseries("Goodput", f"Requests per second that succeeded within the latency SLO threshold "
                   f"({rules.slo_latency_threshold_s:g} s end to end).", "reqps", q.goodput(rules)),
        timeseries("Tokens per second", "Prompt tokens in and completion tokens out per second, from the usage "
                   "blocks the upstream returned.", "short", q.tokens_per_second()),
        timeseries("Requests in flight", "Requests being proxied right now, per model.", "short", q.in_flight()),
        timeseries("Finish reasons", "Finished choices per second by finish_reason, as the sidecar saw them.",
                   "reqps", q.finish_reasons()),
        timeseries("Fast retries", "Requests per second that repeat a request of the same client (serve.client_header, "
                   "else its User-Agent, and tenant) to the same route with the same body less than "
                   "serve.fast_retry_window_ms after it ended, per model: retries without backoff. They add load to "
                   "an engine that is already slow or failing; a burst of them beside a rising error ratio is a "
                   "retry storm. The request records' client field names who sends them: have those clients back "
                   "off at least 500 ms, doubling, with jitter, and honour Retry-After; shed load meanwhile.",
                   "reqps", q.fast_retries()),
        Row("By instance (find the bad replica)"),
        timeseries("Requests by instance", "Requests per second through each replica's sidecar (Prometheus' "
                   "instance label), per model.", "reqps", q.requests_by_instance(), width=6),
        timeseries("Error ratio by instance", "Share of each replica's requests that failed; the dashed lines are "
                   "the circuit breaker's degrade and rollback thresholds (which watch the whole model).",
                   "percentunit", q.error_ratio_by_instance(), width=6,
                   thresholds=[("green", None), ("orange", rules.degrade_error_ratio),
                               ("red", rules.rollback_error_ratio)], lines=True, min_value=0),
        timeseries("TTFT p99 by instance", "p99 time to first token of each replica; exemplars link to traces.",
                   "s", q.ttft_p99_by_instance(), width=6),
        timeseries("KV cache usage by instance", "Share of each replica's KV-cache blocks in use (the sidecar's "
                   "block-weighted view over its data-parallel engines); the dashed line is the KV alert's threshold, "
                   "which fires per replica.", "percentunit", q.kv_usage_by_instance(), width=6,
                   thresholds=[("green", None), ("red", rules.kv_cache_ratio)], lines=True, min_value=0,
                   max_value=1),
        Row("Latency (click an exemplar to open its trace)"),
        timeseries("Time to first token", "p50, p90, p99 of the time to the first content chunk, per model; "
                   "exemplar dots link to the request's trace.", "s", q.ttft()),
        timeseries("Inter-token latency", "p50, p90, p99 of the gap between content chunks of streamed responses, "
                   "per model; exemplars link to traces.", "s", q.inter_token()),
        timeseries("End-to-end latency", "p50, p90, p99 of arrival to last byte, every outcome; the dashed line is "
                   "the degrade p99 threshold.", "s", q.e2e(),
                   thresholds=[("green", None), ("orange", rules.degrade_p99_s)], lines=True),
        timeseries("Upstream accept time", "p50, p90, p99 of the time until vLLM answered with a status line "
                   "(queueing in front of the engine).", "s", q.upstream_accept()),
        timeseries("Tokens per request", "p50 and p90 prompt and completion tokens per finished request.", "short",
                   q.request_tokens()),
        timeseries("Prefill share per request", "Median share of a streamed request's time spent before its first "
                   "token.", "percentunit", q.prefill_share_per_request()),
        *_slowest(config),
        Row("By prompt length"),
        timeseries("Latency by length bucket", "p90 end-to-end latency per prompt length bucket.", "s",
                   q.latency_by_length(), width=8),
        timeseries("Failure ratio by length bucket", "Share of requests that failed, per prompt length bucket.",
                   "percentunit", q.failures_by_length(), width=8,
                   thresholds=[("green", None), ("red", rules.long_context_error_ratio)], lines=True),
        _context_32k(rules, length_edges),
        Row("Release day: wrong models, tokenizers, text classes"),
        timeseries("Failure ratio by text class", "Share of generation requests that failed, per text class of their "
                   "prompt (plain; emoji_dense: more emoji than serve.emoji_dense_threshold; cjk) and model; the "
                   "dashed line is the text-class alert's threshold.", "percentunit", q.failures_by_text_class(),
                   thresholds=[("green", None), ("red", rules.text_class_error_ratio)], lines=True, min_value=0),
        timeseries("Wrong-model requests", "Requests per second answered by another model than they asked for "
                   "(other_model) or asking for a retired model (retired_model), by requested model; the request "
                   "records' client key says who sends them.", "reqps", q.wrong_model_requests()),
        table("Tokenizer fingerprints", "The fingerprint of each upstream's tokenizer per model (a hash of its "
              "/tokenize over a fixed probe set, taken when it becomes ready); two under one model name: "
              "InferwatchTokenizerChanged.", "none", q.tokenizer_fingerprints(), width=8),
        Row("Canary against primary"),
        timeseries("Error ratio by role", "Share of requests that failed on the canary (serve.canary_upstream) and "
                   "on the primary, on the same window; the dashed lines are the canary breaker's degrade and "
                   "rollback levels (InferwatchCanaryDegrade, InferwatchCanaryRollback: the canary worse than the "
                   "primary).", "percentunit", q.error_ratio("model_name, role", "{{role}} {{model_name}}"), width=8,
                   thresholds=[("green", None), ("orange", rules.degrade_error_ratio),
                               ("red", rules.rollback_error_ratio)], lines=True, min_value=0),
        timeseries("TTFT p99 by role", "p99 time to first token of the canary and of the primary; exemplars link "
                   "to traces.", "s", q.p99_by_role(request.TIME_TO_FIRST_TOKEN_SECONDS), width=8),
        timeseries("End-to-end p99 by role", "p99 end-to-end latency of the canary and of the primary; the dashed "
                   "line is the canary breaker's degrade p99.", "s", q.p99_by_role(request.E2E_LATENCY_SECONDS),
                   width=8, thresholds=[("green", None), ("orange", rules.degrade_p99_s)], lines=True),
        Row("Shadow traffic"),
        timeseries("Shadowed requests by result", "Requests copied to the shadow (serve.shadow_upstream) per "
                   "second: match, mismatch, not_compared (a side without text), and copies dropped (full, "
                   "slow, down).",
                   "reqps", q.shadow_results(), width=6, stacked=True),
        timeseries("Shadow match rate", "Share of the compared shadowed requests whose outputs matched (greedy: the "
                   "same text; otherwise a token edit distance of 0).", "percentunit", q.shadow_match_rate(),
                   width=6, min_value=0, max_value=1),
        timeseries("Shadow p99 by side", "p99 end-to-end latency of the same shadowed requests on the primary and "
                   "on the shadow.", "s", q.shadow_p99_by_side(), width=6),
        timeseries("Shadow error ratio by side", "Share of the shadowed requests that failed on each side.",
                   "percentunit", q.shadow_error_ratio_by_side(), width=6, min_value=0),
        Row("Alerts"),
        timeseries("Alerts by state", "Pending and firing alerts over time (a 0 line while none is; no data "
                   "when Prometheus reports no rule groups).", "short",
                   q.alerts_by_state(), width=24),
    ]


def build(config: DashboardConfig, rules: RulesConfig, length_edges: tuple[int, ...]) -> core.Dashboard:
    """The SLO and traffic board."""
    return dashboard(config, "slo", TITLE, "SLO compliance, burn rates, traffic, errors, latency and goodput of "
                     "the LLM service, from the inferwatch sidecar.", items(config, rules, length_edges))

"""Every panel query, one function each, built from catalog specs and the rules config.

Selectors get the template-variable matchers their family's labels allow: ``model_name=~"$model_name"``,
``engine=~"$engine"``, ``gpu=~"$gpu"``, and ``instance=~"$instance"`` on every family Prometheus scrapes
from a sidecar or a vLLM server (``instance`` is the target label Prometheus adds, not a catalog label;
:func:`filter_labels` is the one place that says which labels a family is filtered on). Rates use
``$__rate_interval``; windows that belong to the SLO (its period, the burn-rate windows) come from
:class:`~alert_rules.config.RulesConfig` and the rule modules, never from a number written here.

Across replicas (one sidecar per vLLM pod, each its own ``instance``) fleet panels aggregate by model:
counters as ``sum by (model_name) (rate(...))``, ratios as a sum over a sum, quantiles from buckets summed
by ``le`` and model; per-engine and per-GPU series keep ``instance`` (engine ``0`` and GPU ``0`` exist on
every pod). Gauges say per panel whether the max (the worst pod) or the mean over pods is shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from alert_rules import slo as slo_rules
from alert_rules.config import RulesConfig
from alert_rules.spec import any_of, duration, number
from alert_rules.windows import windows_used
from exporters.catalog import cutover, engine, gpu, pipeline, process, request, rules, upstreams, vllm
from exporters.catalog import prometheus as external
from exporters.catalog.spec import MetricSpec, Source
from exporters.records import Outcome

RATE = "$__rate_interval"
RANGE = "$__range"
VARIABLE_LABELS = {"model_name": "$model_name", "engine": "$engine", "gpu": "$gpu", "instance": "$instance"}
"""Label -> template variable it is filtered by, wherever a family carries the label."""
TARGET_LABELS = ("instance",)
"""Labels Prometheus adds to every scraped series (not in the catalog): filtered on scraped families only."""
SCRAPED = frozenset({Source.SIDECAR, Source.VLLM})
"""Sources whose series Prometheus scrapes from a replica's target, so they carry ``TARGET_LABELS``."""
INSTANCE = "instance"
GPU = "instance, gpu"
"""Grouping of per-GPU series: GPU indexes repeat on every replica."""


def filter_labels(spec: MetricSpec) -> tuple[str, ...]:
    """The labels a family's selectors are filtered on: its catalog labels, plus the target labels where
    Prometheus scrapes it from a replica (and never on Prometheus' own series, whose ``instance`` is
    Prometheus or any job's target)."""
    own = tuple(label for label in spec.labels if label not in TARGET_LABELS)
    return own + TARGET_LABELS if spec.source in SCRAPED else own


@dataclass(frozen=True, slots=True)
class Query:
    """One panel target: PromQL, its legend, and how Grafana runs it."""

    expr: str
    legend: str = ""
    exemplar: bool = False
    instant: bool = False
    table: bool = False
    heatmap: bool = False


def matchers(labels: tuple[str, ...], *extra: str) -> str:
    """The ``{...}`` body for a family with ``labels``: variable matchers first, then ``extra``."""
    parts = [f'{label}=~"{var}"' for label, var in VARIABLE_LABELS.items() if label in labels]
    parts.extend(extra)
    return "{" + ", ".join(parts) + "}" if parts else ""


def sel(spec: MetricSpec, *extra: str, series: str | None = None) -> str:
    """A selector of one of ``spec``'s series (its plain series by default), with variable matchers."""
    return f"{series or spec.series}{matchers(filter_labels(spec), *extra)}"


def rate(spec: MetricSpec, *extra: str, series: str | None = None) -> str:
    """``rate(<selector>[$__rate_interval])``."""
    return f"rate({sel(spec, *extra, series=series)}[{RATE}])"


def by(labels: str, expr: str, op: str = "sum") -> str:
    """``sum by (labels) (expr)``."""
    return f"{op} by ({labels}) ({expr})"


def quantile(q: float, spec: MetricSpec, group: str = "model_name", *extra: str) -> str:
    """``histogram_quantile`` of a histogram family, grouped by ``group``."""
    inner = by(f"le, {group}" if group else "le", rate(spec, *extra, series=spec.bucket))
    return f"histogram_quantile({number(q)}, {inner})"


def mean_of(spec: MetricSpec, group: str = "model_name") -> str:
    """Mean observation of a histogram over the rate window: rate(_sum) / rate(_count)."""
    return f"{by(group, rate(spec, series=spec.sum))} / {by(group, rate(spec, series=spec.count))}"


def percentiles(spec: MetricSpec, group: str = "model_name", exemplar: bool = False) -> list[Query]:
    """p50, p90 and p99 of a latency histogram, one target each."""
    return [
        Query(quantile(q, spec, group), f"p{round(q * 100)} {{{{{group}}}}}", exemplar=exemplar)
        for q in (0.5, 0.9, 0.99)
    ]


def heatmap(spec: MetricSpec) -> Query:
    """Bucket increments of a histogram per rate window, for a heatmap (``le`` as the y axis)."""
    return Query(by("le", f"increase({sel(spec, series=spec.bucket)}[{RATE}])"), "{{le}}", heatmap=True)


def zero_per_gpu() -> str:
    """``0`` for every GPU the exporter knows: the value of a per-GPU counter not yet created."""
    return by(GPU, f"{sel(gpu.GPU_UP)} * 0")


# ------------------------------------------------------------------ SLOs and traffic


def error_outcome_regex() -> str:
    """Outcomes that count against availability, as a regex."""
    return any_of(slo_rules.error_outcomes())


def slo_compliance(rules: RulesConfig) -> Query:
    """Share of good events over the SLO period, per model and SLO (recorded event sums)."""
    period = duration(rules.slo_period_days * 86400)
    bad = by("model_name, slo", f'increase({slo_rules.BAD_EVENTS}{{model_name=~"$model_name"}}[{period}])')
    every = by("model_name, slo", f'increase({slo_rules.EVENTS}{{model_name=~"$model_name"}}[{period}])')
    return Query(f"1 - ({bad} / {every})", "{{model_name}} {{slo}}", instant=True)


def error_budget_left(rules: RulesConfig) -> Query:
    """Share of the error budget still unspent over the SLO period: 1 - bad ratio / (1 - objective)."""
    period = duration(rules.slo_period_days * 86400)
    bad = by("model_name, slo", f'increase({slo_rules.BAD_EVENTS}{{model_name=~"$model_name"}}[{period}])')
    every = by("model_name, slo", f'increase({slo_rules.EVENTS}{{model_name=~"$model_name"}}[{period}])')
    budget = number(round(1 - rules.slo_objective, 12))
    return Query(f"1 - (({bad} / {every}) / {budget})", "{{model_name}} {{slo}}", instant=True)


def burn_rates(rules: RulesConfig) -> list[Query]:
    """Burn rate (error ratio / budget) over every window the burn-rate alerts use."""
    budget = number(round(1 - rules.slo_objective, 12))
    out = []
    for window in windows_used():
        name = slo_rules.error_ratio_name(window)
        out.append(Query(
            f'{name}{{model_name=~"$model_name"}} / {budget}', f"{{{{model_name}}}} {{{{slo}}}} {duration(window)}"
        ))
    return out


def requests_by_outcome() -> Query:
    """Requests per second by outcome."""
    return Query(by("outcome", rate(request.REQUESTS)), "{{outcome}}")


def error_ratio(group: str = "model_name", legend: str = "") -> Query:
    """Share of requests with an error outcome, per ``group`` (summed over instances, then divided: a
    ratio of sums, never a mean of per-pod ratios); 0 while a group has traffic but no error."""
    bad = by(group, rate(request.REQUESTS, f'outcome=~"{error_outcome_regex()}"'))
    every = by(group, rate(request.REQUESTS))
    return Query(f"({bad} or ({every} * 0)) / {every}", legend or f"{{{{{group}}}}}")


def ttft() -> list[Query]:
    """Time to first token p50/p90/p99 per model, with trace exemplars."""
    return percentiles(request.TIME_TO_FIRST_TOKEN_SECONDS, exemplar=True)


def inter_token() -> list[Query]:
    """Inter-token latency p50/p90/p99 per model, with trace exemplars."""
    return percentiles(request.INTER_TOKEN_LATENCY_SECONDS, exemplar=True)


def e2e() -> list[Query]:
    """End-to-end latency p50/p90/p99 per model, with trace exemplars."""
    return percentiles(request.E2E_LATENCY_SECONDS, exemplar=True)


def upstream_accept() -> list[Query]:
    """Seconds until the upstream sent a status line, p50/p90/p99."""
    return percentiles(request.UPSTREAM_ACCEPT_SECONDS)


def latency_by_length() -> list[Query]:
    """p90 end-to-end latency per prompt length bucket."""
    return [Query(quantile(0.9, request.E2E_LATENCY_SECONDS, "length_bucket"), "p90 {{length_bucket}}",
                  exemplar=True)]


def failures_by_length() -> Query:
    """Failure ratio per prompt length bucket."""
    return error_ratio("length_bucket")


def class_failures(length_bucket: str) -> list[Query]:
    """One length class on its own, per model: the share of its requests that failed (the outcomes the error
    ratio and the alerts count) and the share the upstream or the sidecar refused as the client's error (such
    as a prompt over the model's context; never counted by the alerts)."""
    every = by("model_name", rate(request.REQUESTS, f'length_bucket="{length_bucket}"'))
    out = []
    for outcomes, legend in ((error_outcome_regex(), "failed"), (str(Outcome.CLIENT_ERROR), "refused")):
        part = by("model_name", rate(request.REQUESTS, f'length_bucket="{length_bucket}"', f'outcome=~"{outcomes}"'))
        out.append(Query(f"({part} or ({every} * 0)) / {every}", f"{legend} {{{{model_name}}}}"))
    return out


def fast_retries() -> Query:
    """Fast retries per second, per model."""
    return Query(by("model_name", rate(request.FAST_RETRIES)), "{{model_name}}")


def tokens_per_second() -> list[Query]:
    """Prompt (in) and completion (out) tokens per second, from the usage blocks."""
    return [
        Query(by("model_name", rate(request.PROMPT_TOKENS)), "in {{model_name}}"),
        Query(by("model_name", rate(request.COMPLETION_TOKENS)), "out {{model_name}}"),
    ]


def goodput(rules: RulesConfig) -> Query:
    """Requests per second that succeeded within the latency SLO threshold."""
    le = slo_rules.le_value(rules.slo_latency_threshold_s)
    good = rate(request.E2E_LATENCY_SECONDS, 'outcome="ok"', f'le="{le}"', series=request.E2E_LATENCY_SECONDS.bucket)
    return Query(by("model_name", good), "{{model_name}}")


def in_flight() -> Query:
    """Requests being proxied right now."""
    return Query(by("model_name", sel(request.REQUESTS_IN_FLIGHT)), "{{model_name}}")


def finish_reasons() -> Query:
    """Finished choices per second by finish_reason (as the sidecar saw them)."""
    return Query(by("finish_reason", rate(request.FINISH_REASONS)), "{{finish_reason}}")


def request_tokens() -> list[Query]:
    """p50/p90 prompt and completion tokens per request (sidecar view)."""
    return [
        Query(quantile(0.5, request.REQUEST_PROMPT_TOKENS), "prompt p50 {{model_name}}"),
        Query(quantile(0.9, request.REQUEST_PROMPT_TOKENS), "prompt p90 {{model_name}}"),
        Query(quantile(0.5, request.REQUEST_COMPLETION_TOKENS), "completion p50 {{model_name}}"),
        Query(quantile(0.9, request.REQUEST_COMPLETION_TOKENS), "completion p90 {{model_name}}"),
    ]


def prefill_share_per_request() -> Query:
    """Median share of a streamed request's time spent before the first token."""
    return Query(quantile(0.5, request.PREFILL_SHARE_RATIO), "p50 {{model_name}}")


# Release day: wrong-model requests, tokenizer fingerprints, text classes.


def failures_by_text_class() -> Query:
    """Failure ratio per text class (plain, emoji_dense, cjk) and model, from its own family."""
    bad = by("model_name, text_class", rate(cutover.TEXT_CLASS_REQUESTS, f'outcome=~"{error_outcome_regex()}"'))
    every = by("model_name, text_class", rate(cutover.TEXT_CLASS_REQUESTS))
    return Query(f"({bad} or ({every} * 0)) / {every}", "{{text_class}} {{model_name}}")


def wrong_model_requests() -> Query:
    """Wrong-model requests per second by requested model and reason."""
    return Query(by("model_name, reason", rate(cutover.WRONG_MODEL_REQUESTS)), "{{reason}} {{model_name}}")


def tokenizer_fingerprints() -> Query:
    """The tokenizer fingerprint of each upstream and model, per replica."""
    return Query(by("instance, upstream, model_name, fingerprint", sel(cutover.UPSTREAM_TOKENIZER), "max"), "",
                 instant=True, table=True)


# Upstream choice: the canary against the primary, shadow traffic (serving/upstream_choice.py).


def p99_by_role(spec: MetricSpec) -> Query:
    """p99 of a request latency histogram per model and role (primary, canary), on the same window."""
    return Query(quantile(0.99, spec, "model_name, role"), "p99 {{role}} {{model_name}}", exemplar=True)


def shadow_results() -> list[Query]:
    """Shadowed requests per second by result (match, mismatch, not_compared), and dropped copies by reason."""
    return [Query(by("model_name, result", rate(upstreams.SHADOW_REQUESTS)), "{{result}} {{model_name}}"),
            Query(by("model_name, reason", rate(upstreams.SHADOW_DROPPED)), "dropped {{reason}} {{model_name}}")]


def shadow_match_rate() -> Query:
    """Share of the compared shadowed requests whose outputs matched."""
    match = by("model_name", rate(upstreams.SHADOW_REQUESTS, 'result="match"'))
    compared = by("model_name", rate(upstreams.SHADOW_REQUESTS, 'result=~"match|mismatch"'))
    return Query(f"({match} or ({compared} * 0)) / {compared}", "{{model_name}}")


def shadow_p99_by_side() -> Query:
    """p99 end-to-end latency of the shadowed requests on each side (primary, shadow)."""
    return Query(quantile(0.99, upstreams.SHADOW_E2E_SECONDS, "model_name, side"), "p99 {{side}} {{model_name}}")


def shadow_error_ratio_by_side() -> Query:
    """Share of the shadowed requests that failed on each side."""
    bad = by("model_name, side", rate(upstreams.SHADOW_OUTCOMES, f'outcome=~"{error_outcome_regex()}"'))
    every = by("model_name, side", rate(upstreams.SHADOW_OUTCOMES))
    return Query(f"({bad} or ({every} * 0)) / {every}", "{{side}} {{model_name}}")


# Per-instance breakdown: which replica is the bad one.

PER_INSTANCE = "model_name, instance"
PER_INSTANCE_LEGEND = "{{instance}} {{model_name}}"


def requests_by_instance() -> Query:
    """Requests per second through each replica's sidecar."""
    return Query(by(PER_INSTANCE, rate(request.REQUESTS)), PER_INSTANCE_LEGEND)


def error_ratio_by_instance() -> Query:
    """Share of requests with an error outcome, per replica."""
    return error_ratio(PER_INSTANCE, PER_INSTANCE_LEGEND)


def ttft_p99_by_instance() -> Query:
    """Time to first token p99 per replica, with trace exemplars."""
    return Query(quantile(0.99, request.TIME_TO_FIRST_TOKEN_SECONDS, PER_INSTANCE), PER_INSTANCE_LEGEND,
                 exemplar=True)


def kv_usage_by_instance() -> Query:
    """KV-cache usage per replica (the sidecar's block-weighted view), the value the KV alert reads."""
    return Query(by(PER_INSTANCE, sel(engine.KV_USAGE), "max"), PER_INSTANCE_LEGEND)


def _rules_loaded_zero() -> str:
    """0 where Prometheus reports evaluating rule groups, no series where it does not."""
    # Prometheus writes an ALERTS series only while an alert is pending or firing, so with rules
    # loaded no ALERTS series means none: a true 0. Without rules (or without Prometheus' own
    # metrics) nothing is known, and the panel shows no data instead of a reassuring 0.
    return f"0 * count({external.RULE_GROUP_LAST_DURATION.series})"


def alerts_firing() -> Query:
    """Alerts firing now; 0 when none is and Prometheus evaluates rules."""
    firing = f'count({external.ALERTS.series}{{alertstate="firing"}})'
    return Query(f"{firing} or {_rules_loaded_zero()}", "firing", instant=True)


def alerts_by_state() -> Query:
    """Pending and firing alerts by state; one 0 line when none is and Prometheus evaluates rules."""
    return Query(f"count by (alertstate) ({external.ALERTS.series}) or on() {_rules_loaded_zero()}",
                 "{{alertstate}}")


# ------------------------------------------------------------------ vLLM engine and KV cache


def engine_requests() -> Query:
    """Requests in the engine by state: running, waiting, swapped (V0 only)."""
    return Query(by("model_name, state", sel(engine.ENGINE_REQUESTS)), "{{state}} {{model_name}}")


def vllm_running_waiting() -> list[Query]:
    """vLLM's own running and waiting gauges, per engine of each replica."""
    return [
        Query(by("model_name, instance, engine", sel(vllm.NUM_REQUESTS_RUNNING)),
              "running {{model_name}} {{instance}}/{{engine}}"),
        Query(by("model_name, instance, engine", sel(vllm.NUM_REQUESTS_WAITING)),
              "waiting {{model_name}} {{instance}}/{{engine}}"),
    ]


def waiting_by_reason() -> list[Query]:
    """Waiting requests split by reason (capacity, deferred): the sidecar's sum over engines, and vLLM's own."""
    return [
        Query(by("model_name, reason", sel(engine.ENGINE_WAITING_BY_REASON)), "{{reason}} {{model_name}}"),
        Query(by("reason", sel(vllm.NUM_REQUESTS_WAITING_BY_REASON)), "vLLM {{reason}}"),
    ]


def admission_rejections() -> list[Query]:
    """Requests per second vLLM rejected with 503 at its queue limits, and those the sidecar answered overloaded."""
    return [
        Query(by("model_name, reason", rate(engine.ENGINE_ADMISSION_REJECTIONS)), "{{reason}} {{model_name}}"),
        Query(by("reason", rate(vllm.ADMISSION_REJECTIONS)), "vLLM {{reason}}"),
        Query(by("model_name", rate(request.REQUESTS, 'outcome="overloaded"')), "sidecar overloaded {{model_name}}"),
    ]


def kv_offload_traffic() -> list[Query]:
    """KV offload (V1's swap) bytes per second by direction, and both directions together."""
    return [
        Query(by("model_name, direction", rate(engine.KV_SWAP_BYTES)), "{{direction}} {{model_name}}"),
        Query(by("model_name, instance", rate(engine.KV_SWAP_BYTES)), "store + load {{instance}} {{model_name}}"),
    ]


def kv_offload_state() -> list[Query]:
    """Share of transfer time per second by direction, CPU offload space used and failed allocations per second."""
    return [
        Query(by("model_name, direction", rate(engine.KV_SWAP_SECONDS)), "busy {{direction}} {{model_name}}"),
        Query(by("model_name", sel(engine.KV_SWAP_CPU_USAGE), "max"), "CPU space used {{model_name}}"),
        Query(by("model_name", rate(engine.KV_SWAP_ALLOCATION_FAILURES)), "allocation failures/s {{model_name}}"),
    ]


def queue_time() -> list[Query]:
    """Time in the scheduler queue, p50/p90/p99."""
    return percentiles(vllm.REQUEST_QUEUE_TIME)


def preemptions() -> list[Query]:
    """Preemptions per second: the sidecar's sum over engines and replicas, and vLLM's per-engine counter."""
    return [
        Query(by("model_name", rate(engine.ENGINE_PREEMPTIONS)), "{{model_name}}"),
        Query(by("model_name, instance, engine", rate(vllm.NUM_PREEMPTIONS)),
              "vLLM {{model_name}} {{instance}}/{{engine}}"),
    ]


def preemptions_per_request() -> list[Query]:
    """p90 and p99 of preemptions per finished request."""
    return [
        Query(quantile(0.9, vllm.REQUEST_NUM_PREEMPTIONS), "p90 {{model_name}}"),
        Query(quantile(0.99, vllm.REQUEST_NUM_PREEMPTIONS), "p99 {{model_name}}"),
    ]


def engine_phases_by_length() -> list[Query]:
    """p90 of vLLM's queue, prefill and decode time per prompt length bucket (the stat-logger plugin's numbers)."""
    return [
        Query(quantile(0.9, request.ENGINE_QUEUE_SECONDS, "length_bucket"), "queue p90 {{length_bucket}}"),
        Query(quantile(0.9, request.ENGINE_PREFILL_SECONDS, "length_bucket"), "prefill p90 {{length_bucket}}"),
        Query(quantile(0.9, request.ENGINE_DECODE_SECONDS, "length_bucket"), "decode p90 {{length_bucket}}"),
    ]


def engine_request_effects() -> list[Query]:
    """Mean preemptions and prefix-cached prompt share per request, by outcome (the plugin's numbers)."""
    return [
        Query(mean_of(request.ENGINE_PREEMPTIONS_PER_REQUEST, "outcome"), "preemptions per request {{outcome}}"),
        Query(mean_of(request.ENGINE_CACHED_PROMPT_RATIO, "outcome"), "cached prompt share {{outcome}}"),
    ]


def engine_stats_joins() -> list[Query]:
    """Requests joined to vLLM's numbers per second, and those that went without."""
    return [Query(by("result", rate(request.ENGINE_STATS_JOINS)), "{{result}}")]


def kv_usage() -> list[Query]:
    """KV-cache usage: the sidecar's block-weighted view (max over replicas: the fullest pod, which is what
    the per-pod KV alert watches) and vLLM's gauge per engine of each replica."""
    return [
        Query(by("model_name", sel(engine.KV_USAGE), "max"), "fullest replica {{model_name}}"),
        Query(by("model_name, instance, engine", sel(vllm.KV_CACHE_USAGE_PERC), "max"),
              "vLLM {{model_name}} {{instance}}/{{engine}}"),
    ]


def kv_blocks() -> list[Query]:
    """KV blocks in use against blocks allocated, and the blocks held by the requests vLLM runs."""
    return [
        Query(by("model_name", sel(engine.KV_BLOCKS_USED)), "used {{model_name}}"),
        Query(by("model_name", sel(engine.KV_BLOCKS_TOTAL)), "total {{model_name}}"),
        Query(by("model_name", sel(engine.KV_INFLIGHT_BLOCKS)), "held in flight (vLLM's with the plugin, else "
              "estimated) {{model_name}}"),
    ]


def kv_tokens() -> list[Query]:
    """KV capacity in tokens against tokens held by requests in flight."""
    return [
        Query(by("model_name", sel(engine.KV_CAPACITY_TOKENS)), "capacity {{model_name}}"),
        Query(by("model_name", sel(engine.KV_INFLIGHT_TOKENS)), "in flight {{model_name}}"),
        Query(by("model_name", sel(engine.KV_BLOCK_SIZE), "max"), "tokens per block {{model_name}}"),
    ]


def kv_fragmentation() -> Query:
    """Estimated internal fragmentation of the blocks held by in-flight requests (max over replicas)."""
    return Query(by("model_name", sel(engine.KV_FRAGMENTATION), "max"), "worst replica {{model_name}}")


def cache_config() -> Query:
    """vLLM's cache configuration (block size, GPU blocks, KV tokens) as a table."""
    expr = (f"max by (instance, engine, block_size, num_gpu_blocks, kv_cache_size_tokens) "
            f"({sel(vllm.CACHE_CONFIG_INFO)})")
    return Query(expr, "", instant=True, table=True)


def prefix_cache_hit_ratio() -> list[Query]:
    """Prefix-cache hit ratio: local (tokens) over the rate window, since start, and external."""
    local = f"{by('model_name', rate(vllm.PREFIX_CACHE_HITS))} / {by('model_name', rate(vllm.PREFIX_CACHE_QUERIES))}"
    ext = (f"{by('model_name', rate(vllm.EXTERNAL_PREFIX_CACHE_HITS))} / "
           f"{by('model_name', rate(vllm.EXTERNAL_PREFIX_CACHE_QUERIES))}")
    return [
        Query(local, "local {{model_name}}"),
        # A per-replica ratio without its counts: the mean over replicas (unweighted).
        Query(by("model_name", sel(engine.ENGINE_PREFIX_CACHE_HIT_RATIO), "avg"), "since start {{model_name}}"),
        Query(ext, "external {{model_name}}"),
    ]


def cached_prompt_tokens() -> list[Query]:
    """Prompt tokens per second skipped in prefill, by cache tier, and prompt tokens by KV source."""
    return [
        Query(by("model_name", rate(vllm.PROMPT_TOKENS_CACHED)), "cached {{model_name}}"),
        Query(by("source", rate(vllm.PROMPT_TOKENS_CACHED_BY_SOURCE)), "cached from {{source}}"),
        Query(by("source", rate(vllm.PROMPT_TOKENS_BY_SOURCE)), "prompt from {{source}}"),
    ]


def multimodal_cache() -> list[Query]:
    """Multimodal cache queries and hits per second (items)."""
    return [
        Query(by("model_name", rate(vllm.MM_CACHE_QUERIES)), "queries {{model_name}}"),
        Query(by("model_name", rate(vllm.MM_CACHE_HITS)), "hits {{model_name}}"),
    ]


def prefill_decode_time() -> list[Query]:
    """Seconds per second spent in prefill and in decode (sidecar sums of vLLM's histograms)."""
    return [
        Query(by("model_name", rate(engine.ENGINE_PREFILL_SECONDS)), "prefill {{model_name}}"),
        Query(by("model_name", rate(engine.ENGINE_DECODE_SECONDS)), "decode {{model_name}}"),
    ]


def prefill_decode_share() -> list[Query]:
    """Share of request time in prefill and in decode since the engine started (mean over replicas, so the
    two shares still add up to one)."""
    return [
        Query(by("model_name", sel(engine.ENGINE_PREFILL_SHARE), "avg"), "prefill {{model_name}}"),
        Query(by("model_name", sel(engine.ENGINE_DECODE_SHARE), "avg"), "decode {{model_name}}"),
    ]


def phase_latency() -> list[Query]:
    """p90 of each request phase as vLLM measures it: prefill, decode, inference."""
    return [
        Query(quantile(0.9, vllm.REQUEST_PREFILL_TIME), "prefill p90 {{model_name}}"),
        Query(quantile(0.9, vllm.REQUEST_DECODE_TIME), "decode p90 {{model_name}}"),
        Query(quantile(0.9, vllm.REQUEST_INFERENCE_TIME), "inference p90 {{model_name}}"),
    ]


def engine_latency() -> list[Query]:
    """vLLM's own latency histograms at p90: TTFT, inter-token, time per output token, end to end."""
    return [
        Query(quantile(0.9, vllm.TIME_TO_FIRST_TOKEN), "TTFT p90 {{model_name}}"),
        Query(quantile(0.9, vllm.INTER_TOKEN_LATENCY), "inter-token p90 {{model_name}}"),
        Query(quantile(0.9, vllm.REQUEST_TIME_PER_OUTPUT_TOKEN), "TPOT p90 {{model_name}}"),
        Query(quantile(0.9, vllm.E2E_REQUEST_LATENCY), "e2e p90 {{model_name}}"),
    ]


def step_tokens_heatmap() -> Query:
    """Tokens per engine step (vLLM's iteration histogram) as a heatmap."""
    return heatmap(vllm.ITERATION_TOKENS)


def step_tokens() -> list[Query]:
    """Tokens per engine step, p50 and p90 (the sidecar's sum over engines)."""
    return [
        Query(quantile(0.5, engine.ENGINE_STEP_TOKENS), "p50 {{model_name}}"),
        Query(quantile(0.9, engine.ENGINE_STEP_TOKENS), "p90 {{model_name}}"),
    ]


def batch_requests_heatmap() -> Query:
    """Running requests per scrape (batch size in requests) as a heatmap."""
    return heatmap(engine.ENGINE_BATCH_REQUESTS)


def engine_tokens() -> list[Query]:
    """Prompt and generated tokens per second as the engine counts them."""
    return [
        Query(by("model_name", rate(vllm.PROMPT_TOKENS)), "prompt {{model_name}}"),
        Query(by("model_name", rate(vllm.GENERATION_TOKENS)), "generated {{model_name}}"),
        Query(by("model_name", rate(engine.ENGINE_GENERATION_TOKENS)), "generated, all engines {{model_name}}"),
    ]


def engine_finished() -> Query:
    """Finished requests per second by vLLM's finished_reason."""
    return Query(by("finished_reason", rate(vllm.REQUEST_SUCCESS)), "{{finished_reason}}")


def request_shape() -> list[Query]:
    """p90 of per-request sizes as vLLM records them."""
    specs = (
        (vllm.REQUEST_PROMPT_TOKENS, "prompt"), (vllm.REQUEST_GENERATION_TOKENS, "generated"),
        (vllm.REQUEST_MAX_NUM_GENERATION_TOKENS, "max generated of n"),
        (vllm.REQUEST_PARAMS_MAX_TOKENS, "max_tokens asked"),
        (vllm.REQUEST_PREFILL_KV_COMPUTED_TOKENS, "prefill computed"),
    )
    return [Query(quantile(0.9, spec), f"{name} p90 {{{{model_name}}}}") for spec, name in specs]


def request_n() -> Query:
    """p90 of the n parameter per request."""
    return Query(quantile(0.9, vllm.REQUEST_PARAMS_N), "n p90 {{model_name}}")


def mfu() -> list[Query]:
    """Estimated FLOPs and bytes moved per GPU per second (vLLM --enable-mfu-metrics)."""
    return [
        Query(by("model_name", rate(vllm.ESTIMATED_FLOPS_PER_GPU)), "FLOP/s {{model_name}}"),
        Query(by("model_name", rate(vllm.ESTIMATED_READ_BYTES_PER_GPU)), "read B/s {{model_name}}"),
        Query(by("model_name", rate(vllm.ESTIMATED_WRITE_BYTES_PER_GPU)), "written B/s {{model_name}}"),
    ]


def readiness(config_vllm_job: str) -> list[Query]:
    """Upstream readiness probe, vLLM awake flag and Prometheus' scrape of vLLM, per replica."""
    return [
        Query(by(INSTANCE, sel(request.UPSTREAM_READY), "min"), "ready (sidecar probe) {{instance}}"),
        Query(by("model_name, instance, engine", sel(vllm.ENGINE_SLEEP_STATE, 'sleep_state="awake"'), "min"),
              "awake {{model_name}} {{instance}}/{{engine}}"),
        Query(by(INSTANCE, f'{external.UP.series}{{job="{config_vllm_job}"}}', "min"),
              "scraped by Prometheus {{instance}}"),
    ]


def cold_starts() -> Query:
    """Engine restarts in the time range: resets of vLLM's finished-request counter, per replica (its series
    reset together: the max), summed over replicas."""
    per_replica = by("model_name, instance", f"resets({sel(vllm.REQUEST_SUCCESS)}[{RANGE}])", "max")
    return Query(by("model_name", per_replica), "{{model_name}}", instant=True)


def engine_info() -> Query:
    """The vLLM metrics generation and the number of data-parallel engines, per model."""
    return Query(by("model_name, generation, engines", sel(engine.ENGINE_INFO), "max"), "", instant=True,
                 table=True)


# ------------------------------------------------------------------ GPUs


def gpu_memory(rules: RulesConfig) -> list[Query]:
    """GPU memory used against total, and the alert line (rules.gpu_memory_ratio of the total)."""
    return [
        Query(by(GPU, sel(gpu.GPU_MEMORY_USED)), "used {{instance}}/{{gpu}}"),
        Query(by(GPU, sel(gpu.GPU_MEMORY_TOTAL)), "total {{instance}}/{{gpu}}"),
        Query(f"{by(GPU, sel(gpu.GPU_MEMORY_TOTAL))} * {number(rules.gpu_memory_ratio)}",
              "alert line {{instance}}/{{gpu}}"),
    ]


def gpu_memory_ratio() -> Query:
    """GPU memory used as a share of the total."""
    return Query(f"{by(GPU, sel(gpu.GPU_MEMORY_USED))} / {by(GPU, sel(gpu.GPU_MEMORY_TOTAL))}",
                 "{{instance}}/{{gpu}}")


def gpu_utilization() -> list[Query]:
    """Kernel and memory-copy utilisation per GPU."""
    return [
        Query(by(GPU, sel(gpu.GPU_UTILIZATION)), "kernels {{instance}}/{{gpu}}"),
        Query(by(GPU, sel(gpu.GPU_MEMORY_COPY_UTILIZATION)), "memory copies {{instance}}/{{gpu}}"),
    ]


def gpu_power() -> list[Query]:
    """Power draw against the enforced limit, and average power from the energy counter."""
    return [
        Query(by(GPU, sel(gpu.GPU_POWER)), "draw {{instance}}/{{gpu}}"),
        Query(by(GPU, sel(gpu.GPU_POWER_LIMIT)), "limit {{instance}}/{{gpu}}"),
        Query(by(GPU, rate(gpu.GPU_ENERGY)), "from energy counter {{instance}}/{{gpu}}"),
    ]


def gpu_energy() -> Query:
    """Energy used per GPU over the time range, in joules."""
    return Query(by(GPU, f"increase({sel(gpu.GPU_ENERGY)}[{RANGE}])"), "{{instance}}/{{gpu}}", instant=True)


def tokens_per_joule() -> Query:
    """Generated tokens per joule of GPU energy, per model (mean over replicas)."""
    return Query(by("model_name", sel(gpu.GPU_TOKENS_PER_JOULE), "avg"), "{{model_name}}")


def gpu_temperature() -> Query:
    """GPU die temperature."""
    return Query(by(GPU, sel(gpu.GPU_TEMPERATURE), "max"), "{{instance}}/{{gpu}}")


def gpu_clocks() -> list[Query]:
    """SM and memory clocks."""
    return [
        Query(by(GPU, sel(gpu.GPU_SM_CLOCK), "max"), "SM {{instance}}/{{gpu}}"),
        Query(by(GPU, sel(gpu.GPU_MEMORY_CLOCK), "max"), "memory {{instance}}/{{gpu}}"),
    ]


def throttle_reasons() -> Query:
    """Clock-throttle reasons active now, one series per GPU and reason."""
    return Query(by(f"{GPU}, reason", sel(gpu.GPU_CLOCK_EVENT_ACTIVE), "max"), "{{instance}}/{{gpu}} {{reason}}")


def xid_errors() -> Query:
    """XID errors per GPU in the rate window; 0 for GPUs that never reported one."""
    errors = by(GPU, f"increase({sel(gpu.GPU_XID_ERRORS)}[{RATE}])")
    return Query(f"{errors} or {zero_per_gpu()}", "{{instance}}/{{gpu}}")


def ecc_errors() -> list[Query]:
    """ECC errors per second, remapped rows and pending remaps; 0 where never reported."""
    return [
        Query(f"{by(GPU + ', error_type', rate(gpu.GPU_ECC_ERRORS))} or {zero_per_gpu()}",
              "ECC {{instance}}/{{gpu}} {{error_type}}"),
        Query(f"{by(GPU, sel(gpu.GPU_REMAPPED_ROWS))} or {zero_per_gpu()}", "remapped rows {{instance}}/{{gpu}}"),
        Query(f"{by(GPU, sel(gpu.GPU_ROW_REMAP_PENDING), 'max')} or {zero_per_gpu()}",
              "remap pending {{instance}}/{{gpu}}"),
    ]


def gpu_process_memory() -> list[Query]:
    """GPU memory per process, and the upstream's own total."""
    return [
        Query(by(f"{GPU}, pid", sel(gpu.GPU_PROCESS_MEMORY)), "{{instance}}/{{gpu}} pid {{pid}}"),
        Query(by(GPU, sel(gpu.GPU_PROCESSES)), "processes {{instance}}/{{gpu}}"),
    ]


def gpu_up() -> list[Query]:
    """GPUs answering NVML and GPUs NVML reports (summed over replicas), and whether every exporter runs."""
    return [
        Query(f"sum({sel(gpu.GPU_UP)})", "up"),
        Query(f"sum({sel(gpu.GPU_COUNT)})", "reported"),
        Query(f"min({sel(gpu.GPU_EXPORTER_UP)})", "exporter up (every replica)"),
    ]


def gpu_info() -> Query:
    """Static facts of every GPU as a table."""
    labels = "instance, gpu, uuid, gpu_model, driver_version, cuda_driver_version, memory_total_bytes"
    return Query(by(labels, sel(gpu.GPU_INFO), "max"), "", instant=True, table=True)


def gpu_exporter_health() -> list[Query]:
    """NVML calls skipped as unsupported and failed per second, and the collection time."""
    return [
        Query(f"{by(GPU, rate(gpu.GPU_EXPORTER_UNSUPPORTED))} or {zero_per_gpu()}",
              "unsupported {{instance}}/{{gpu}}"),
        Query(f"{by(GPU, rate(gpu.GPU_EXPORTER_ERRORS))} or {zero_per_gpu()}", "failed {{instance}}/{{gpu}}"),
        Query(f"max({sel(gpu.GPU_EXPORTER_COLLECT_DURATION)})", "collect seconds"),
    ]


def xid_last() -> Query:
    """Unix time of the last XID error per GPU and code."""
    return Query(by(f"{GPU}, xid", sel(gpu.GPU_XID_LAST), "max"), "", instant=True, table=True)


def gpu_memory_breakdown() -> list[Query]:
    """Free and driver-reserved memory per GPU."""
    return [
        Query(by(GPU, sel(gpu.GPU_MEMORY_FREE)), "free {{instance}}/{{gpu}}"),
        Query(by(GPU, sel(gpu.GPU_MEMORY_RESERVED)), "reserved {{instance}}/{{gpu}}"),
    ]


# ------------------------------------------------------------------ observability pipeline


def log_records() -> list[Query]:
    """Log records per second seen, kept (by reason) and dropped (by reason)."""
    return [
        Query(f"sum({rate(pipeline.LOG_RECORDS_SEEN)})", "seen"),
        Query(by("reason", rate(pipeline.LOG_RECORDS_KEPT)), "kept: {{reason}}"),
        Query(by("reason", rate(pipeline.LOG_RECORDS_DROPPED)), "dropped: {{reason}}"),
        Query(f"sum({rate(pipeline.LOG_RECORDS_LOST)})", "lost"),
    ]


def sampling_ratio() -> Query:
    """Share of log records kept."""
    return Query(f"sum({rate(pipeline.LOG_RECORDS_KEPT)}) / sum({rate(pipeline.LOG_RECORDS_SEEN)})", "kept")


def log_queue() -> list[Query]:
    """Records waiting in the writer queue against its capacity."""
    return [
        Query(f"max({sel(pipeline.LOG_QUEUE_RECORDS)})", "queued"),
        Query(f"max({sel(pipeline.LOG_QUEUE_CAPACITY)})", "capacity"),
    ]


def archive_bytes() -> list[Query]:
    """Bytes per second written to the archive, and the same records as raw JSON."""
    return [
        Query(f"sum({rate(pipeline.LOG_ARCHIVE_WRITTEN_BYTES)})", "written (compressed)"),
        Query(f"sum({rate(pipeline.LOG_RAW_BYTES)})", "raw JSON"),
    ]


def compression_ratio() -> Query:
    """Raw JSON bytes per archived byte, over the time range."""
    raw = f"sum(increase({sel(pipeline.LOG_RAW_BYTES)}[{RANGE}]))"
    written = f"sum(increase({sel(pipeline.LOG_ARCHIVE_WRITTEN_BYTES)}[{RANGE}]))"
    return Query(f"{raw} / {written}", "raw / written", instant=True)


def archive_activity() -> list[Query]:
    """Records archived, frames written and segments published per second."""
    return [
        Query(f"sum({rate(pipeline.LOG_ARCHIVED_RECORDS)})", "records"),
        Query(f"sum({rate(pipeline.LOG_FRAMES)})", "frames"),
        Query(f"sum({rate(pipeline.LOG_SEGMENTS)})", "segments published"),
        Query(f"sum({rate(pipeline.LOG_SEGMENTS_DELETED)})", "segments deleted"),
    ]


def scrape_health() -> list[Query]:
    """The sidecar's scrape of vLLM: up, duration and failures per second."""
    # A failure reason's series appears at its first failure; until then the rate is 0 only where
    # the sidecar reports its scrape at all (scrape_up present), and absent where it does not.
    return [
        Query(f"min({sel(engine.SCRAPE_UP)})", "up"),
        Query(f"max({sel(engine.SCRAPE_DURATION)})", "duration (s)"),
        Query(f"sum({rate(engine.SCRAPE_FAILURES)}) or 0 * count({sel(engine.SCRAPE_UP)})", "failures/s"),
    ]


def scrape_problems() -> list[Query]:
    """Parse errors per second and unknown families in the sidecar's scrape of vLLM."""
    return [
        Query(f"sum({rate(engine.SCRAPE_PARSE_ERRORS)})", "parse errors/s"),
        Query(f"max({sel(engine.SCRAPE_UNKNOWN_FAMILIES)})", "unknown families"),
    ]


def scrape_age() -> Query:
    """Seconds since the sidecar last scraped vLLM successfully (the stalest replica)."""
    return Query(f"time() - min({sel(engine.SCRAPE_LAST_SUCCESS)})", "age", instant=True)


def prometheus_targets() -> Query:
    """Prometheus' own scrape of each job: 1 up, 0 down."""
    return Query(by("job", external.UP.series, "min"), "{{job}}")


def rule_evaluation_time() -> list[Query]:
    """Seconds the last evaluation of each rule group took, and rule evaluation failures per second."""
    return [
        Query(by("rule_group", external.RULE_GROUP_LAST_DURATION.series, "max"), "{{rule_group}}"),
        Query(f"sum(rate({external.RULE_EVALUATION_FAILURES.series}[{RATE}]))", "failures/s"),
    ]


def notifications(prometheus_job: str) -> list[Query]:
    """Alert notifications per second sent, failed and dropped by Prometheus."""
    job = f'{{job="{prometheus_job}"}}'
    return [
        Query(f"sum(rate({external.NOTIFICATIONS_SENT.series}{job}[{RATE}]))", "sent"),
        Query(f"sum(rate({external.NOTIFICATIONS_ERRORS.series}{job}[{RATE}]))", "failed"),
        Query(f"sum(rate({external.NOTIFICATIONS_DROPPED.series}{job}[{RATE}]))", "dropped"),
    ]


def embedded_evaluation() -> list[Query]:
    """The sidecar's embedded rule engine: p90 cycle time and failed evaluations per second."""
    return [
        Query(quantile(0.9, rules.RULE_EVALUATION_SECONDS, ""), "embedded p90 cycle"),
        Query(f"sum({rate(rules.RULE_EVALUATION_FAILURES)})", "embedded failures/s"),
    ]


def embedded_notifications() -> Query:
    """Alerts per second the embedded engine sent, by target and result; 0 before the first one."""
    sent = by("target, result", rate(rules.RULE_NOTIFICATIONS))
    return Query(f"{sent} or (sum({sel(rules.RULE_STORED_SERIES)}) * 0)", "{{target}} {{result}}")


def embedded_alerts() -> list[Query]:
    """Alerts the embedded engine holds by state, and the series in its store."""
    return [
        Query(by("state", sel(rules.RULE_ALERTS), "max"), "{{state}}"),
        Query(f"max({sel(rules.RULE_STORED_SERIES)})", "stored series"),
    ]


def process_memory() -> list[Query]:
    """The upstream process of each replica: resident memory and GPU memory."""
    return [
        Query(by(INSTANCE, sel(process.PROCESS_RESIDENT_MEMORY), "max"), "resident {{instance}}"),
        Query(by(INSTANCE, sel(process.PROCESS_GPU_MEMORY), "max"), "GPU {{instance}}"),
    ]

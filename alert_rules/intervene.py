"""The intervene-now rules: conditions that need a human (or an automatic breaker) soon.

Every rule reads the sidecar's own series (derived engine signals, request metrics, NVML,
upstream process), never Prometheus' synthetic ``up``, so Prometheus and the embedded
evaluator see exactly the same inputs. Thresholds are rendered as float literals from the
config; an observed value equal to a threshold does not fire (strict ``>``) unless stated.
"""

from __future__ import annotations

from collections.abc import Callable

from alert_rules.config import RulesConfig
from alert_rules.slo import error_outcomes
from alert_rules.spec import AlertRule, RuleGroup, Severity, any_of, duration, number, selector
from exporters.catalog.engine import ENGINE_BATCH_REQUESTS, ENGINE_PREEMPTIONS, ENGINE_REQUESTS, KV_USAGE, SCRAPE_UP
from exporters.catalog.gpu import GPU_MEMORY_TOTAL, GPU_MEMORY_USED
from exporters.catalog.pipeline import LOG_RECORDS_DROPPED, LOG_RECORDS_LOST
from exporters.catalog.process import PROCESS_OOM_EVENTS, PROCESS_RESIDENT_MEMORY
from exporters.catalog.request import E2E_LATENCY_SECONDS, REQUESTS
from exporters.errors import ConfigError
from exporters.records import length_bucket_labels, long_length_buckets

DEGRADE_ALERT = "InferwatchCircuitBreakerDegrade"
"""The circuit breaker's first level; the sidecar's load shedding watches it by this name."""
M = "model_name"

Builder = Callable[[RulesConfig, tuple[int, ...]], list[AlertRule]]
"""An alert generator: ``(config, length bucket edges) -> alerts``."""


def _pct(ratio: float) -> str:
    return f"{ratio * 100:g} %"


def _p99(window_s: float, *matchers: tuple[str, str, str], q: float = 0.99) -> str:
    bucket = selector(E2E_LATENCY_SECONDS.bucket, *matchers)
    return f"histogram_quantile({number(q)}, sum by ({M}, le) (rate({bucket}[{duration(window_s)}])))"


def _error_ratio(window_s: float, *matchers: tuple[str, str, str]) -> str:
    w = duration(window_s)
    bad = selector(REQUESTS.series, ("outcome", "=~", any_of(error_outcomes())), *matchers)
    every = selector(REQUESTS.series, *matchers)
    return f"sum by ({M}) (rate({bad}[{w}])) / sum by ({M}) (rate({every}[{w}]))"


def swapping(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """vLLM V0: requests stay swapped out to CPU memory without a break."""
    swapped = selector(ENGINE_REQUESTS.series, ("state", "=", "swapped"))
    return [AlertRule(
        name="InferwatchRequestsSwapped",
        expr=f"sum by ({M}) ({swapped}) > 0",
        for_s=config.swap_for_s,
        severity=Severity.CRITICAL,
        summary="Requests have been swapped out of the KV cache for minutes.",
        description=(
            f"Model {{{{ $labels.model_name }}}} has kept requests swapped out to CPU memory without a "
            f"break for {duration(config.swap_for_s)}: the KV cache is too small for the running batch."
        ),
    )]


def preemption(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """vLLM V1: preemptions in every window for minutes (the V1 counterpart of swapping)."""
    w = duration(config.preemption_window_s)
    return [AlertRule(
        name="InferwatchPreemptionStorm",
        expr=f"sum by ({M}) (increase({ENGINE_PREEMPTIONS.series}[{w}])) > 0",
        for_s=config.preemption_for_s,
        severity=Severity.CRITICAL,
        summary="The engine keeps preempting running requests.",
        description=(
            f"Model {{{{ $labels.model_name }}}} preempted requests in every {w} window for "
            f"{duration(config.preemption_for_s)}: the KV cache cannot hold the running batch, and "
            f"preempted requests are recomputed from scratch."
        ),
    )]


def latency_sla(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """P99 end-to-end latency above a multiple of each model's SLA."""
    clauses = []
    for model, sla in sorted(config.sla_seconds.items()):
        limit = number(config.sla_factor * sla)
        clauses.append(f"({_p99(config.sla_window_s, (M, '=', model))} > {limit})")
    others = tuple((M, "!=", model) for model in sorted(config.sla_seconds))
    clauses.append(f"({_p99(config.sla_window_s, *others)} > {number(config.sla_factor * config.sla_default_s)})")
    slas = ", ".join(f"{m}: {s:g} s" for m, s in sorted(config.sla_seconds.items()))
    table = f"{slas}; others: {config.sla_default_s:g} s" if slas else f"{config.sla_default_s:g} s"
    return [AlertRule(
        name="InferwatchLatencyAboveSLA",
        expr=" or ".join(clauses),
        for_s=config.sla_for_s,
        severity=Severity.CRITICAL,
        summary="P99 end-to-end latency is far above the SLA.",
        description=(
            f"P99 end-to-end latency of model {{{{ $labels.model_name }}}} over "
            f"{duration(config.sla_window_s)} has stayed above {config.sla_factor:g} x its SLA ({table}) "
            f"for {duration(config.sla_for_s)}."
        ),
    )]


def gpu_memory(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """GPU framebuffer memory nearly exhausted."""
    return [AlertRule(
        name="InferwatchGpuMemoryHigh",
        expr=f"{GPU_MEMORY_USED.series} / {GPU_MEMORY_TOTAL.series} > {number(config.gpu_memory_ratio)}",
        for_s=config.gpu_memory_for_s,
        severity=Severity.WARNING,
        summary="GPU memory is nearly exhausted.",
        description=(
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.uuid }}}}) has used more than "
            f"{_pct(config.gpu_memory_ratio)} of its memory for {duration(config.gpu_memory_for_s)}."
        ),
    )]


def circuit_breaker(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Two levels: degrade (warning) on errors or latency, roll back (critical) on more errors."""
    ratio = _error_ratio(config.breaker_window_s)
    p99 = _p99(config.breaker_window_s)
    w = duration(config.breaker_window_s)
    degrade = AlertRule(
        name=DEGRADE_ALERT,
        expr=f"({ratio} > {number(config.degrade_error_ratio)}) or ({p99} > {number(config.degrade_p99_s)})",
        for_s=config.breaker_for_s,
        severity=Severity.WARNING,
        labels={"action": "degrade"},
        summary="A model should be degraded: shed load or lower its limits.",
        description=(
            f"Model {{{{ $labels.model_name }}}} has had an error ratio above "
            f"{_pct(config.degrade_error_ratio)} or a p99 latency above {config.degrade_p99_s:g} s over "
            f"{w} for {duration(config.breaker_for_s)}."
        ),
    )
    rollback = AlertRule(
        name="InferwatchCircuitBreakerRollback",
        expr=f"{ratio} > {number(config.rollback_error_ratio)}",
        for_s=config.breaker_for_s,
        keep_firing_for_s=config.breaker_keep_firing_for_s,
        severity=Severity.CRITICAL,
        labels={"action": "rollback"},
        summary="A model fails too many requests: roll back the last change.",
        description=(
            f"Model {{{{ $labels.model_name }}}} has had an error ratio above "
            f"{_pct(config.rollback_error_ratio)} over {w} for {duration(config.breaker_for_s)}."
        ),
    )
    return [degrade, rollback]


def oom_burst(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Several out-of-memory events in a few seconds.

    Counted as max - min of the counter inside the window, not ``increase()``, whose
    extrapolation would turn 2 events into 4 when scrapes do not line up with the window.
    """
    w = duration(config.oom_window_s)
    series = PROCESS_OOM_EVENTS.series
    return [AlertRule(
        name="InferwatchOOMBurst",
        expr=f"sum(max_over_time({series}[{w}]) - min_over_time({series}[{w}])) >= {config.oom_count}",
        severity=Severity.CRITICAL,
        summary="The upstream hit several out-of-memory errors in a few seconds.",
        description=(
            f"{config.oom_count} or more out-of-memory events of the upstream within {w}: requests are "
            f"failing and the server may be about to crash."
        ),
    )]


def memory_leak(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """The upstream process's resident memory keeps growing."""
    w = duration(config.leak_window_s)
    rss = PROCESS_RESIDENT_MEMORY.series
    return [AlertRule(
        name="InferwatchUpstreamMemoryLeak",
        expr=f"deriv({rss}[{w}]) * 3600 / avg_over_time({rss}[{w}]) > {number(config.leak_growth_per_hour)}",
        for_s=config.leak_for_s,
        severity=Severity.WARNING,
        summary="The upstream process's memory keeps growing.",
        description=(
            f"Resident memory of the upstream has grown faster than {_pct(config.leak_growth_per_hour)} "
            f"per hour over {w} for {duration(config.leak_for_s)}: a leak will end in an OOM kill."
        ),
    )]


def long_context(config: RulesConfig, edges: tuple[int, ...]) -> list[AlertRule]:
    """Failure ratio of long prompts on its own, so short traffic cannot average it away."""
    long_buckets = long_length_buckets(edges, above=config.long_context_tokens)
    if not long_buckets:
        labels = ", ".join(length_bucket_labels(edges))
        raise ConfigError(
            "rules.long_context_tokens",
            f"no length bucket starts at or above it (buckets: {labels}; edges come from "
            f"serve.length_bucket_edges)",
            config.long_context_tokens,
        )
    ratio = _error_ratio(config.long_context_window_s, ("length_bucket", "=~", any_of(long_buckets)))
    return [AlertRule(
        name="InferwatchLongContextFailures",
        expr=f"{ratio} > {number(config.long_context_error_ratio)}",
        for_s=config.long_context_for_s,
        severity=Severity.WARNING,
        labels={"length_buckets": ",".join(long_buckets)},
        summary="Long prompts fail far more often than the rest.",
        description=(
            f"More than {_pct(config.long_context_error_ratio)} of requests to model "
            f"{{{{ $labels.model_name }}}} with prompts of {config.long_context_tokens} tokens or more "
            f"failed over {duration(config.long_context_window_s)}, for "
            f"{duration(config.long_context_for_s)}."
        ),
    )]


def queue(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Requests pile up in the scheduler's waiting queue."""
    waiting = selector(ENGINE_REQUESTS.series, ("state", "=", "waiting"))
    return [AlertRule(
        name="InferwatchQueueBacklog",
        expr=f"sum by ({M}) ({waiting}) > {number(config.queue_waiting)}",
        for_s=config.queue_for_s,
        severity=Severity.WARNING,
        summary="Requests are piling up in the scheduler queue.",
        description=(
            f"More than {config.queue_waiting:g} requests to model {{{{ $labels.model_name }}}} have been "
            f"waiting to be scheduled for {duration(config.queue_for_s)}."
        ),
    )]


def upstream_down(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """The sidecar cannot scrape the upstream (read from its own gauge, not Prometheus' ``up``)."""
    return [AlertRule(
        name="InferwatchUpstreamDown",
        expr=f"{SCRAPE_UP.series} == 0",
        for_s=config.upstream_down_for_s,
        severity=Severity.CRITICAL,
        summary="The sidecar cannot scrape the upstream vLLM server.",
        description=(
            f"Every scrape of {{{{ $labels.upstream }}}}/metrics has failed for "
            f"{duration(config.upstream_down_for_s)}: the server is down, hung or unreachable."
        ),
    )]


def kv_cache(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """The KV cache stays nearly full."""
    return [AlertRule(
        name="InferwatchKVCacheNearlyFull",
        expr=f"{KV_USAGE.series} > {number(config.kv_cache_ratio)}",
        for_s=config.kv_cache_for_s,
        severity=Severity.WARNING,
        summary="The KV cache has been nearly full for minutes.",
        description=(
            f"KV cache usage of model {{{{ $labels.model_name }}}} has stayed above "
            f"{_pct(config.kv_cache_ratio)} for {duration(config.kv_cache_for_s)}; preemptions follow."
        ),
    )]


def log_drops(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """The log pipeline loses request records (queue full or write failures; sampling is not a loss)."""
    w = duration(config.log_drops_window_s)
    dropped = selector(LOG_RECORDS_DROPPED.series, ("reason", "=", "queue_full"))
    return [AlertRule(
        name="InferwatchLogRecordsDropped",
        expr=f"sum(increase({dropped}[{w}])) > 0 or sum(increase({LOG_RECORDS_LOST.series}[{w}])) > 0",
        severity=Severity.WARNING,
        summary="The log pipeline is dropping request records.",
        description=(
            f"The sidecar's log pipeline dropped records because its queue was full, or lost queued "
            f"records because writing failed, within the last {w}: request logs have gaps."
        ),
    )]


def batch_advice(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Advice, never a page: the running batch stays below max_num_seqs."""
    if config.max_num_seqs == 0:
        return []
    w = duration(config.batch_window_s)
    bucket = ENGINE_BATCH_REQUESTS.bucket
    quantile = f"histogram_quantile({number(config.batch_quantile)}, sum by ({M}, le) (rate({bucket}[{w}])))"
    suggested = round(config.max_num_seqs * config.batch_raise_factor)
    return [AlertRule(
        name="InferwatchBatchSizeAdvice",
        expr=f"{quantile} < {config.max_num_seqs}",
        for_s=config.batch_window_s,
        severity=Severity.INFO,
        labels={"max_num_seqs": str(config.max_num_seqs), "suggested_max_num_seqs": str(suggested)},
        summary="Advice: the running batch size could be raised.",
        description=(
            f"The {config.batch_quantile * 100:g}th percentile of the running batch of model "
            f"{{{{ $labels.model_name }}}} has stayed below max_num_seqs ({config.max_num_seqs}) for "
            f"{w}; consider --max-num-seqs {suggested} (+{(config.batch_raise_factor - 1) * 100:g} %)."
        ),
    )]


BUILDERS: tuple[Builder, ...] = (
    swapping, preemption, latency_sla, gpu_memory, circuit_breaker, oom_burst, memory_leak,
    long_context, queue, upstream_down, kv_cache, log_drops, batch_advice,
)


def rule_groups(config: RulesConfig, edges: tuple[int, ...], extra: tuple[Builder, ...] = ()) -> tuple[RuleGroup, ...]:
    """The intervene-now group (plus advice), one alert list in builder order."""
    alerts = tuple(alert for build in (*BUILDERS, *extra) for alert in build(config, edges))
    return (RuleGroup("inferwatch-intervene", alerts, config.evaluation_interval_s, file="intervene"),)


__all__ = ["BUILDERS", "Builder", "rule_groups"]

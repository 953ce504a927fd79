"""The intervene-now rules: conditions that need a human (or an automatic breaker) soon.

Every rule reads the sidecar's own series (derived engine signals, request metrics, NVML,
upstream process), never Prometheus' synthetic ``up``, so Prometheus and the embedded
evaluator see exactly the same inputs. Thresholds are rendered as float literals from the
config; an observed value equal to a threshold does not fire (strict ``>``) unless stated.

Each alert is one definition: the rule, its runbook and its promtool scenario (inputs that make it
fire and inputs that keep it quiet, built from the same config values as the rule). Adding an
alert is one builder here, listed in ``BUILDERS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from alert_rules.canary import canary_breaker
from alert_rules.config import RulesConfig
from alert_rules.context import MODEL as MODEL_SCOPE
from alert_rules.context import MODEL_REPLICA, REPLICA, context
from alert_rules.runbooks import EXPLAIN_SLOWEST, KV_FIXES, ROLLBACK, SHED, Runbook
from alert_rules.scenario import (
    MODEL,
    UPSTREAM,
    Case,
    Scenario,
    Series,
    above,
    ceil_to,
    counter_values,
    first_eval_after,
    gauge_values,
    le_series,
    ratio_traffic,
    request_series,
    step_for,
    steps_needed,
)
from alert_rules.slo import SERVED, error_outcomes, le_value
from alert_rules.spec import AlertRule, RuleGroup, Severity, any_of, duration, number, selector
from exporters import buckets
from exporters.catalog.engine import (
    ENGINE_BATCH_REQUESTS,
    ENGINE_GENERATION_TOKENS,
    ENGINE_PREEMPTIONS,
    ENGINE_REQUESTS,
    KV_SWAP_BYTES,
    KV_USAGE,
    SCRAPE_UP,
)
from exporters.catalog.gpu import GPU_MEMORY_TOTAL, GPU_MEMORY_USED
from exporters.catalog.pipeline import LOG_RECORDS_DROPPED, LOG_RECORDS_LOST
from exporters.catalog.process import PROCESS_OOM_EVENTS, PROCESS_RESIDENT_MEMORY
from exporters.catalog.request import E2E_LATENCY_SECONDS, REQUESTS, UPSTREAM_READY
from exporters.errors import ConfigError
from exporters.records import context_32k_bucket, length_bucket_labels, long_length_buckets

DEGRADE_ALERT = "InferwatchCircuitBreakerDegrade"
"""The circuit breaker's first level; the sidecar's load shedding watches it by this name."""
M = "model_name"
PER_REPLICA = "model_name, instance"
"""Per-engine conditions keep the scrape target (one replica's sidecar), so the page names the pod; fleet
conditions (error ratio, latency, SLOs) sum rates over instances by model. Where ``instance`` is absent
(the embedded evaluator, a single target) grouping by it changes nothing."""

GPU_SCOPE = ("instance", "gpu")
"""Context scope of the GPU alert: that GPU of that sidecar's host (no model runs on a GPU label)."""

Builder = Callable[[RulesConfig, tuple[int, ...]], list[AlertRule]]
"""An alert generator: ``(config, length bucket edges) -> alerts``, each with its runbook and scenario."""


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


def _swapped_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = steps_needed(c.swap_for_s + 120, 60)
    s = selector(ENGINE_REQUESTS.series, ("model_name", "=", MODEL), ("state", "=", "swapped"))
    return Scenario(60, (Series(s, gauge_values(3, n)),), (Series(s, gauge_values(0, n)),), 0, {"model_name": MODEL})


def swapping(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """vLLM V0: requests stay swapped out to CPU memory without a break."""
    swapped = selector(ENGINE_REQUESTS.series, ("state", "=", "swapped"))
    return [AlertRule(
        name="InferwatchRequestsSwapped",
        expr=f"sum by ({PER_REPLICA}) ({swapped}) > 0",
        for_s=config.swap_for_s,
        severity=Severity.CRITICAL,
        summary="Requests have been swapped out of the KV cache for minutes.",
        description=(
            f"Model {{{{ $labels.model_name }}}} has kept requests swapped out to CPU memory without a "
            f"break for {duration(config.swap_for_s)}: the KV cache is too small for the running batch."
        ),
        runbook=Runbook(
            "vLLM V0 keeps requests swapped out to CPU memory: the GPU KV cache cannot hold the running "
            "batch, so requests stall while their blocks move across PCIe.",
            ("KV cache usage and running/waiting requests on the engine "
             "dashboard.", "Prompt length mix: did long prompts arrive (length_bucket panels)?"),
            (*KV_FIXES, SHED),
        ),
        scenario=_swapped_scenario,
        annotations=context(MODEL_REPLICA),
    )]


def _preemption_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.preemption_window_s)
    n = steps_needed(c.preemption_for_s + 4 * step, step)
    s = selector(ENGINE_PREEMPTIONS.series, ("model_name", "=", MODEL))
    return Scenario(step, (Series(s, counter_values(5, n)),), (Series(s, gauge_values(7, n)),), step,
                    {"model_name": MODEL})


def preemption(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """vLLM V1: preemptions in every window for minutes (the V1 counterpart of swapping)."""
    w = duration(config.preemption_window_s)
    return [AlertRule(
        name="InferwatchPreemptionStorm",
        expr=f"sum by ({PER_REPLICA}) (increase({ENGINE_PREEMPTIONS.series}[{w}])) > 0",
        for_s=config.preemption_for_s,
        severity=Severity.CRITICAL,
        summary="The engine keeps preempting running requests.",
        description=(
            f"Model {{{{ $labels.model_name }}}} preempted requests in every {w} window for "
            f"{duration(config.preemption_for_s)}: the KV cache cannot hold the running batch, and "
            f"preempted requests are recomputed from scratch."
        ),
        runbook=Runbook(
            "The V1 engine preempted requests in every window: it runs out of KV blocks, throws away a "
            "running request's cache and recomputes it later, so throughput collapses and latency grows.",
            ("KV cache usage and the preemption rate per model.",
             "Whether long prompts or large `max_tokens` values started recently."),
            (*KV_FIXES, SHED),
        ),
        scenario=_preemption_scenario,
        annotations=context(MODEL_REPLICA),
    )]


def _latency_buckets(limit: float, slow: bool, steps: int, per_step: int = 10) -> tuple[Series, ...]:
    """E2E histogram series, ``per_step`` requests a step, whose p99 is above ``limit`` (slow) or clearly below it."""
    bounds = buckets.REQUEST_LATENCY
    over = next((b for b in bounds if b > limit), None)
    under = max((b for b in bounds if b < limit), default=None)
    les: dict[str, float] = {}
    if under is not None:
        les[le_value(under)] = 0 if slow else per_step
    if over is not None:
        les[le_value(over)] = 0 if slow else per_step
    les["+Inf"] = per_step
    if under is None and not slow:
        raise ConfigError("rules", f"a latency limit of {limit:g} s is below every histogram bucket bound")
    return le_series(E2E_LATENCY_SECONDS.bucket, MODEL, les, steps)


def _latency_sla_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.sla_window_s)
    n = steps_needed(c.sla_for_s + 4 * step, step)
    limit = c.sla_factor * c.sla_for(MODEL)
    if limit >= buckets.REQUEST_LATENCY[-1]:
        raise ConfigError("rules.sla_factor", "x the SLA is above the latency histogram's highest bound", limit)
    # A step alone brings the requests the window needs (rules.sla_min_requests): the evidence holds from the
    # first evaluation on, as the p99 does, so the alert fires when its `for` says.
    per_step = max(10, c.sla_min_requests)
    return Scenario(step, _latency_buckets(limit, True, n, per_step), _latency_buckets(limit, False, n, per_step),
                    step, {"model_name": MODEL})


def _latency_over(config: RulesConfig, limit_s: float, *matchers: tuple[str, str, str]) -> str:
    """P99 over ``limit_s``, and (with ``rules.sla_min_requests``) enough requests in the window for a p99."""
    over = f"({_p99(config.sla_window_s, *matchers)} > {number(limit_s)})"
    if not config.sla_min_requests:
        return over
    every = selector(E2E_LATENCY_SECONDS.bucket, *matchers, ("le", "=", "+Inf"))
    count = f"sum by ({M}) (increase({every}[{duration(config.sla_window_s)}]))"
    return f"({over} and ({count} >= {config.sla_min_requests}))"


def latency_sla(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """P99 end-to-end latency above a multiple of each model's SLA, over at least ``rules.sla_min_requests``
    requests (a p99 of three requests is the slowest of them: a page needs more evidence)."""
    clauses = []
    for model, sla in sorted(config.sla_seconds.items()):
        clauses.append(_latency_over(config, config.sla_factor * sla, (M, "=", model)))
    others = tuple((M, "!=", model) for model in sorted(config.sla_seconds))
    clauses.append(_latency_over(config, config.sla_factor * config.sla_default_s, *others))
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
            f"for {duration(config.sla_for_s)}"
            + (f", over at least {config.sla_min_requests} requests in the window." if config.sla_min_requests
               else ".")
        ),
        runbook=Runbook(
            "P99 end-to-end latency has been far above the model's SLA: users wait much longer than promised.",
            ("Queue length and time in queue versus prefill/decode split (is it waiting or computing?).",
             EXPLAIN_SLOWEST, "Preemptions, KV cache usage and GPU utilisation.", "Traffic volume and prompt lengths."),
            ("Shed load or add replicas when the queue is long.", *KV_FIXES[:2],
             "Separate long prompts into their own queue (chunked prefill or a dedicated replica).", ROLLBACK),
        ),
        scenario=_latency_sla_scenario,
        annotations=context(MODEL_SCOPE),
    )]


def _gpu_memory_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = steps_needed(c.gpu_memory_for_s + 120, 60)
    gpu = (("gpu", "=", "0"), ("uuid", "=", "GPU-0"))
    total = Series(selector(GPU_MEMORY_TOTAL.series, *gpu), gauge_values(80e9, n))
    used = selector(GPU_MEMORY_USED.series, *gpu)
    return Scenario(
        60, (total, Series(used, gauge_values(80e9 * above(c.gpu_memory_ratio), n))),
        (total, Series(used, gauge_values(80e9 * c.gpu_memory_ratio / 2, n))), 0, {"gpu": "0", "uuid": "GPU-0"},
    )


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
        runbook=Runbook(
            "GPU framebuffer memory has stayed above the configured share: new allocations (CUDA graphs, "
            "another process, a bigger batch) may fail with out-of-memory errors.",
            ("`nvidia-smi` or the GPU dashboard: which processes hold memory.",
             "Whether vLLM's `--gpu-memory-utilization` leaves room for other processes on the GPU."),
            ("Lower `--gpu-memory-utilization`, `--max-num-seqs` or `--max-model-len`.",
             "Use an fp8 KV cache (`--kv-cache-dtype fp8`).", "Move other processes off the GPU.", ROLLBACK),
        ),
        scenario=_gpu_memory_scenario,
        annotations=context(GPU_SCOPE),
    )]


def _breaker_scenario(ratio_firing: float, ratio_quiet: float, c: RulesConfig, alert: AlertRule) -> Scenario:
    step = step_for(c.breaker_window_s)
    fire_at = step + ceil_to(c.breaker_for_s, step)
    stop = fire_at + 2 * step
    keep = alert.keep_firing_for_s
    end = (stop + c.breaker_window_s + keep + 2 * step) if keep else stop
    n = steps_needed(end, step)
    firing = request_series(MODEL, *ratio_traffic(ratio_firing), (stop // step) if keep else n)
    quiet = request_series(MODEL, *ratio_traffic(ratio_quiet), n)
    # After the last sample at ``stop``, rate() needs two samples in [t - window, t]: false from here.
    false_from = first_eval_after(stop - step + c.breaker_window_s, step) if keep else None
    return Scenario(step, firing, quiet, step, {"model_name": MODEL}, false_from)


def _degrade_scenario(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    between = (c.degrade_error_ratio + c.rollback_error_ratio) / 2
    firing = between if c.degrade_error_ratio < c.rollback_error_ratio else above(c.degrade_error_ratio)
    return _breaker_scenario(firing, c.degrade_error_ratio / 2, c, alert)


def _rollback_scenario(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    return _breaker_scenario(above(c.rollback_error_ratio), c.rollback_error_ratio / 2, c, alert)


def _breaker_evidence(config: RulesConfig) -> tuple[str, str]:
    """The breaker's minimum of requests in its window: a PromQL ``and`` clause and its words (both empty at 0)."""
    if not config.breaker_min_requests:
        return "", ""
    count = f"sum by ({M}) (increase({selector(REQUESTS.series, SERVED)}[{duration(config.breaker_window_s)}]))"
    return (f" and ({count} >= {config.breaker_min_requests})",
            f", with at least {config.breaker_min_requests} requests in the window")


def circuit_breaker(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Two levels: degrade (warning) on errors or latency, roll back (critical) on more errors.

    Like the SLOs, they read only the inference routes, and either needs ``rules.breaker_min_requests``
    of them in its window, so a few failures with little other traffic (a 100 % error ratio over three
    requests) neither degrade nor page.
    """
    ratio = _error_ratio(config.breaker_window_s, SERVED)
    p99 = _p99(config.breaker_window_s, SERVED)
    w = duration(config.breaker_window_s)
    enough, enough_text = _breaker_evidence(config)
    degrade = AlertRule(
        name=DEGRADE_ALERT,
        expr=(f"(({ratio} > {number(config.degrade_error_ratio)}) or ({p99} > {number(config.degrade_p99_s)}))"
              f"{enough}"),
        for_s=config.breaker_for_s,
        severity=Severity.WARNING,
        labels={"action": "degrade"},
        summary="A model should be degraded: shed load or lower its limits.",
        description=(
            f"Model {{{{ $labels.model_name }}}} has had an error ratio above "
            f"{_pct(config.degrade_error_ratio)} or a p99 latency above {config.degrade_p99_s:g} s over "
            f"{w}{enough_text} for {duration(config.breaker_for_s)}."
        ),
        runbook=Runbook(
            "A model's error ratio or p99 latency crossed the degrade level of the circuit breaker: "
            "serve less, or serve it more cheaply, before it gets worse.",
            ("Errors by outcome (upstream_error, timeout, overloaded) and by length bucket.",
             "Upstream logs for tracebacks; queue length and preemptions."),
            (SHED, "Lower `--max-num-seqs` to trade throughput for latency.",
             "Route long prompts to a separate queue; cap `max_tokens` at the gateway."),
        ),
        scenario=_degrade_scenario,
        annotations=context(MODEL_SCOPE),
    )
    rollback = AlertRule(
        name="InferwatchCircuitBreakerRollback",
        expr=f"({ratio} > {number(config.rollback_error_ratio)}){enough}",
        for_s=config.breaker_for_s,
        keep_firing_for_s=config.breaker_keep_firing_for_s,
        severity=Severity.CRITICAL,
        labels={"action": "rollback"},
        summary="A model fails too many requests: roll back the last change.",
        description=(
            f"Model {{{{ $labels.model_name }}}} has had an error ratio above "
            f"{_pct(config.rollback_error_ratio)} over {w}{enough_text} for {duration(config.breaker_for_s)}."
        ),
        runbook=Runbook(
            "A model's error ratio crossed the rollback level of the circuit breaker: too many requests "
            "fail. This alert inhibits the degrade alert of the same model.",
            ("What changed last (model, vLLM version, flags, traffic).",
             "Upstream logs and the failing requests' traces (trace_id in the logs)."),
            (ROLLBACK, SHED, "Fail over to another replica or a previous model version."),
        ),
        scenario=_rollback_scenario,
        annotations=context(MODEL_SCOPE),
    )
    return [degrade, rollback]


def _oom_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.oom_window_s, cap=5)
    s = selector(PROCESS_OOM_EVENTS.series, ("source", "=", "response_body"))
    jump = 3 * step
    n_before = jump // step
    after = steps_needed(c.oom_window_s + 2 * step, step)
    firing = f"0x{n_before - 1} {c.oom_count}x{after}"
    quiet = f"0x{n_before - 1} {c.oom_count - 1}x{after}"
    # The jump lands at ``jump``; the window [t - w, t] sees both values until t - w passes ``jump - step``.
    false_from = first_eval_after(jump - step + c.oom_window_s, step)
    return Scenario(step, (Series(s, firing),), (Series(s, quiet),), jump, {}, false_from)


def oom_burst(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Several out-of-memory events in a few seconds.

    Counted as max - min of the counter inside the window, not ``increase()``, whose
    extrapolation would turn 2 events into 4 when scrapes do not line up with the window.
    """
    w = duration(config.oom_window_s)
    series = PROCESS_OOM_EVENTS.series
    return [AlertRule(
        name="InferwatchOOMBurst",
        expr=f"sum by (instance) (max_over_time({series}[{w}]) - min_over_time({series}[{w}])) >= {config.oom_count}",
        severity=Severity.CRITICAL,
        summary="The upstream hit several out-of-memory errors in a few seconds.",
        description=(
            f"{config.oom_count} or more out-of-memory events of the upstream within {w}: requests are "
            f"failing and the server may be about to crash."
        ),
        runbook=Runbook(
            "Several out-of-memory errors happened within seconds: requests fail and the server may crash "
            "or restart.",
            ("Upstream logs around the events: CUDA OOM, host OOM killer (exit status 137)?",
             "GPU and process memory panels; prompt lengths of the failing requests."),
            ("Lower `--max-num-seqs` and `--max-num-batched-tokens`.", "Use an fp8 KV cache.",
             "Lower `--gpu-memory-utilization` when something else shares the GPU.", SHED, ROLLBACK),
        ),
        scenario=_oom_scenario,
        annotations=context(REPLICA),
    )]


def _leak_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.leak_window_s)
    n = steps_needed(c.leak_for_s + 4 * step, step)
    base = 4e9
    growth = base * 2 * c.leak_growth_per_hour * step / 3600  # twice the threshold's growth per step
    s = PROCESS_RESIDENT_MEMORY.series
    return Scenario(step, (Series(s, counter_values(growth, n, base)),), (Series(s, gauge_values(base, n)),), step)


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
        runbook=Runbook(
            "The upstream process's resident memory has grown steadily: a leak that ends in an OOM kill.",
            ("Process memory panel over the last hours; whether it tracks traffic or grows at rest.",
             "vLLM version and known leak reports; tokenizer or multimodal caches."),
            ("Plan a rolling restart before memory runs out.", ROLLBACK),
        ),
        scenario=_leak_scenario,
        annotations=context(REPLICA),
    )]


def _long_thresholds(config: RulesConfig, edges: tuple[int, ...]) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """Each long-prompt threshold with its buckets (those starting at or above it: exactly the prompts of more
    than that many tokens when it is an edge), highest first."""
    labels = ", ".join(length_bucket_labels(edges))
    for tokens in config.long_context_thresholds:
        if not long_length_buckets(edges, above=tokens):
            raise ConfigError(
                "rules.long_context_tokens",
                f"no length bucket starts at or above {tokens} (buckets: {labels}; edges come from "
                f"serve.length_bucket_edges)",
                config.long_context_tokens,
            )
    return tuple((t, long_length_buckets(edges, above=t)) for t in reversed(config.long_context_thresholds))


def _class_failures(c: RulesConfig, edges: tuple[int, ...], failing: str, ratio: float) -> tuple[Series, ...]:
    """Plenty of healthy short traffic, and the ``failing`` bucket failing at ``ratio``."""
    step = step_for(c.long_context_window_s)
    n = steps_needed(c.long_context_for_s + 4 * step, step)
    # Averaged together, the long prompts' failures would vanish in the short traffic.
    short = request_series(MODEL, 10**6, 0, n, length_bucket_labels(edges)[0])
    return short + request_series(MODEL, *ratio_traffic(ratio, 1000), n, failing)


def _long_context_scenario(c: RulesConfig, _alert: AlertRule, edges: tuple[int, ...]) -> Scenario:
    thresholds = _long_thresholds(c, edges)
    step = step_for(c.long_context_window_s)
    lowest, lowest_buckets = thresholds[-1]
    firing = _class_failures(c, edges, lowest_buckets[0], above(c.long_context_error_ratio))
    quiet = _class_failures(c, edges, lowest_buckets[0], c.long_context_error_ratio / 2)
    labels = {"model_name": MODEL}
    # A failing class counts toward every threshold below it; the label names the highest whose prompts fail.
    cases = tuple(Case(f"prompts above {tokens} tokens fail",
                       _class_failures(c, edges, buckets_above[0], above(c.long_context_error_ratio)),
                       labels | {"prompt_tokens_above": str(tokens)})
                  for tokens, buckets_above in thresholds[:-1])
    return Scenario(step, firing, quiet, step, labels | {"prompt_tokens_above": str(lowest)}, cases=cases)


def long_context(config: RulesConfig, edges: tuple[int, ...]) -> list[AlertRule]:
    """Failure ratio of long prompts on its own, per threshold, so short traffic cannot average it away.

    The expression's value is the threshold whose prompts fail (the highest, when several do): the label
    ``prompt_tokens_above`` reads it.
    """
    w, r = config.long_context_window_s, number(config.long_context_error_ratio)
    clauses = [f"(({_error_ratio(w, ('length_bucket', '=~', any_of(b)))}) > {r}) * 0 + {t}"
               for t, b in _long_thresholds(config, edges)]
    thresholds = ", ".join(map(str, config.long_context_thresholds))
    return [AlertRule(
        name="InferwatchLongContextFailures",
        expr=" or ".join(f"({c})" for c in clauses),
        for_s=config.long_context_for_s,
        severity=Severity.WARNING,
        labels={"prompt_tokens_above": "{{ $value }}"},
        summary="Long prompts fail far more often than the rest.",
        description=(
            f"More than {_pct(config.long_context_error_ratio)} of requests to model "
            f"{{{{ $labels.model_name }}}} with prompts of more than {{{{ $value }}}} tokens "
            f"failed over {duration(w)}, for {duration(config.long_context_for_s)} (thresholds: {thresholds})."
        ),
        runbook=Runbook(
            "Requests with long prompts fail far more often than the rest; the overall error ratio hides it. "
            "The label `prompt_tokens_above` names the threshold (`rules.long_context_tokens`) whose prompts fail.",
            ("Errors by length bucket and outcome (timeouts? OOM?).", "`--max-model-len` and KV cache size."),
            ("Send long prompts to a separate queue or replica (`serve.long_prompt_upstream`).",
             "Enable chunked prefill.", "Use an fp8 KV cache.",
             "Raise the timeouts for long prompts, or cap prompt length at the gateway."),
        ),
        scenario=_long_context_scenario,
        annotations=context(MODEL_SCOPE),
    )]


def _context_32k_scenario(c: RulesConfig, _alert: AlertRule, edges: tuple[int, ...]) -> Scenario:
    bucket = context_32k_bucket(edges)
    firing = _class_failures(c, edges, bucket, above(c.context_32k_error_ratio))
    quiet = _class_failures(c, edges, bucket, c.context_32k_error_ratio / 2)
    return Scenario(step_for(c.long_context_window_s), firing, quiet, step_for(c.long_context_window_s),
                    {"model_name": MODEL})


def context_32k(config: RulesConfig, edges: tuple[int, ...]) -> list[AlertRule]:
    """Failure ratio of the class holding 32,000-token prompts, with its own threshold (the launch guide's
    "watch the failure rate of 32k requests on its own")."""
    bucket = context_32k_bucket(edges)
    w = config.long_context_window_s
    return [AlertRule(
        name="InferwatchContext32kFailures",
        expr=f"{_error_ratio(w, ('length_bucket', '=', bucket))} > {number(config.context_32k_error_ratio)}",
        for_s=config.long_context_for_s,
        severity=Severity.WARNING,
        labels={"length_bucket": bucket},
        summary="32k-token requests fail too often.",
        description=(
            f"More than {_pct(config.context_32k_error_ratio)} of requests to model {{{{ $labels.model_name }}}} "
            f"in the length class {bucket} (where 32,000-token prompts land) failed over {duration(w)}, for "
            f"{duration(config.long_context_for_s)}."
        ),
        runbook=Runbook(
            "Requests near a 32k context fail more often than `rules.context_32k_error_ratio`: they need the most "
            "KV cache and the longest prefill, so they are the first to hit OOM, preemption or timeouts.",
            ("Errors of the class by outcome (timeouts? overloaded? upstream errors with OOM?).",
             "`--max-model-len`, KV cache size and preemptions while these requests run.",
             "Whether they reach a replica set up for long prompts (the `lane` label)."),
            ("Send long prompts to their own replica (`serve.long_prompt_upstream`) started with "
             "`--max-model-len` and `--max-num-batched-tokens` for them.", "Enable chunked prefill.",
             "Raise the client and sidecar timeouts for these requests.", ROLLBACK),
        ),
        scenario=_context_32k_scenario,
        annotations=context(MODEL_SCOPE),
    )]


def _queue_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = steps_needed(c.queue_for_s + 120, 60)
    s = selector(ENGINE_REQUESTS.series, ("model_name", "=", MODEL), ("state", "=", "waiting"))
    return Scenario(60, (Series(s, gauge_values(c.queue_waiting * 2 + 1, n)),),
                    (Series(s, gauge_values(c.queue_waiting / 2, n)),), 0, {"model_name": MODEL})


def queue(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Requests pile up in the scheduler's waiting queue."""
    waiting = selector(ENGINE_REQUESTS.series, ("state", "=", "waiting"))
    return [AlertRule(
        name="InferwatchQueueBacklog",
        expr=f"sum by ({PER_REPLICA}) ({waiting}) > {number(config.queue_waiting)}",
        for_s=config.queue_for_s,
        severity=Severity.WARNING,
        summary="Requests are piling up in the scheduler queue.",
        description=(
            f"More than {config.queue_waiting:g} requests to model {{{{ $labels.model_name }}}} have been "
            f"waiting to be scheduled for {duration(config.queue_for_s)}."
        ),
        runbook=Runbook(
            "Requests pile up in the scheduler's waiting queue: the engine is saturated.",
            ("Running batch size versus `--max-num-seqs`; KV cache usage; traffic volume.", EXPLAIN_SLOWEST),
            (SHED, "Add replicas.", "Raise `--max-num-seqs` only if the KV cache has headroom.",
             "Use an fp8 KV cache to fit more sequences."),
        ),
        scenario=_queue_scenario,
        annotations=context(MODEL_REPLICA),
    )]


def _upstream_down_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = 60 if c.upstream_down_for_s % 60 == 0 else 15
    n = steps_needed(c.upstream_down_for_s + 2 * step, step)
    s = selector(SCRAPE_UP.series, ("upstream", "=", UPSTREAM))
    return Scenario(step, (Series(s, gauge_values(0, n)),), (Series(s, gauge_values(1, n)),), 0,
                    {"upstream": UPSTREAM})


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
        runbook=Runbook(
            "The sidecar cannot scrape the upstream's /metrics: the vLLM server is down, hung or unreachable.",
            ("Is the process alive? Its logs (startup errors, OOM kill)?",
             "`curl` the upstream's /health and /metrics from the sidecar's host."),
            ("Restart the server.", ROLLBACK, "Fail traffic over to another replica."),
        ),
        scenario=_upstream_down_scenario,
        annotations=context(REPLICA),
    )]


def _kv_cache_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    n = steps_needed(c.kv_cache_for_s + 120, 60)
    s = selector(KV_USAGE.series, ("model_name", "=", MODEL))
    return Scenario(60, (Series(s, gauge_values(above(c.kv_cache_ratio), n)),),
                    (Series(s, gauge_values(c.kv_cache_ratio / 2, n)),), 0, {"model_name": MODEL})


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
        runbook=Runbook(
            "The KV cache has stayed nearly full: the next burst will preempt requests.",
            ("Preemptions, running and waiting requests.", "Prompt length mix."),
            KV_FIXES,
        ),
        scenario=_kv_cache_scenario,
        annotations=context(MODEL_REPLICA),
    )]


def _log_drops_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.log_drops_window_s)
    n = steps_needed(4 * step, step)
    full = Series(selector(LOG_RECORDS_DROPPED.series, ("reason", "=", "queue_full")), counter_values(10, n))
    flat = Series(full.series, gauge_values(4, n))
    # Sampling drops are by design: they never alert.
    sampled = Series(selector(LOG_RECORDS_DROPPED.series, ("reason", "=", "sampling")), counter_values(50, n))
    return Scenario(step, (full, sampled), (flat, sampled), step)


def log_drops(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """The log pipeline loses request records (queue full or write failures; sampling is not a loss)."""
    w = duration(config.log_drops_window_s)
    dropped = selector(LOG_RECORDS_DROPPED.series, ("reason", "=", "queue_full"))
    return [AlertRule(
        name="InferwatchLogRecordsDropped",
        expr=(f"sum by (instance) (increase({dropped}[{w}])) > 0"
              f" or sum by (instance) (increase({LOG_RECORDS_LOST.series}[{w}])) > 0"),
        severity=Severity.WARNING,
        summary="The log pipeline is dropping request records.",
        description=(
            f"The sidecar's log pipeline dropped records because its queue was full, or lost queued "
            f"records because writing failed, within the last {w}: request logs have gaps."
        ),
        runbook=Runbook(
            "The log pipeline dropped records: its queue was full or its writer failed, so request logs "
            "have gaps.",
            ("The sidecar's log-pipeline metrics (queue depth, write errors) and disk space.",),
            ("Free disk space or raise the queue size.", "Lower the success sampling rate."),
        ),
        scenario=_log_drops_scenario,
    )]


@dataclass(frozen=True, slots=True)
class BatchAdvice:
    """What the batch-size advice can suggest for one config: each direction's max_num_seqs, or None where that
    direction cannot apply (the limit already at ``batch_max``, or not above ``batch_low_traffic_max``)."""

    raise_to: int | None
    lower_to: int | None

    @classmethod
    def of(cls, c: RulesConfig) -> BatchAdvice:
        """The suggestions, always within [batch_min, batch_max]."""
        if c.batch_min > c.batch_max:
            raise ConfigError("rules.batch_min", f"must not exceed rules.batch_max ({c.batch_max})", c.batch_min)
        if c.batch_raise_factor <= 1:
            raise ConfigError("rules.batch_raise_factor", "must be above 1 (it raises max_num_seqs)",
                              c.batch_raise_factor)
        up = max(c.batch_min, min(c.batch_max, math.ceil(c.max_num_seqs * c.batch_raise_factor)))
        down = max(c.batch_min, min(c.batch_low_traffic_max, c.batch_max))
        ok = c.max_num_seqs > 0
        return cls(up if ok and up > c.max_num_seqs else None,
                   down if ok and c.max_num_seqs > c.batch_low_traffic_max and down < c.max_num_seqs else None)


def _batch_terms(c: RulesConfig) -> dict[str, str]:
    """The advice's conditions over ``rules.batch_window_s``, each a PromQL vector by model and instance."""
    w, by = duration(c.batch_window_s), PER_REPLICA
    batches = f"sum by ({by}, le) (rate({ENGINE_BATCH_REQUESTS.bucket}[{w}]))"
    batch = f"histogram_quantile({number(c.batch_quantile)}, {batches})"
    waiting = selector(ENGINE_REQUESTS.series, ("state", "=", "waiting"))
    latency = E2E_LATENCY_SECONDS.bucket
    p99 = f"histogram_quantile(0.99, sum by ({by}, le) (rate({latency}[{w}])))"
    p99_before = f"histogram_quantile(0.99, sum by ({by}, le) (rate({latency}[{w}] offset {w})))"
    return {
        "batch": batch,
        "waiting": f"sum by ({by}) (avg_over_time({waiting}[{w}])) > 0",
        "kv": f"max by ({by}) (max_over_time({KV_USAGE.series}[{w}])) < {number(c.kv_cache_ratio)}",
        "qps": f"sum by ({by}) (rate({selector(REQUESTS.series, SERVED)}[{w}]))",
        "rise": f"{p99} > {number(1 + c.batch_p99_rise)} * {p99_before}",
    }


class _AdviceInputs(NamedTuple):
    """One model's advice inputs: batches all ``small`` (p75 below 1) or ``big`` (above every bound), the waiting
    queue, KV usage, requests per second, and latency fast throughout or ``rising`` (slow after window + 2 steps)."""

    batch: str
    waiting: float
    kv: float
    qps: float
    rising: bool


def _batch_inputs(c: RulesConfig, n: int, step: int, inputs: _AdviceInputs) -> tuple[Series, ...]:
    """The series of ``inputs``, ``n`` samples ``step`` apart."""
    batch, waiting, kv, qps, rising = inputs
    bounds = ENGINE_BATCH_REQUESTS.buckets or ()
    per_step = dict.fromkeys([le_value(b) for b in bounds], 10.0 if batch == "small" else 0.0) | {"+Inf": 10.0}
    model = ("model_name", "=", MODEL)
    fast, slow = buckets.REQUEST_LATENCY[0], buckets.REQUEST_LATENCY[-1]
    turn = int(c.batch_window_s // step) + 2  # the sample after which every request is slow
    fast_values = (f"{counter_values(10, turn)} {number(10 * turn)}x{n - turn - 2}" if rising
                   else counter_values(10, n))
    latency = (Series(selector(E2E_LATENCY_SECONDS.bucket, model, ("le", "=", le_value(fast))), fast_values),
               *(Series(selector(E2E_LATENCY_SECONDS.bucket, model, ("le", "=", le)), counter_values(10, n))
                 for le in (le_value(slow), "+Inf")))
    return (
        *le_series(ENGINE_BATCH_REQUESTS.bucket, MODEL, per_step, n),
        Series(selector(ENGINE_REQUESTS.series, model, ("state", "=", "waiting")), gauge_values(waiting, n)),
        Series(selector(KV_USAGE.series, model), gauge_values(kv, n)),
        *request_series(MODEL, qps * step, 0, n),
        *latency,
    )


def _batch_scenario(c: RulesConfig, alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    """Each direction fires with all its conditions, and stays quiet with each one made false in turn."""
    advice = BatchAdvice.of(c)
    bounds = ENGINE_BATCH_REQUESTS.buckets or ()
    if not c.batch_low_traffic_max < bounds[-1]:
        raise ConfigError("rules.batch_low_traffic_max", f"must lie below {bounds[-1]:g}, the batch-size "
                          "histogram's highest bound", c.batch_low_traffic_max)
    step = step_for(c.batch_window_s)
    # Lower: latency turns slow after the sample at window + 2 steps, so the previous window holds two samples.
    rise_at = int(c.batch_window_s // step + 3) * step
    n = steps_needed(rise_at + ceil_to(alert.for_s, step) + 2 * step, step)
    low, kv_ok, kv_full = c.batch_low_qps, c.kv_cache_ratio / 2, above(c.kv_cache_ratio)
    # Counters start at 0: rate() over a window not yet full reads qps x t / window, so the raise's traffic
    # crosses batch_low_qps half a step before ``raise_at`` (clear of the boundary on both sides).
    raise_at = max(step, ceil_to(c.batch_window_s / 2, step))
    busy = low * c.batch_window_s / (raise_at - step / 2)
    up = _AdviceInputs("small", 3.0, kv_ok, busy, rising=False)
    down = _AdviceInputs("big", 0.0, kv_ok, low / 2, rising=True)
    cases: list[tuple[str, _AdviceInputs, int, dict[str, str] | None]] = []
    labels = {"model_name": MODEL}
    if advice.raise_to is not None:
        fired = labels | {"direction": "raise", "suggested_max_num_seqs": str(advice.raise_to)}
        cases += [("raise advice fires", up, raise_at, fired),
                  ("no raise with the batch at its limit", up._replace(batch="big"), raise_at, None),
                  ("no raise without waiting requests", up._replace(waiting=0.0), raise_at, None),
                  ("no raise with the KV cache full", up._replace(kv=kv_full), raise_at, None),
                  ("no raise at low traffic", up._replace(qps=low / 2), raise_at, None)]
    if advice.lower_to is not None:
        fired = labels | {"direction": "lower", "suggested_max_num_seqs": str(advice.lower_to)}
        cases += [("lower advice fires", down, rise_at, fired),
                  ("no lower with a small batch", down._replace(batch="small"), rise_at, None),
                  ("no lower while p99 holds", down._replace(rising=False), rise_at, None),
                  ("no lower at high traffic", down._replace(qps=busy), rise_at, None)]
    # Traffic exactly at batch_low_qps: neither direction (raise needs more, lower less).
    both = _AdviceInputs("small", 3.0, kv_ok, low, rising=True)
    cases.append(("neither at exactly batch_low_qps", both, rise_at, None))
    made = [Case(name, _batch_inputs(c, n, step, inputs), fires, at) for name, inputs, at, fires in cases]
    first = made[0]
    return Scenario(step, first.inputs, made[-1].inputs, first.active_at_s or step, first.fires_with or labels,
                    cases=tuple(made[1:]))


def batch_advice(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """Advice, never a page: raise max_num_seqs when the batch stays under it while requests wait, the KV cache has
    room and traffic is high; lower it when traffic is low, the batch runs large and p99 rises. The expression's
    value is the suggestion; the two directions exclude each other (traffic above or below ``batch_low_qps``)."""
    advice = BatchAdvice.of(config)
    t, m = _batch_terms(config), config.max_num_seqs
    branches = []
    if advice.raise_to is not None:
        branches.append(f"(({t['batch']} < {m}) and ({t['waiting']}) and ({t['kv']}) and ({t['qps']} > "
                        f"{number(config.batch_low_qps)})) * 0 + {advice.raise_to}")
    if advice.lower_to is not None:
        branches.append(f"(({t['batch']} > {config.batch_low_traffic_max}) and ({t['qps']} < "
                        f"{number(config.batch_low_qps)}) and ({t['rise']})) * 0 + {advice.lower_to}")
    if not branches:
        return []
    w, raising = duration(config.batch_window_s), f"{{{{ if gt $value {float(m)!r} }}}}"
    return [AlertRule(
        name="InferwatchBatchSizeAdvice",
        expr=" or ".join(f"({b})" for b in branches),
        for_s=config.batch_for_s,
        severity=Severity.INFO,
        labels={"max_num_seqs": str(m), "direction": f"{raising}raise{{{{ else }}}}lower{{{{ end }}}}",
                "suggested_max_num_seqs": "{{ $value }}"},
        summary="Advice: the running batch size limit could be changed.",
        description=(
            f"Model {{{{ $labels.model_name }}}} over {w}: "
            f"{raising}its running batch's {config.batch_quantile * 100:g}th percentile stayed below max_num_seqs "
            f"({m}) while requests waited, the KV cache stayed below {_pct(config.kv_cache_ratio)} and traffic "
            f"was above {config.batch_low_qps:g} requests/s{{{{ else }}}}traffic was below "
            f"{config.batch_low_qps:g} requests/s, its running batch's {config.batch_quantile * 100:g}th "
            f"percentile was above {config.batch_low_traffic_max} and p99 latency rose more than "
            f"{_pct(config.batch_p99_rise)} over the previous {w}{{{{ end }}}}; consider --max-num-seqs "
            f"{{{{ $value }}}} (bounds {config.batch_min}-{config.batch_max})."
        ),
        runbook=Runbook(
            "Advice, never a page: the evidence says `--max-num-seqs` is too low (direction `raise`: the batch "
            "stays under the limit while requests wait, the KV cache has headroom and traffic is above "
            "`rules.batch_low_qps`) or too high for the traffic (direction `lower`: below `rules.batch_low_qps` "
            "a batch above `rules.batch_low_traffic_max` brings no gain and only adds tail latency). The label "
            "`suggested_max_num_seqs` is the new limit, always within [`rules.batch_min`, `rules.batch_max`].",
            ("Engine board: running batch size against `max_num_seqs`, waiting requests and KV cache usage.",
             "Request rate per model over the last hour, and the p99 end-to-end latency trend.",
             "That `rules.max_num_seqs` matches the flag vLLM runs with (the alert's `max_num_seqs` label)."),
            ("Apply at the next deploy: restart vLLM with `--max-num-seqs <suggested_max_num_seqs>` (and set "
             "`rules.max_num_seqs` to the same value so the advice follows).",
             "After a raise, watch for an hour: preemptions (InferwatchPreemptionStorm), KV cache usage "
             "(InferwatchKVCacheNearlyFull), waiting requests and p99 TTFT; go back if preemptions start.",
             "After a lower, watch p99 end-to-end latency fall and the waiting queue stay short; raise again if "
             "requests start to queue as traffic grows."),
        ),
        scenario=_batch_scenario,
    )]


def _wedged_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.wedged_stall_s)
    n = steps_needed(c.wedged_stall_s + c.wedged_for_s + 2 * step, step)
    model = ("model_name", "=", MODEL)
    waiting = Series(selector(ENGINE_REQUESTS.series, model, ("state", "=", "waiting")), gauge_values(4, n))
    kv = Series(selector(KV_USAGE.series, model), gauge_values(c.kv_cache_ratio / 2, n))
    ready = Series(selector(UPSTREAM_READY.series, ("upstream", "=", UPSTREAM)), gauge_values(1, n))
    tokens = selector(ENGINE_GENERATION_TOKENS.series, model)
    stuck, moving = Series(tokens, gauge_values(500, n)), Series(tokens, counter_values(100, n, 500))
    # increase() needs two samples in the stall window: true from the second sample on.
    return Scenario(step, (waiting, stuck, kv, ready), (waiting, moving, kv, ready), step, {"model_name": MODEL})


def wedged_engine(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """vLLM issue 53130: requests wait, no token comes out, the KV cache has room and /health still says 200."""
    w = duration(config.wedged_stall_s)
    waiting = selector(ENGINE_REQUESTS.series, ("state", "=", "waiting"))
    by = PER_REPLICA
    return [AlertRule(
        name="InferwatchEngineWedged",
        expr=(
            f"((sum by ({by}) ({waiting}) > 0)"
            f" and on ({by}) (sum by ({by}) (increase({ENGINE_GENERATION_TOKENS.series}[{w}])) == 0)"
            f" unless on ({by}) (max by ({by}) ({KV_USAGE.series}) > {number(config.kv_cache_ratio)}))"
            f" and on (instance) (max by (instance) ({UPSTREAM_READY.series}) == 1)"
        ),
        for_s=config.wedged_for_s,
        severity=Severity.CRITICAL,
        summary="The engine is wedged: requests wait, no token is generated, and /health still says 200.",
        description=(
            f"Requests to model {{{{ $labels.model_name }}}} are waiting, not one token has been "
            f"generated for {w}, the KV cache is below {_pct(config.kv_cache_ratio)} and the upstream's /health "
            f"still answers 200, for {duration(config.wedged_for_s)}: the engine loop is stuck and no probe will "
            f"restart it."
        ),
        runbook=Runbook(
            "vLLM's API server still answers /health with 200 while its engine makes no progress (vLLM issue "
            "53130): requests are queued, not one token comes out, and the KV cache has room, so it is not a "
            "capacity problem. The engine core is dead, deadlocked or hung in a collective; liveness and "
            "readiness probes will not restart it.",
            ("Engine board: running and waiting requests, tokens per second and KV usage flat at the same time.",
             "vLLM's log: the periodic `Engine 000:` line (throughput 0 with Waiting > 0), tracebacks in the "
             "EngineCore process, NCCL or CUDA errors; `py-spy dump` of the EngineCore process if it is alive.",
             "Whether the EngineCore process still exists (`ps`, the upstream-process panels) and GPU "
             "utilisation (0 % while wedged, 100 % when spinning in a kernel or collective).",
             "Deferred waits (Queue depth by reason): a KV transfer or LoRA load that never completes."),
            ("Restart the vLLM server (or delete the pod); the sidecar's in-flight requests get a clean error.",
             "Fail traffic over to another replica until it is back.",
             "Capture the EngineCore stack and logs first, and report them upstream with the vLLM version.",
             ROLLBACK),
        ),
        scenario=_wedged_scenario,
        annotations=context(MODEL_REPLICA),
    )]


def _offload_scenario(c: RulesConfig, _alert: AlertRule, _e: tuple[int, ...]) -> Scenario:
    step = step_for(c.kv_offload_window_s)
    n = steps_needed(c.kv_offload_for_s + 4 * step, step)
    model = ("model_name", "=", MODEL)
    store = selector(KV_SWAP_BYTES.series, model, ("direction", "=", "store"))
    load = selector(KV_SWAP_BYTES.series, model, ("direction", "=", "load"))
    # Counters that start at 0: rate() over a window not yet full reads rate x t / window, so the sum of both
    # directions crosses the limit half a step before ``active`` (clear of the boundary on both sides).
    window, limit = c.kv_offload_window_s, c.kv_offload_bytes_per_s
    active = max(step, ceil_to(window / 2, step))
    busy = limit * window / (active - step / 2) / 2 * step
    calm = limit * 0.25 * step
    return Scenario(step, (Series(store, counter_values(busy, n)), Series(load, counter_values(busy, n))),
                    (Series(store, counter_values(calm, n)), Series(load, counter_values(calm, n))), active,
                    {"model_name": MODEL})


def kv_offload(config: RulesConfig, _edges: tuple[int, ...]) -> list[AlertRule]:
    """V1's swap: KV blocks keep moving between the GPU and the CPU offload space."""
    w = duration(config.kv_offload_window_s)
    limit = config.kv_offload_bytes_per_s
    return [AlertRule(
        name="InferwatchKVOffloadTraffic",
        expr=f"sum by ({PER_REPLICA}) (rate({KV_SWAP_BYTES.series}[{w}])) > {number(limit)}",
        for_s=config.kv_offload_for_s,
        severity=Severity.WARNING,
        summary="KV cache blocks keep moving between the GPU and CPU memory.",
        description=(
            f"Model {{{{ $labels.model_name }}}} has moved more than {limit / 1e9:g} GB/s of KV cache between the "
            f"GPU and the CPU offload space (stores plus loads) over {w} for {duration(config.kv_offload_for_s)}: "
            f"the GPU KV cache is too small for the working set, and PCIe traffic competes with the model."
        ),
        runbook=Runbook(
            "vLLM V1's OffloadingConnector is V0's swap by another name: KV blocks that do not fit on the GPU are "
            "stored to CPU memory and loaded back when a request needs them. Sustained heavy traffic both ways "
            "means the GPU KV cache is too small for the requests' working set; transfers take PCIe bandwidth "
            "and time that decode steps wait for.",
            ("KV offload panel on the engine board: store against load bytes per second, time spent, CPU offload "
             "space used and allocation failures.",
             "GPU KV usage and preemptions: is the GPU cache full as well?",
             "Prompt length mix and the prefix-cache hit ratio (long shared prefixes reloaded again and again)."),
            (*KV_FIXES, "Give the CPU offload space more room (`kv_offloading_size`) if allocations fail.", SHED),
        ),
        scenario=_offload_scenario,
        annotations=context(MODEL_REPLICA),
    )]


BUILDERS: tuple[Builder, ...] = (
    swapping, preemption, latency_sla, gpu_memory, circuit_breaker, oom_burst, memory_leak,
    long_context, context_32k, queue, upstream_down, kv_cache, log_drops, batch_advice, wedged_engine, kv_offload,
    canary_breaker,
)


def rule_groups(config: RulesConfig, edges: tuple[int, ...], extra: tuple[Builder, ...] = ()) -> tuple[RuleGroup, ...]:
    """The intervene-now group (plus advice), one alert list in builder order."""
    alerts = tuple(alert for build in (*BUILDERS, *extra) for alert in build(config, edges))
    return (RuleGroup("inferwatch-intervene", alerts, config.evaluation_interval_s, file="intervene"),)


__all__ = ["BUILDERS", "Builder", "rule_groups"]

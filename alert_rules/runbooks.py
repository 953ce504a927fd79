"""Runbook entries: what each alert means, what to check first, and how to intervene."""

from __future__ import annotations

from dataclasses import dataclass

from alert_rules.annotate import runbook_url
from alert_rules.config import RulesConfig
from alert_rules.spec import AlertRule, duration


@dataclass(frozen=True, slots=True)
class Runbook:
    """The text of one runbook entry."""

    meaning: str
    checks: tuple[str, ...]
    interventions: tuple[str, ...]


_KV = (
    "Lower `--max-num-seqs` (fewer sequences share the KV cache) or `--max-num-batched-tokens`.",
    "Use an fp8 KV cache (`--kv-cache-dtype fp8`) to double the tokens the cache holds.",
    "Raise `--gpu-memory-utilization` if the GPU has headroom, or shorten `--max-model-len`.",
    "Send long prompts to a separate queue or replica so they stop evicting short ones.",
)
_SHED = "Shed load: lower the client concurrency or rate limit at the gateway until the alert clears."
_ROLLBACK = "Roll back the last model, engine or config change if the alert started right after it."

RUNBOOKS: dict[str, Runbook] = {
    "InferwatchRequestsSwapped": Runbook(
        "vLLM V0 keeps requests swapped out to CPU memory: the GPU KV cache cannot hold the running "
        "batch, so requests stall while their blocks move across PCIe.",
        ("KV cache usage and running/waiting requests on the engine "
         "dashboard.", "Prompt length mix: did long prompts arrive (length_bucket panels)?"),
        (*_KV, _SHED),
    ),
    "InferwatchPreemptionStorm": Runbook(
        "The V1 engine preempted requests in every window: it runs out of KV blocks, throws away a "
        "running request's cache and recomputes it later, so throughput collapses and latency grows.",
        ("KV cache usage and the preemption rate per model.",
         "Whether long prompts or large `max_tokens` values started recently."),
        (*_KV, _SHED),
    ),
    "InferwatchLatencyAboveSLA": Runbook(
        "P99 end-to-end latency has been far above the model's SLA: users wait much longer than promised.",
        ("Queue length and time in queue versus prefill/decode split (is it waiting or computing?).",
         "Preemptions, KV cache usage and GPU utilisation.", "Traffic volume and prompt lengths."),
        ("Shed load or add replicas when the queue is long.", *_KV[:2],
         "Separate long prompts into their own queue (chunked prefill or a dedicated replica).", _ROLLBACK),
    ),
    "InferwatchGpuMemoryHigh": Runbook(
        "GPU framebuffer memory has stayed above the configured share: new allocations (CUDA graphs, "
        "another process, a bigger batch) may fail with out-of-memory errors.",
        ("`nvidia-smi` or the GPU dashboard: which processes hold memory.",
         "Whether vLLM's `--gpu-memory-utilization` leaves room for other processes on the GPU."),
        ("Lower `--gpu-memory-utilization`, `--max-num-seqs` or `--max-model-len`.",
         "Use an fp8 KV cache (`--kv-cache-dtype fp8`).", "Move other processes off the GPU.", _ROLLBACK),
    ),
    "InferwatchCircuitBreakerDegrade": Runbook(
        "A model's error ratio or p99 latency crossed the degrade level of the circuit breaker: "
        "serve less, or serve it more cheaply, before it gets worse.",
        ("Errors by outcome (upstream_error, timeout, overloaded) and by length bucket.",
         "Upstream logs for tracebacks; queue length and preemptions."),
        (_SHED, "Lower `--max-num-seqs` to trade throughput for latency.",
         "Route long prompts to a separate queue; cap `max_tokens` at the gateway."),
    ),
    "InferwatchCircuitBreakerRollback": Runbook(
        "A model's error ratio crossed the rollback level of the circuit breaker: too many requests "
        "fail. This alert inhibits the degrade alert of the same model.",
        ("What changed last (model, vLLM version, flags, traffic).",
         "Upstream logs and the failing requests' traces (trace_id in the logs)."),
        (_ROLLBACK, _SHED, "Fail over to another replica or a previous model version."),
    ),
    "InferwatchOOMBurst": Runbook(
        "Several out-of-memory errors happened within seconds: requests fail and the server may crash "
        "or restart.",
        ("Upstream logs around the events: CUDA OOM, host OOM killer (exit status 137)?",
         "GPU and process memory panels; prompt lengths of the failing requests."),
        ("Lower `--max-num-seqs` and `--max-num-batched-tokens`.", "Use an fp8 KV cache.",
         "Lower `--gpu-memory-utilization` when something else shares the GPU.", _SHED, _ROLLBACK),
    ),
    "InferwatchUpstreamMemoryLeak": Runbook(
        "The upstream process's resident memory has grown steadily: a leak that ends in an OOM kill.",
        ("Process memory panel over the last hours; whether it tracks traffic or grows at rest.",
         "vLLM version and known leak reports; tokenizer or multimodal caches."),
        ("Plan a rolling restart before memory runs out.", _ROLLBACK),
    ),
    "InferwatchLongContextFailures": Runbook(
        "Requests with long prompts fail far more often than the rest; the overall error ratio hides it.",
        ("Errors by length bucket and outcome (timeouts? OOM?).", "`--max-model-len` and KV cache size."),
        ("Send long prompts to a separate queue or replica.", "Enable chunked prefill.",
         "Use an fp8 KV cache.", "Raise the timeouts for long prompts, or cap prompt length at the gateway."),
    ),
    "InferwatchQueueBacklog": Runbook(
        "Requests pile up in the scheduler's waiting queue: the engine is saturated.",
        ("Running batch size versus `--max-num-seqs`; KV cache usage; traffic volume.",),
        (_SHED, "Add replicas.", "Raise `--max-num-seqs` only if the KV cache has headroom.",
         "Use an fp8 KV cache to fit more sequences."),
    ),
    "InferwatchUpstreamDown": Runbook(
        "The sidecar cannot scrape the upstream's /metrics: the vLLM server is down, hung or unreachable.",
        ("Is the process alive? Its logs (startup errors, OOM kill)?",
         "`curl` the upstream's /health and /metrics from the sidecar's host."),
        ("Restart the server.", _ROLLBACK, "Fail traffic over to another replica."),
    ),
    "InferwatchKVCacheNearlyFull": Runbook(
        "The KV cache has stayed nearly full: the next burst will preempt requests.",
        ("Preemptions, running and waiting requests.", "Prompt length mix."),
        _KV,
    ),
    "InferwatchBatchSizeAdvice": Runbook(
        "Advice, never a page: the running batch stays below `--max-num-seqs`; the alert suggests "
        "raising it by the configured factor (labels `max_num_seqs` and `suggested_max_num_seqs`).",
        ("KV cache usage: raising the limit only helps while the cache has headroom.",
         "Whether requests wait in the queue."),
        ("Raise `--max-num-seqs` to the suggested value at the next deploy and watch preemptions.",),
    ),
    "InferwatchLogRecordsDropped": Runbook(
        "The log pipeline dropped records: its queue was full or its writer failed, so request logs "
        "have gaps.",
        ("The sidecar's log-pipeline metrics (queue depth, write errors) and disk space.",),
        ("Free disk space or raise the queue size.", "Lower the success sampling rate."),
    ),
}

_SLO_PAGE = (
    "Check which outcome or length bucket carries the errors, and what changed last.",
    "Look at queue length, preemptions and KV cache usage for saturation.",
)
for _slo, _what in (("Availability", "failing requests"), ("Latency", "slow requests")):
    RUNBOOKS[f"Inferwatch{_slo}BudgetBurnPage"] = Runbook(
        f"{_what.capitalize()} are spending the {_slo.lower()} error budget so fast that, at this pace, "
        f"it will be gone in hours to days (multi-window burn rate: 14.4x over 1h and 5m, or 6x over "
        f"6h and 30m).",
        _SLO_PAGE,
        (_ROLLBACK, _SHED, *_KV[:2], "Send long prompts to a separate queue."),
    )
    RUNBOOKS[f"Inferwatch{_slo}BudgetBurnTicket"] = Runbook(
        f"{_what.capitalize()} spend the {_slo.lower()} error budget at least as fast as it accrues "
        f"(1x over 3d and 6h): the SLO will be missed by the end of the period.",
        _SLO_PAGE,
        ("Find and fix the steady source of bad requests in working hours.", *_KV[:2]),
    )


def entry(config: RulesConfig, alert: AlertRule) -> str:
    """The Markdown section of one alert."""
    book = RUNBOOKS[alert.name]
    lines = [
        f"## {alert.name}",
        "",
        f"Severity **{alert.severity}**; fires after `{duration(alert.for_s)}`"
        + (f", keeps firing `{duration(alert.keep_firing_for_s)}` after it clears" if alert.keep_firing_for_s
           else "")
        + f". Link: {runbook_url(config, alert)}",
        "",
        f"**What it means.** {book.meaning}",
        "",
        f"**Condition.** {alert.description}",
        "",
        "```promql",
        alert.expr,
        "```",
        "",
        "**Check first.**",
        "",
        *(f"- {c}" for c in book.checks),
        "",
        "**Interventions.**",
        "",
        *(f"- {i}" for i in book.interventions),
        "",
    ]
    return "\n".join(lines)


def runbooks_markdown(config: RulesConfig, alerts: tuple[AlertRule, ...]) -> str:
    """docs/runbooks.md: one section per alert, in rule order.

    Raises:
        KeyError: an alert has no runbook entry.
    """
    missing = [a.name for a in alerts if a.name not in RUNBOOKS]
    if missing:
        raise KeyError(f"alerts without a runbook entry in alert_rules.runbooks.RUNBOOKS: {', '.join(missing)}")
    head = [
        "# Runbooks",
        "",
        "Generated by `inferwatch rules build` from `alert_rules/runbooks.py` and the rules config; do not "
        "edit by hand. Severity `critical` pages, `warning` opens a ticket, `info` is advice.",
        "",
        *(f"- [{a.name}](#{a.runbook_anchor}) ({a.severity})" for a in alerts),
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(entry(config, a) for a in alerts)


__all__ = ["RUNBOOKS", "Runbook", "entry", "runbooks_markdown"]

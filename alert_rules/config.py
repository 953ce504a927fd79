"""Configuration section owned by the alert rules: every threshold lives here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporters import buckets
from exporters.configuring import HTTP_URL_RULE, http_url, non_negative, positive, setting

SEVERITIES = ("critical", "warning", "info")


def _whole_seconds(value: Any) -> str | None:
    if value < 0 or float(value) != round(value):
        return "must be a whole number of seconds, 0 or more"
    return None


def _whole_positive_seconds(value: Any) -> str | None:
    return _whole_seconds(value) or positive(value)


def _objective(value: Any) -> str | None:
    return None if 0 < value < 1 else "must be a ratio strictly between 0 and 1, e.g. 0.999 for 99.9 %"


def _open_ratio(value: Any) -> str | None:
    return None if 0 < value < 1 else "must be a ratio strictly between 0 and 1"


def _latency_bound(value: Any) -> str | None:
    if value in buckets.REQUEST_LATENCY:
        return None
    bounds = ", ".join(f"{b:g}" for b in buckets.REQUEST_LATENCY)
    return f"must equal a bucket bound of the end-to-end latency histogram; the bounds are {bounds}"


def _positive_thresholds(value: Any) -> str | None:
    values = value if isinstance(value, list) else [value]
    if not values or any(v <= 0 for v in values):
        return "must be a positive number of tokens or a non-empty list of them"
    return None


def _positive_table(value: Any) -> str | None:
    bad = [k for k, v in value.items() if not v > 0]
    return f"every value must be greater than 0 (not {bad[0]!r})" if bad else None


def _severity_table(value: Any) -> str | None:
    bad = [k for k, v in value.items() if v not in SEVERITIES]
    if bad:
        return f"severity of {bad[0]!r} must be one of {', '.join(SEVERITIES)}"
    return None


def _receivers(value: Any) -> str | None:
    missing = [name for name in ("page", "ticket", "info") if name not in value]
    if missing:
        return f"must name a webhook URL for each receiver page, ticket and info (missing {missing[0]!r})"
    bad = [k for k, v in value.items() if v and http_url(v) is not None]
    return f"the URL of {bad[0]!r} {HTTP_URL_RULE} (or be empty)" if bad else None


def _anchor_pattern(value: Any) -> str | None:
    return None if "{anchor}" in value else "must contain the placeholder {anchor}"


@dataclass(frozen=True, slots=True)
class RulesConfig:
    """Section ``[rules]``: thresholds and windows of the alerts and SLOs."""

    evaluation_interval_s: float = setting(
        15.0, "Seconds between evaluations of the embedded rule engine.", check=positive
    )
    service: str = setting(
        "vllm", "Value of the `service` label put on every alert (Alertmanager groups and inhibits by it)."
    )
    severity_overrides: dict[str, str] = setting(
        {}, "Alert name -> severity (critical, warning or info) replacing the built-in one.",
        check=_severity_table,
    )
    # Swapping and preemption.
    swap_for_s: float = setting(
        300.0, "Seconds requests must stay swapped out (vLLM V0) before alerting.", check=_whole_seconds
    )
    preemption_window_s: float = setting(
        60.0, "Window in which at least one preemption must occur (vLLM V1).", check=_whole_positive_seconds
    )
    preemption_for_s: float = setting(
        300.0, "Seconds every preemption window must contain preemptions before alerting.",
        check=_whole_seconds,
    )
    # Latency against the SLA.
    sla_seconds: dict[str, float] = setting(
        {}, "Model name -> end-to-end latency SLA in seconds; other models use sla_default_s.",
        check=_positive_table,
    )
    sla_default_s: float = setting(
        20.0, "End-to-end latency SLA of models not in sla_seconds.", check=positive
    )
    sla_factor: float = setting(
        1.5, "Alert when p99 end-to-end latency exceeds this many SLAs.", check=positive
    )
    sla_window_s: float = setting(
        300.0, "Rate window of the p99 latency against the SLA.", check=_whole_positive_seconds
    )
    sla_for_s: float = setting(300.0, "Seconds p99 must stay above the SLA limit.", check=_whole_seconds)
    sla_min_requests: int = setting(
        100, "The latency-above-SLA page fires only when the model served at least this many requests in "
        "sla_window_s; 0 = no minimum. The p99 of fewer requests is one of its slowest few.",
        check=non_negative,
    )
    # GPU and KV cache memory.
    gpu_memory_ratio: float = setting(
        0.9, "Alert when GPU memory used exceeds this share of the total.", check=_open_ratio
    )
    gpu_memory_for_s: float = setting(600.0, "Seconds GPU memory must stay high.", check=_whole_seconds)
    kv_cache_ratio: float = setting(0.95, "Alert when KV cache usage exceeds this share.", check=_open_ratio)
    kv_cache_for_s: float = setting(600.0, "Seconds KV cache usage must stay high.", check=_whole_seconds)
    # Circuit breaker.
    degrade_error_ratio: float = setting(
        0.01, "Degrade (warning) when a model's error ratio exceeds this.", check=_open_ratio
    )
    degrade_p99_s: float = setting(2.0, "Degrade (warning) when a model's p99 latency exceeds this.",
                                   check=positive)
    rollback_error_ratio: float = setting(
        0.03, "Roll back (critical) when a model's error ratio exceeds this.", check=_open_ratio
    )
    breaker_window_s: float = setting(
        300.0, "Rate window of the circuit-breaker error ratio and latency.", check=_whole_positive_seconds
    )
    breaker_for_s: float = setting(60.0, "Seconds a breaker condition must hold.", check=_whole_seconds)
    breaker_min_requests: int = setting(
        100, "The circuit-breaker alerts fire only when a model served at least this many requests in "
        "breaker_window_s; 0 = no minimum. Below it a few failures would read as a large error ratio.",
        check=non_negative,
    )
    breaker_keep_firing_for_s: float = setting(
        300.0, "Seconds the rollback alert keeps firing after its condition clears (no flapping).",
        check=_whole_seconds,
    )
    # OOM, leak, long context.
    oom_count: int = setting(3, "Alert on this many OOM events or more within oom_window_s.", check=positive)
    oom_window_s: float = setting(
        10.0, "Window of the OOM burst; at least two scrape intervals.", check=_whole_positive_seconds
    )
    leak_growth_per_hour: float = setting(
        0.05, "Alert when upstream process memory grows faster than this share per hour.", check=positive
    )
    leak_window_s: float = setting(
        3600.0, "Window of the memory growth trend.", check=_whole_positive_seconds
    )
    leak_for_s: float = setting(900.0, "Seconds the growth trend must persist.", check=_whole_seconds)
    long_context_tokens: list[int] | int = setting(
        [4096], "Thresholds of long prompts, one number or a list: for each, the length buckets starting at or "
        "above it have their own failure ratio (InferwatchLongContextFailures); at an edge of "
        "serve.length_bucket_edges that is exactly the prompts of more than that many tokens.",
        check=_positive_thresholds,
    )
    long_context_error_ratio: float = setting(
        0.05, "Alert when the failure ratio of long prompts exceeds this.", check=_open_ratio
    )
    context_32k_error_ratio: float = setting(
        0.1, "Alert when the failure ratio of the length class holding 32,000-token prompts exceeds this "
        "(InferwatchContext32kFailures; its window and for: are long_context's).", check=_open_ratio
    )
    long_context_window_s: float = setting(
        600.0, "Rate window of the long-prompt failure ratio.", check=_whole_positive_seconds
    )
    long_context_for_s: float = setting(300.0, "Seconds the long-prompt failure ratio must stay high.",
                                        check=_whole_seconds)
    # Release day: wrong-model answers, tokenizer drift, text classes.
    wrong_model_ratio: float = setting(
        0.005, "Alert when more than this share of inference requests are wrong-model requests (answered by another "
        "model, or asking for a retired one).", check=_open_ratio,
    )
    wrong_model_window_s: float = setting(
        600.0, "Rate window of the wrong-model ratio.", check=_whole_positive_seconds
    )
    wrong_model_for_s: float = setting(300.0, "Seconds the wrong-model ratio must stay high.", check=_whole_seconds)
    wrong_model_min_requests: int = setting(
        100, "Inference requests the wrong-model window must hold before its ratio can alert.", check=non_negative,
    )
    tokenizer_change_window_s: float = setting(
        3600.0, "How long the tokenizer alert keeps firing after an upstream's tokenizer fingerprint changed under "
        "the same model name.", check=_whole_positive_seconds,
    )
    text_class_error_ratio: float = setting(
        0.05, "A text class (plain, emoji_dense, cjk) alerts when its failure ratio exceeds this ...",
        check=_open_ratio,
    )
    text_class_factor: float = setting(
        5.0, "... and this many times the failure ratio of the model's other text classes.", check=positive,
    )
    text_class_window_s: float = setting(
        600.0, "Rate window of the text-class failure ratios.", check=_whole_positive_seconds
    )
    text_class_for_s: float = setting(300.0, "Seconds a text class must keep failing that often.",
                                      check=_whole_seconds)
    text_class_min_requests: int = setting(
        20, "Requests of a text class its window must hold before its failure ratio can alert.", check=non_negative,
    )
    # Scheduler, upstream, log pipeline.
    queue_waiting: float = setting(50.0, "Alert when more requests than this wait in the scheduler queue.",
                                   check=non_negative)
    queue_for_s: float = setting(300.0, "Seconds the queue must stay long.", check=_whole_seconds)
    upstream_down_for_s: float = setting(60.0, "Seconds the upstream scrape must fail before alerting.",
                                         check=_whole_seconds)
    # Wedged engine and KV offloading.
    wedged_stall_s: float = setting(
        120.0, "The engine counts as wedged when requests wait, no token was generated for this many seconds, "
        "the KV cache is not full (below kv_cache_ratio) and /health still answers 200.",
        check=_whole_positive_seconds,
    )
    wedged_for_s: float = setting(60.0, "Seconds the wedged condition must hold before paging.",
                                  check=_whole_seconds)
    kv_offload_bytes_per_s: float = setting(
        1e9, "Alert when KV offload traffic between GPU and CPU (stores plus loads) exceeds this many bytes per "
        "second.", check=positive,
    )
    kv_offload_window_s: float = setting(
        300.0, "Rate window of the KV offload traffic.", check=_whole_positive_seconds
    )
    kv_offload_for_s: float = setting(900.0, "Seconds the KV offload traffic must stay high.",
                                      check=_whole_seconds)
    log_drops_window_s: float = setting(
        300.0, "Alert when the log pipeline dropped records within this window.",
        check=_whole_positive_seconds,
    )
    # Batch-size advice.
    max_num_seqs: int = setting(
        256, "The upstream's --max-num-seqs, for the batch-size advice; 0 turns the advice off.",
        check=non_negative,
    )
    batch_quantile: float = setting(0.75, "Quantile of the running batch compared with max_num_seqs.",
                                    check=_open_ratio)
    batch_window_s: float = setting(3600.0, "Window over which the running batch, traffic and p99 are observed.",
                                    check=_whole_positive_seconds)
    batch_for_s: float = setting(900.0, "Seconds the conditions of a batch-size advice must hold.",
                                 check=_whole_seconds)
    batch_raise_factor: float = setting(
        1.25, "Raise advice: suggested max_num_seqs = this x the current one (rounded up), at most batch_max.",
        check=positive,
    )
    batch_low_qps: float = setting(
        50.0, "Requests per second below which a batch above batch_low_traffic_max brings no gain: the raise "
        "advice needs more traffic than this, the lower advice less.", check=positive,
    )
    batch_low_traffic_max: int = setting(
        4, "Lower advice: at low traffic the batch's quantile runs above this while p99 rises; it suggests this "
        "(never below batch_min).", check=positive,
    )
    batch_p99_rise: float = setting(
        0.1, "Lower advice: p99 end-to-end latency over batch_window_s exceeds the previous window's by this share.",
        check=non_negative,
    )
    batch_min: int = setting(1, "Smallest max_num_seqs a batch-size advice suggests.", check=positive)
    batch_max: int = setting(16, "Largest max_num_seqs a batch-size advice suggests.", check=positive)
    # SLOs.
    slo_objective: float = setting(0.999, "SLO objective as a ratio (0.999 = 99.9 %).", check=_objective)
    slo_period_days: int = setting(30, "SLO period in days (the error budget's window).", check=positive)
    slo_latency_threshold_s: float = setting(
        10.0, "A request slower than this misses the latency SLO; must be a latency bucket bound.",
        check=_latency_bound,
    )
    slo_min_requests: int = setting(
        1000, "A burn-rate alert fires only when its long window (1h, 6h or 3d) holds at least this many of the "
        "SLO's requests; 0 = no minimum. Below it a few failures would read as a large error ratio.",
        check=non_negative,
    )
    # Links and Alertmanager.
    runbook_url_pattern: str = setting(
        "https://github.com/inferwatch/inferwatch/blob/main/docs/runbooks.md#{anchor}",
        "Runbook link of an alert; {anchor} is replaced by the lower-cased alert name.",
        check=_anchor_pattern,
    )
    alertmanager_receivers: dict[str, str] = setting(
        {"page": "http://127.0.0.1:9095/page", "ticket": "http://127.0.0.1:9095/ticket",
         "info": "http://127.0.0.1:9095/info"},
        "Webhook URL of each Alertmanager receiver (page, ticket, info); empty = a silent receiver.",
        check=_receivers,
    )
    alertmanager_group_wait_s: float = setting(
        30.0, "Alertmanager group_wait.", check=_whole_positive_seconds
    )
    alertmanager_group_interval_s: float = setting(300.0, "Alertmanager group_interval.",
                                                   check=_whole_positive_seconds)
    alertmanager_repeat_interval_s: float = setting(14400.0, "Alertmanager repeat_interval.",
                                                    check=_whole_positive_seconds)

    @property
    def long_context_thresholds(self) -> tuple[int, ...]:
        """``long_context_tokens`` as a sorted tuple, whether one number or a list was given."""
        value = self.long_context_tokens
        return tuple(sorted(set(value if isinstance(value, list) else [value])))

    def sla_for(self, model: str) -> float:
        """The end-to-end latency SLA of a model, in seconds."""
        return self.sla_seconds.get(model, self.sla_default_s)

    def severity_of(self, alert: str, default: str) -> str:
        """The severity of an alert: an override from the config, else its built-in one."""
        return self.severity_overrides.get(alert, default)


__all__ = ["SEVERITIES", "RulesConfig"]

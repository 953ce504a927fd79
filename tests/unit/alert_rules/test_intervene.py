"""The intervene-now alerts: built from config thresholds and catalog names."""

from __future__ import annotations

import pytest

from alert_rules import intervene
from alert_rules.config import RulesConfig
from alert_rules.spec import AlertRule
from exporters.catalog.engine import SCRAPE_UP
from exporters.errors import ConfigError
from exporters.records import DEFAULT_LENGTH_EDGES

EDGES = DEFAULT_LENGTH_EDGES


def _alerts(config: RulesConfig | None = None, edges: tuple[int, ...] = EDGES) -> dict[str, AlertRule]:
    (group,) = intervene.rule_groups(config or RulesConfig(), edges)
    return {a.name: a for a in group.alerts()}


def test_every_condition_of_the_issue_has_an_alert() -> None:
    """Swapping, preemption, SLA, GPU memory, breaker, OOM, leak, long context, queue, down, KV, logs, advice,
    a wedged engine, sustained KV offload traffic and the canary's two breaker levels."""
    assert set(_alerts()) == {
        "InferwatchRequestsSwapped", "InferwatchPreemptionStorm", "InferwatchLatencyAboveSLA",
        "InferwatchGpuMemoryHigh", "InferwatchCircuitBreakerDegrade", "InferwatchCircuitBreakerRollback",
        "InferwatchOOMBurst", "InferwatchUpstreamMemoryLeak", "InferwatchLongContextFailures",
        "InferwatchQueueBacklog", "InferwatchUpstreamDown", "InferwatchKVCacheNearlyFull",
        "InferwatchLogRecordsDropped", "InferwatchBatchSizeAdvice", "InferwatchEngineWedged",
        "InferwatchKVOffloadTraffic", "InferwatchCanaryDegrade", "InferwatchCanaryRollback",
        "InferwatchContext32kFailures",
    }


def test_sla_is_per_model_with_a_default_for_the_rest() -> None:
    """Each model in the SLA table gets its own 1.5 x SLA limit; the rest use the default."""
    expr = _alerts(RulesConfig(sla_seconds={"llama": 4.0, "qwen": 10.0}))["InferwatchLatencyAboveSLA"].expr
    assert 'model_name="llama"' in expr
    assert "> 6)" in expr
    assert 'model_name="qwen"' in expr
    assert "> 15)" in expr
    assert 'model_name!="llama", model_name!="qwen"' in expr
    assert "> 30)" in expr


def test_breaker_levels_and_actions() -> None:
    """Degrade is a warning on 1 % errors or 2 s p99; rollback is critical on 3 % and keeps firing; both need
    100 requests in the window."""
    alerts = _alerts()
    degrade, rollback = alerts["InferwatchCircuitBreakerDegrade"], alerts["InferwatchCircuitBreakerRollback"]
    assert (degrade.severity, degrade.labels["action"]) == ("warning", "degrade")
    assert "> 0.01)" in degrade.expr
    assert "> 2)" in degrade.expr
    assert (rollback.severity, rollback.labels["action"]) == ("critical", "rollback")
    assert "> 0.03)" in rollback.expr
    assert rollback.expr.endswith(">= 100)")  # rules.breaker_min_requests in the window
    assert rollback.keep_firing_for_s == 300


def test_long_context_reads_only_the_long_buckets() -> None:
    """The long-prompt failure ratio uses the buckets above 4,096 tokens, apart from the rest."""
    alert = _alerts()["InferwatchLongContextFailures"]
    assert alert.expr.count('length_bucket=~"4k-16k|16k-32k|gt32k"') == 2


def test_several_long_context_thresholds_each_read_their_buckets() -> None:
    """With thresholds 4,096 and 16,384, each has its own ratio; the highest comes first, so it names the alert."""
    alert = _alerts(RulesConfig(long_context_tokens=[16384, 4096]))["InferwatchLongContextFailures"]
    high, low = alert.expr.split(" or ")
    assert 'length_bucket=~"16k-32k|gt32k"' in high
    assert high.endswith("* 0 + 16384)")
    assert 'length_bucket=~"4k-16k|16k-32k|gt32k"' in low
    assert low.endswith("* 0 + 4096)")
    assert alert.labels["prompt_tokens_above"] == "{{ $value }}"


def test_long_context_without_long_buckets_is_a_config_error() -> None:
    """Edges that never reach a long-context threshold are refused, naming the buckets."""
    with pytest.raises(ConfigError, match="le512") as err:
        _alerts(edges=(512, 2048))
    assert err.value.key == "rules.long_context_tokens"


def test_the_32k_class_has_its_own_alert_and_threshold() -> None:
    """The class holding 32,000-token prompts (16k-32k by default) has its own ratio against its own threshold."""
    alert = _alerts(RulesConfig(context_32k_error_ratio=0.2))["InferwatchContext32kFailures"]
    assert alert.expr.count('length_bucket="16k-32k"') == 2
    assert alert.expr.endswith("> 0.2")
    assert alert.labels["length_bucket"] == "16k-32k"


def test_upstream_down_uses_the_sidecar_gauge_not_up() -> None:
    """Prometheus' synthetic up is never used: the embedded evaluator has no such series."""
    expr = _alerts()["InferwatchUpstreamDown"].expr
    assert expr.startswith(SCRAPE_UP.series)
    assert not expr.startswith("up")


def test_oom_burst_counts_without_extrapolation() -> None:
    """The OOM burst counts max - min inside 10s and fires at 3 or more."""
    expr = _alerts()["InferwatchOOMBurst"].expr
    assert "max_over_time(" in expr
    assert "[10s]" in expr
    assert expr.endswith(">= 3")


def test_batch_advice_off_with_zero() -> None:
    """max_num_seqs = 0 turns the advice off."""
    assert "InferwatchBatchSizeAdvice" not in _alerts(RulesConfig(max_num_seqs=0))


def test_thresholds_and_durations_come_from_the_config() -> None:
    """Changing a threshold and a for: duration changes the rule."""
    alert = _alerts(RulesConfig(kv_cache_ratio=0.8, kv_cache_for_s=120))["InferwatchKVCacheNearlyFull"]
    assert alert.expr.endswith("> 0.8")
    assert alert.for_s == 120

"""Tenant labels, repeat prompts, GPU-seconds shared with a batch, cost pools and usage accounting."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from exporters.catalog import usage as cat
from exporters.cost import CostConfig, cost_pool, request_cost
from exporters.engine_stats_wire import EngineRequestStats
from exporters.gpu_seconds import BatchTimeline
from exporters.records import Outcome, RequestRecord
from exporters.repeats import RepeatPrompts
from exporters.tenants import OTHER, UNKNOWN, TenantLabels
from exporters.usage import UsageAccounting
from exporters.usage_ledger import Usage


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestTenantLabels:
    def test_the_first_tenants_are_named_and_the_rest_are_other(self) -> None:
        """Within a window the first max_named tenants keep their names; the others are 'other'."""
        labels = TenantLabels(2, 60, Clock())
        assert [labels.label(t)[0] for t in ("a", "b", "c", "a", UNKNOWN)] == ["a", "b", OTHER, "a", UNKNOWN]

    def test_the_next_window_names_the_busiest_tenants_and_says_who_lost_a_name(self) -> None:
        """At a window's end the named set becomes the busiest tenants of that window (ties by name)."""
        clock = Clock()
        labels = TenantLabels(2, 60, clock)
        for tenant in ["a", "b"] + ["c"] * 5 + ["b"] * 2:
            labels.label(tenant)
        clock.now = 61
        label, demoted = labels.label("a")
        assert (label, demoted) == (OTHER, frozenset({"a"}))
        assert labels.named == frozenset({"b", "c"})

    def test_counters_stay_bounded_however_many_tenants_call(self) -> None:
        """10,000 distinct tenants keep at most 4 counters per named tenant; a heavy one still wins its name."""
        clock = Clock()
        labels = TenantLabels(3, 60, clock)
        for i in range(10_000):
            labels.label(f"t{i}")
            if i % 10 == 0:
                labels.label("heavy")
        assert len(labels._counts) <= 12
        clock.now = 61
        labels.label("x")
        assert "heavy" in labels.named


class TestRepeatPrompts:
    def test_a_prompt_answered_within_the_ttl_is_a_repeat(self) -> None:
        """The TTL counts from the cached answer; an expired one is stored again."""
        repeats = RepeatPrompts(ttl_s=900, max_entries=10)
        assert [repeats.seen(1, t, answered=True) for t in (0, 100, 899.9, 900, 901)] == [
            False, True, True, False, True]

    def test_a_failed_answer_is_not_cached(self) -> None:
        """Only a successful answer would be in an answer cache."""
        repeats = RepeatPrompts(ttl_s=900, max_entries=10)
        assert repeats.seen(1, 0, answered=False) is False
        assert repeats.seen(1, 1, answered=True) is False
        assert repeats.seen(1, 2, answered=True) is True

    def test_memory_is_bounded_and_what_is_forgotten_early_is_counted(self) -> None:
        """Past max_entries the oldest hash goes, and is counted."""
        repeats = RepeatPrompts(ttl_s=900, max_entries=2)
        for key in (1, 2, 3):
            repeats.seen(key, 0, answered=True)
        assert len(repeats) == 2
        assert repeats.forgotten_early == 1
        assert repeats.seen(1, 1, answered=True) is False


class TestBatchTimeline:
    def test_time_is_shared_by_the_running_count_and_busy_time_adds_up(self) -> None:
        """Running 1 for 1 s, 2 for 2 s, then 0: one request's share of [0.5, 3] is 0.5 + 1, busy 3 s."""
        timeline = BatchTimeline()
        for at, running in ((0.0, 1), (1.0, 2), (3.0, 0), (10.0, 1)):
            timeline.add(at, running)
        assert timeline.shared_seconds(0.5, 3.0) == pytest.approx(0.5 + 1.0)
        assert timeline.busy_s == pytest.approx(3.0)

    def test_time_before_the_first_step_counts_whole(self) -> None:
        """No batch known before the first step: the request had the engine to itself as far as we know."""
        timeline = BatchTimeline()
        timeline.add(10.0, 4)
        assert timeline.shared_seconds(8.0, 12.0) == pytest.approx(2.0 + 0.5)


class TestCost:
    def test_pools_special_first_then_long_context(self) -> None:
        """A special class or route wins over a long prompt; a long prompt is long_context; the rest base."""
        config = CostConfig(special_routes=["/v1/completions"])
        assert cost_pool(config, "/v1/chat/completions", "code", 10_000) == "special"
        assert cost_pool(config, "/v1/completions", None, 10) == "special"
        assert cost_pool(config, "/v1/chat/completions", None, 8192) == "long_context"
        assert cost_pool(config, "/v1/chat/completions", "chat", 8191) == "base"

    def test_price_by_model_with_a_default_and_the_pool_factor(self) -> None:
        """GPU-hours at the model's price, tokens at the default per-million price, times the pool's factor."""
        config = CostConfig(gpu_hour_prices={"big": 7.2, "*": 3.6}, million_token_prices={"*": 2.0},
                            pool_price_factors={"long_context": 1.5})
        assert request_cost(config, "big", "long_context", 1.0, 1_000_000) == pytest.approx((0.002 + 2.0) * 1.5)
        assert request_cost(config, "small", "base", 3600.0, 0) == pytest.approx(3.6)


def _record(tenant: str, prompt: int, completion: int, **changes: object) -> RequestRecord:
    record = RequestRecord(trace_id="0" * 32, span_id="0" * 16, route="/v1/completions", model="m",
                           tenant=tenant, prompt_tokens=prompt, completion_tokens=completion, start_unix=100.0,
                           e2e_s=2.0)
    for name, value in changes.items():
        setattr(record, name, value)
    return record


class TestUsageAccounting:
    def test_a_request_with_engine_numbers_is_accounted_to_its_tenant_and_pool(self) -> None:
        """Tokens, cached tokens, engine GPU-seconds, cost and the prefix cache's saving land in the families."""
        registry = CollectorRegistry()
        usage = UsageAccounting(CostConfig(gpu_hour_prices={"*": 3600.0}), 64, 3600, timeline=BatchTimeline())
        registry.register(usage)
        engine = EngineRequestStats("cmpl-x", 0.0, 0.5, 1.0, 1.5, 2.0, 0, 40, 100, 10, "length")
        usage.observe(_record("acme", 100, 10, engine=engine))
        labels = {"tenant": "acme", "model_name": "m", "pool": "base", "outcome": "ok"}
        assert registry.get_sample_value(cat.USAGE_PROMPT_TOKENS.series, labels) == 100
        assert registry.get_sample_value(cat.USAGE_CACHED_PROMPT_TOKENS.series, labels) == 40
        assert registry.get_sample_value(cat.USAGE_GPU_SECONDS.series, {**labels, "basis": "engine"}) == 1.5
        assert registry.get_sample_value(cat.USAGE_COST.series, labels) == pytest.approx(1.5)
        assert registry.get_sample_value(cat.USAGE_PREFIX_CACHE_SAVED_COST.series, labels) == pytest.approx(
            0.5 / 60 * 40)
        assert registry.get_sample_value(cat.TENANT_LATENCY_SECONDS.bucket,
                                         {"tenant": "acme", "model_name": "m", "le": "2.5"}) == 1

    def test_without_engine_numbers_the_estimate_is_named_and_other_routes_are_not_billed(self) -> None:
        """No plugin: basis token_estimate; /v1/models is not an inference request."""
        registry = CollectorRegistry()
        usage = UsageAccounting(CostConfig(estimate_prefill_tokens_per_s=100, estimate_decode_tokens_per_s=10),
                                64, 3600)
        registry.register(usage)
        usage.observe(_record("acme", 100, 10))
        usage.observe(_record("acme", 0, 0, route="/v1/models"))
        labels = {"tenant": "acme", "model_name": "m", "pool": "base", "outcome": "ok"}
        assert registry.get_sample_value(cat.USAGE_GPU_SECONDS.series, {**labels, "basis": "token_estimate"}) == 2.0
        assert registry.get_sample_value(cat.USAGE_REQUESTS.series, labels) == 1

    def test_a_tenant_that_loses_its_name_leaves_the_metrics_but_not_the_ledger(self) -> None:
        """At a window's end a demoted tenant's series go; the ledger keeps what it used."""
        clock = Clock()
        registry = CollectorRegistry()
        usage = UsageAccounting(CostConfig(), 1, 60, clock=clock)
        registry.register(usage)
        usage.observe(_record("a", 1, 1))
        for _ in range(3):
            usage.observe(_record("b", 1, 1))
        clock.now = 61
        usage.observe(_record("b", 1, 1, outcome=Outcome.OK))
        assert registry.get_sample_value(cat.USAGE_REQUESTS.series, {
            "tenant": "a", "model_name": "m", "pool": "base", "outcome": "ok"}) is None
        assert {key[0] for key in usage.ledger.window(0, 1e9)} == {"a", "other", "b"}


@pytest.mark.parametrize("name", [field.name for field in dataclasses.fields(Usage)])
def test_adding_usage_adds_every_field(name: str) -> None:
    """Usage.add writes its fields out: a field added to Usage but not to add() would be dropped here."""
    row, one = Usage(), Usage(**{name: 1})
    row.add(one)
    row.add(one)
    assert getattr(row, name) == 2
    assert all(getattr(row, other.name) == 0 for other in dataclasses.fields(Usage) if other.name != name)

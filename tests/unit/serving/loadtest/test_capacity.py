"""Goodput, the SLO verdict of a step, the capacity pick and the provisioning arithmetic."""

from __future__ import annotations

import pytest

from alert_rules.config import RulesConfig
from serving.loadtest.capacity import (
    Provisioning,
    SloTarget,
    StepVerdict,
    capacity,
    capacity_document,
    goodput,
    judge,
)
from serving.loadtest.client import RequestResult


def _results(*e2e: float, failed: int = 0) -> list[RequestResult]:
    ok = [RequestResult(index=i, status=200, e2e_s=v) for i, v in enumerate(e2e)]
    return ok + [RequestResult(index=100 + i, error="500", e2e_s=0.01) for i in range(failed)]


def test_the_slo_comes_from_the_rules_config() -> None:
    """slo_latency_threshold_s and slo_objective are the target."""
    target = SloTarget.from_rules(RulesConfig(slo_latency_threshold_s=2.5, slo_objective=0.95))
    assert (target.latency_s, target.objective) == (2.5, 0.95)


def test_goodput_counts_successes_within_the_bound_among_all_sent() -> None:
    """Of 3 fast, 1 slow and 1 failed request, 3/5 are good; a fast failure is not good."""
    assert goodput(_results(0.1, 0.2, 0.3, 5.0, failed=1), 1.0) == pytest.approx(0.6)
    assert goodput([], 1.0) is None


def test_a_step_meets_the_slo_at_the_objective() -> None:
    """19 good of 20 meet a 95 % objective; 18 do not."""
    target = SloTarget(1.0, 0.95)
    assert judge("a", _results(*[0.1] * 19, 3.0), 2.0, target).meets_slo
    assert not judge("b", _results(*[0.1] * 18, 3.0, 3.0), 2.0, target).meets_slo
    assert judge("c", _results(0.1), 2.0, target).rpm == 120.0


@pytest.mark.parametrize(("meets", "expected"), [
    pytest.param((True, True, False, False), "2", id="the last step before the first miss"),
    pytest.param((True, True, True), "3", id="every step met: the last"),
    pytest.param((True, False, True), "1", id="a pass above a miss is not trusted"),
    pytest.param((False, True), None, id="the first step missed: no capacity"),
])
def test_capacity_is_the_last_step_before_the_first_miss(meets: tuple[bool, ...], expected: str | None) -> None:
    """Steps are judged in load order."""
    verdicts = [StepVerdict(str(n), 10, 1.0 if ok else 0.5, ok, 60.0 * n) for n, ok in enumerate(meets, 1)]
    best = capacity(verdicts)
    assert (best.step if best else None) == expected


@pytest.mark.parametrize(("meets", "lower_bound"), [
    pytest.param((True, True, True), True, id="no step missed: at least the last step"),
    pytest.param((True,), True, id="one step that met: at least it"),
    pytest.param((True, True, False), False, id="a step missed: the limit lies below it"),
    pytest.param((True, False, True), False, id="a miss then a pass: not a lower bound either"),
])
def test_capacity_is_a_lower_bound_only_when_no_step_missed(meets: tuple[bool, ...], lower_bound: bool) -> None:
    """report.json's capacity says whether it is a measured limit or only 'at least' (every step met the SLO)."""
    verdicts = [StepVerdict(str(n), 10, 1.0 if ok else 0.5, ok, 60.0 * n) for n, ok in enumerate(meets, 1)]
    document = capacity_document(verdicts)
    assert document is not None
    assert document["lower_bound"] is lower_bound
    assert document["step"] == capacity(verdicts).step  # type: ignore[union-attr]
    assert capacity_document([StepVerdict("1", 10, 0.5, False, 60.0)]) is None


def test_provisioning_keeps_ten_percent_headroom_per_hundred_rpm() -> None:
    """500 rpm expected: 50 % headroom, 750 rpm needed, 3 replicas of 300 rpm (and at least one)."""
    plan = Provisioning(500.0, 0.10, 300.0)
    assert plan.headroom_ratio == pytest.approx(0.5)
    assert plan.needed_rpm == pytest.approx(750.0)
    assert plan.replicas == 3
    assert Provisioning(10.0, 0.10, 300.0).replicas == 1

"""The SLO of a step, the capacity of the deployment and the provisioning it implies.

The SLO is the rules config's: a request is good when it succeeded within
``slo_latency_threshold_s``; a step meets the SLO when the share of good requests among those it
sent (its goodput) reaches ``slo_objective``. The capacity is the last step, in load order, before
the first one that misses the SLO (a noisy pass above a miss is not trusted), in successful
requests per minute; when no step misses it, the capacity is only a lower bound ("at least").
Provisioning for an expected load of ``E`` requests per minute keeps ``headroom`` (10 %) of spare
capacity per 100 requests per minute: ``E x (1 + headroom x E / 100)`` requests per minute are
needed, in ``ceil(needed / capacity)`` replicas (at most that many, when the capacity is a lower bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from alert_rules.config import RulesConfig
from serving.loadtest.client import RequestResult

DEFAULT_HEADROOM_PER_100_RPM = 0.10


@dataclass(frozen=True, slots=True)
class SloTarget:
    """The latency bound of a good request and the share of good requests a step must reach."""

    latency_s: float
    objective: float

    @classmethod
    def from_rules(cls, rules: RulesConfig) -> SloTarget:
        """The SLO of the rules config (``slo_latency_threshold_s``, ``slo_objective``)."""
        return cls(rules.slo_latency_threshold_s, rules.slo_objective)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"latency_s": self.latency_s, "objective": self.objective}


def goodput(results: Sequence[RequestResult], latency_s: float) -> float | None:
    """The share of ``results`` that succeeded within ``latency_s`` (None when there are none)."""
    if not results:
        return None
    good = sum(1 for r in results if r.ok and r.e2e_s is not None and r.e2e_s <= latency_s)
    return good / len(results)


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """How one step fared against the SLO, and its throughput in successful requests per minute."""

    step: str
    sent: int
    goodput: float | None
    meets_slo: bool
    rpm: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"step": self.step, "sent": self.sent, "goodput": self.goodput, "meets_slo": self.meets_slo,
                "rpm": self.rpm}


def judge(step: str, results: Sequence[RequestResult], requests_per_s: float, target: SloTarget) -> StepVerdict:
    """The verdict of one step."""
    share = goodput(results, target.latency_s)
    return StepVerdict(step, len(results), share, share is not None and share >= target.objective,
                       requests_per_s * 60.0)


def capacity(verdicts: Sequence[StepVerdict]) -> StepVerdict | None:
    """The last step before the first that misses the SLO (None when the first already misses it)."""
    passed = None
    for verdict in verdicts:
        if not verdict.meets_slo:
            break
        passed = verdict
    return passed


def capacity_document(verdicts: Sequence[StepVerdict]) -> dict[str, Any] | None:
    """The capacity as ``report.json`` holds it: :func:`capacity`'s step and ``lower_bound``.

    ``lower_bound`` is true when no step missed the SLO: the deployment took every load tried, so
    its capacity is at least the last step's (the limit lies above); false when a step missed it,
    so the limit lies between the capacity step and that one.
    """
    best = capacity(verdicts)
    if best is None:
        return None
    return {**best.to_dict(), "lower_bound": all(verdict.meets_slo for verdict in verdicts)}


@dataclass(frozen=True, slots=True)
class Provisioning:
    """Replicas for an expected load, keeping ``headroom_per_100_rpm`` of spare capacity per 100 rpm."""

    expected_rpm: float
    headroom_per_100_rpm: float
    capacity_rpm: float

    @property
    def headroom_ratio(self) -> float:
        """Spare capacity kept, as a share of the expected load."""
        return self.headroom_per_100_rpm * self.expected_rpm / 100.0

    @property
    def needed_rpm(self) -> float:
        """Expected load plus headroom."""
        return self.expected_rpm * (1.0 + self.headroom_ratio)

    @property
    def replicas(self) -> int:
        """Deployments like the one measured needed for ``needed_rpm`` (at least 1)."""
        return max(1, math.ceil(self.needed_rpm / self.capacity_rpm))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the derived numbers."""
        return {"expected_rpm": self.expected_rpm, "headroom_per_100_rpm": self.headroom_per_100_rpm,
                "headroom_ratio": self.headroom_ratio, "needed_rpm": self.needed_rpm,
                "capacity_rpm": self.capacity_rpm, "replicas": self.replicas}

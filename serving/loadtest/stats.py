"""Percentiles and the summary of one step: counts, rates, tokens, latency distributions, the slowest requests."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from serving.loadtest.client import RequestResult
from serving.loadtest.spec import LoadSpec

SLOWEST_SHOWN = 5


@dataclass(frozen=True, slots=True)
class Distribution:
    """Percentiles (linear interpolation between closest ranks) of one measurement, in its own unit."""

    count: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        """The distribution of ``values`` (all None when empty)."""
        if not values:
            return cls(0)
        ordered = sorted(values)
        return cls(len(ordered), percentile(ordered, 50), percentile(ordered, 90), percentile(ordered, 99),
                   statistics.fmean(ordered), ordered[0], ordered[-1])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, in the distribution's unit."""
        return {k: getattr(self, k) for k in ("count", "p50", "p90", "p99", "mean", "min", "max")}


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of sorted values, interpolating linearly between closest ranks."""
    if not ordered:
        raise ValueError("percentile of no values")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, slots=True)
class Latencies:
    """TTFT, inter-token gaps and end-to-end latency of a group of successful requests."""

    ttft_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution

    @classmethod
    def of(cls, results: Sequence[RequestResult]) -> Latencies:
        """The latencies of the successful requests among ``results``."""
        ok = [r for r in results if r.ok]
        return cls(Distribution.of([r.ttft_s for r in ok if r.ttft_s is not None]),
                   Distribution.of([gap for r in ok for gap in r.itl_s]),
                   Distribution.of([r.e2e_s for r in ok if r.e2e_s is not None]))


@dataclass(frozen=True, slots=True)
class Slow:
    """One of the slowest requests, for `inferwatch logs search --trace-id`."""

    index: int
    e2e_s: float
    status: int | None
    error: str | None
    trace_id: str | None


@dataclass(frozen=True, slots=True)
class LoadReport:
    """The summary of a run (or of one step); ``results`` holds the raw per-request samples."""

    url: str
    model: str
    mode: str
    stream: bool
    sent: int
    ok: int
    failed: int
    errors: dict[str, int]
    error_details: dict[str, str]
    wall_s: float
    requests_per_s: float
    output_tokens_per_s: float
    prompt_tokens: int
    completion_tokens: int
    tokens_per_request: Distribution
    ttft_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    slowest: list[Slow]
    trace_ids_missing: int
    max_start_lag_s: float
    retries: int = 0
    """Requests a closed-loop worker sent after a failed one (after backing off)."""
    backoff_s: float = 0.0
    """Seconds the workers spent backing off, summed."""
    results: tuple[RequestResult, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (durations in seconds), without the raw samples."""
        return {
            "url": self.url, "model": self.model, "mode": self.mode, "stream": self.stream,
            "requests": {"sent": self.sent, "ok": self.ok, "failed": self.failed},
            "retries": self.retries, "backoff_s": self.backoff_s,
            "errors": dict(self.errors), "error_details": dict(self.error_details),
            "wall_s": self.wall_s, "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens,
                       "completion_per_request": self.tokens_per_request.to_dict()},
            "ttft_s": self.ttft_s.to_dict(), "itl_s": self.itl_s.to_dict(), "e2e_s": self.e2e_s.to_dict(),
            "slowest": [{"index": s.index, "e2e_s": s.e2e_s, "status": s.status, "error": s.error,
                         "trace_id": s.trace_id} for s in self.slowest],
            "trace_ids_missing": self.trace_ids_missing, "max_start_lag_s": self.max_start_lag_s,
        }


def error_counts(results: Sequence[RequestResult]) -> tuple[dict[str, int], dict[str, str]]:
    """Failed requests by kind, and the first detail seen of each kind (both sorted by kind)."""
    errors: dict[str, int] = {}
    details: dict[str, str] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
            details.setdefault(r.error, r.detail)
    return dict(sorted(errors.items())), dict(sorted(details.items()))


def summarize(spec: LoadSpec, results: Sequence[RequestResult], wall_s: float) -> LoadReport:
    """Aggregate per-request results into a report."""
    ok = [r for r in results if r.ok]
    errors, details = error_counts(results)
    completion = sum(r.completion_tokens or 0 for r in ok)
    timed = sorted((r for r in results if r.e2e_s is not None), key=lambda r: r.e2e_s or 0.0, reverse=True)
    per_second = wall_s if wall_s > 0 else math.inf
    latencies = Latencies.of(results)
    return LoadReport(
        url=spec.endpoint, model=spec.model, mode="rate" if spec.rate is not None else "concurrency",
        stream=spec.stream, sent=len(results), ok=len(ok), failed=len(results) - len(ok),
        errors=errors, error_details=details,
        wall_s=wall_s, requests_per_s=len(ok) / per_second, output_tokens_per_s=completion / per_second,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok), completion_tokens=completion,
        tokens_per_request=Distribution.of([r.completion_tokens for r in ok if r.completion_tokens is not None]),
        ttft_s=latencies.ttft_s, itl_s=latencies.itl_s, e2e_s=latencies.e2e_s,
        slowest=[Slow(r.index, r.e2e_s or 0.0, r.status, r.error, r.trace_id) for r in timed[:SLOWEST_SHOWN]],
        trace_ids_missing=sum(1 for r in results if r.status is not None and not r.trace_id),
        max_start_lag_s=max((r.lag_s for r in results), default=0.0),
        retries=sum(1 for r in results if r.retry > 0), backoff_s=sum(r.backoff_s for r in results),
        results=tuple(results),
    )

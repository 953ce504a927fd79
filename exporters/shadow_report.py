"""Shadow traffic summed up from request records, and the go/no-go verdict of ``inferwatch shadow report``.

Pure: fed request events (the log records' dicts, from the archive or the sidecar's ring), it
counts the shadowed requests by result, and over those both upstreams answered it compares the
shadow with the primary (what the client got):

- match rate: matches / (matches + mismatches); ``not_compared`` answers (a side without text) are left out;
- latency ratios: the shadow's p50 and p99 end-to-end latency (and TTFT) over the primary's, each
  percentile taken over the same requests (nearest rank);
- error delta: the shadow's error ratio minus the primary's (errors: upstream_error, timeout, overloaded).

The verdict is ``go`` when every figure is within its threshold and there are at least
``min_requests`` compared requests; each failed condition is named.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from exporters.records import Outcome

ERROR_OUTCOMES = frozenset(str(o) for o in Outcome if o.is_error)
_ANSWERED = ("match", "mismatch", "not_compared")


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What a go needs (the report's flags)."""

    min_match_rate: float = 0.95
    max_p50_ratio: float = 1.1
    max_p99_ratio: float = 1.25
    max_error_delta: float = 0.01
    min_requests: int = 100


@dataclass(slots=True)
class ShadowSummary:
    """The shadowed requests of a period, compared."""

    shadowed: int = 0
    results: dict[str, int] = field(default_factory=dict)
    match_rate: float | None = None
    e2e_p50_ratio: float | None = None
    e2e_p99_ratio: float | None = None
    ttft_p50_ratio: float | None = None
    ttft_p99_ratio: float | None = None
    primary_error_ratio: float | None = None
    shadow_error_ratio: float | None = None
    error_delta: float | None = None
    mean_distance: float | None = None

    @property
    def compared(self) -> int:
        """Requests whose outputs were compared (match or mismatch)."""
        return self.results.get("match", 0) + self.results.get("mismatch", 0)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0-1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _ratio(shadow: list[float], primary: list[float], q: float) -> float | None:
    if not shadow or not primary:
        return None
    base = percentile(primary, q)
    return percentile(shadow, q) / base if base > 0 else None


def summarize(events: Iterable[Mapping[str, Any]]) -> ShadowSummary:
    """Sum up the request events that carry a ``shadow_result`` (the others are skipped)."""
    summary = ShadowSummary()
    e2e: tuple[list[float], list[float]] = ([], [])
    ttft: tuple[list[float], list[float]] = ([], [])
    errors = [0, 0]
    distances: list[float] = []
    answered = 0
    for event in events:
        result = event.get("shadow_result")
        if not isinstance(result, str):
            continue
        summary.shadowed += 1
        summary.results[result] = summary.results.get(result, 0) + 1
        if result not in _ANSWERED:
            continue
        answered += 1
        errors[0] += event.get("outcome") in ERROR_OUTCOMES
        errors[1] += event.get("shadow_outcome") in ERROR_OUTCOMES
        for pair, primary_key, shadow_key in ((e2e, "e2e_ms", "shadow_e2e_ms"), (ttft, "ttft_ms", "shadow_ttft_ms")):
            primary, shadow = event.get(primary_key), event.get(shadow_key)
            if isinstance(primary, int | float) and isinstance(shadow, int | float):
                pair[0].append(float(primary))
                pair[1].append(float(shadow))
        if isinstance(event.get("shadow_distance"), int | float):
            distances.append(float(event["shadow_distance"]))
    if summary.compared:
        summary.match_rate = summary.results.get("match", 0) / summary.compared
    summary.e2e_p50_ratio, summary.e2e_p99_ratio = _ratio(e2e[1], e2e[0], 0.5), _ratio(e2e[1], e2e[0], 0.99)
    summary.ttft_p50_ratio, summary.ttft_p99_ratio = _ratio(ttft[1], ttft[0], 0.5), _ratio(ttft[1], ttft[0], 0.99)
    if answered:
        summary.primary_error_ratio, summary.shadow_error_ratio = errors[0] / answered, errors[1] / answered
        summary.error_delta = summary.shadow_error_ratio - summary.primary_error_ratio
    if distances:
        summary.mean_distance = sum(distances) / len(distances)
    return summary


def verdict(summary: ShadowSummary, limits: Thresholds) -> list[str]:
    """Why the shadow is a no-go (an empty list: go)."""
    reasons = []
    if summary.compared < limits.min_requests:
        reasons.append(f"{summary.compared} compared requests, fewer than --min-requests {limits.min_requests}")
    checks = (
        (summary.match_rate, limits.min_match_rate, "match rate", True),
        (summary.e2e_p50_ratio, limits.max_p50_ratio, "p50 e2e latency ratio", False),
        (summary.e2e_p99_ratio, limits.max_p99_ratio, "p99 e2e latency ratio", False),
        (summary.error_delta, limits.max_error_delta, "error ratio delta", False),
    )
    for value, limit, name, at_least in checks:
        if value is not None and (value < limit if at_least else value > limit):
            reasons.append(f"{name} {value:.4g} is {'below' if at_least else 'above'} {limit:g}")
    return reasons


def report(summary: ShadowSummary, limits: Thresholds) -> dict[str, Any]:
    """The JSON report (schema inferwatch.shadow_report/1): the summary, the thresholds and the verdict."""
    reasons = verdict(summary, limits)
    return {"schema": "inferwatch.shadow_report/1", **asdict(summary), "compared": summary.compared,
            "thresholds": asdict(limits), "verdict": "no-go" if reasons else "go", "reasons": reasons}

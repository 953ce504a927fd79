"""Progressive warm-up: real requests at a rate ramped from ``from_rps`` to ``to_rps``, then held there.

Health pings compile nothing: a server warms up on requests of the lengths it will serve, at a
rate that grows as it gets faster. The rate rises linearly over ``over_s`` seconds (request ``i``
leaves when the integral of the rate reaches ``i``), then stays at ``to_rps`` for ``hold_s``
seconds. Latency is judged in windows of ``window_s``: it has settled at the start of the first
window from which every window's median TTFT (or end-to-end latency, when not streamed) lies within
``settle_ratio`` (or ``settle_floor_s``) of the last window's. The SLO is judged on the requests
sent while the rate was held at the target.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exporters.errors import ConfigError
from serving.loadtest.capacity import SloTarget, StepVerdict, judge
from serving.loadtest.client import RequestResult
from serving.loadtest.prompts import Source
from serving.loadtest.run import OnProgress, run_load
from serving.loadtest.spec import MAX_DURATION_S, MAX_RATE, LoadSpec, check_range


@dataclass(frozen=True, slots=True)
class RampSpec:
    """How fast to start, how fast to end, over how long, and how to judge the result."""

    from_rps: float
    to_rps: float
    over_s: float
    hold_s: float = 30.0
    window_s: float = 5.0
    settle_ratio: float = 0.2
    settle_floor_s: float = 0.02

    def validate(self) -> RampSpec:
        """Return the spec when in range; raise ConfigError naming the option otherwise."""
        check_range("--from-rps", self.from_rps, 0.0, MAX_RATE, open_low=True)
        check_range("--to-rps", self.to_rps, 0.0, MAX_RATE, open_low=True)
        check_range("--over", self.over_s, 0.0, MAX_DURATION_S, open_low=True)
        check_range("--hold", self.hold_s, 0.0, MAX_DURATION_S, open_low=True)
        check_range("--window-s", self.window_s, 0.0, MAX_DURATION_S, open_low=True)
        check_range("--settle-ratio", self.settle_ratio, 0.0, 1.0, open_low=True)
        if self.window_s > self.over_s + self.hold_s:
            raise ConfigError("--window-s", "must not be longer than the ramp and the hold together", self.window_s)
        return self

    def rate_at(self, t_s: float) -> float:
        """The scheduled rate ``t_s`` seconds after the start."""
        if t_s >= self.over_s:
            return self.to_rps
        return self.from_rps + (self.to_rps - self.from_rps) * t_s / self.over_s


def ramp_offsets(spec: RampSpec) -> list[float]:
    """When each request leaves: the ramp's integral reaches ``i`` at request ``i``, then ``to_rps`` is held."""
    a, b, span = spec.from_rps, spec.to_rps, spec.over_s
    slope = (b - a) / (2 * span)
    ramped = span * (a + b) / 2
    offsets: list[float] = []
    index = 0
    while True:
        if index <= ramped:
            due = index / a if slope == 0 else (-a + math.sqrt(a * a + 4 * slope * index)) / (2 * slope)
        else:
            due = span + (index - ramped) / b
        if due >= span + spec.hold_s:
            return offsets
        offsets.append(due)
        index += 1


@dataclass(frozen=True, slots=True)
class Window:
    """One window of the ramp: its time span, scheduled rate at its start and what its requests saw."""

    start_s: float
    end_s: float
    rate: float
    sent: int
    failed: int
    median_latency_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"start_s": self.start_s, "end_s": self.end_s, "rate": self.rate, "sent": self.sent,
                "failed": self.failed, "median_latency_s": self.median_latency_s}


def _latency(result: RequestResult) -> float | None:
    return result.ttft_s if result.ttft_s is not None else result.e2e_s


def windows(spec: RampSpec, results: Sequence[RequestResult]) -> list[Window]:
    """The run cut into windows of ``window_s`` by sending time."""
    end = spec.over_s + spec.hold_s
    out = []
    start = 0.0
    while start < end:
        stop = min(start + spec.window_s, end)
        inside = [r for r in results if start <= r.due_s < stop]
        latencies = [v for r in inside if r.ok and (v := _latency(r)) is not None]
        out.append(Window(start, stop, spec.rate_at(start), len(inside), sum(1 for r in inside if not r.ok),
                          statistics.median(latencies) if latencies else None))
        start = stop
    return out


def settled_at(spec: RampSpec, cut: Sequence[Window]) -> float | None:
    """The start of the first window from which every window's median lies near the last one's (None: never)."""
    measured = [w for w in cut if w.median_latency_s is not None]
    if not measured:
        return None
    final = measured[-1].median_latency_s
    assert final is not None
    tolerance = max(spec.settle_ratio * final, spec.settle_floor_s)
    since = measured[-1].start_s
    for window in reversed(measured):
        assert window.median_latency_s is not None
        if abs(window.median_latency_s - final) > tolerance:
            break
        since = window.start_s
    return since


@dataclass(frozen=True, slots=True)
class RampResult:
    """What the ramp measured and the verdict at the target rate."""

    spec: RampSpec
    results: tuple[RequestResult, ...]
    windows: tuple[Window, ...]
    settled_at_s: float | None
    at_target: StepVerdict

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"from_rps": self.spec.from_rps, "to_rps": self.spec.to_rps, "over_s": self.spec.over_s,
                "hold_s": self.spec.hold_s, "settled_at_s": self.settled_at_s, "at_target": self.at_target.to_dict(),
                "windows": [w.to_dict() for w in self.windows], "sent": len(self.results),
                "failed": sum(1 for r in self.results if not r.ok)}


async def ramp_up(
    load: LoadSpec, spec: RampSpec, source: Source, target: SloTarget, *, on_progress: OnProgress | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> RampResult:
    """Send the ramp and the hold; judge settling and the SLO at the target rate."""
    spec.validate()
    offsets = ramp_offsets(spec)
    mean = len(offsets) / (spec.over_s + spec.hold_s)
    step = replace(load, requests=len(offsets), duration_s=None, concurrency=None, rate=mean, arrivals="scheduled")
    say(f"ramping {spec.from_rps:g} -> {spec.to_rps:g} req/s over {spec.over_s:g} s, then holding "
        f"{spec.hold_s:g} s: {len(offsets)} requests")
    report = await run_load(step, source=source, offsets=offsets, step="ramp", on_progress=on_progress)
    cut = windows(spec, report.results)
    held = [r for r in report.results if r.due_s >= spec.over_s]
    held_s = spec.hold_s if held else 0.0
    verdict = judge("hold", held, sum(1 for r in held if r.ok) / held_s if held_s else 0.0, target)
    return RampResult(spec, report.results, tuple(cut), settled_at(spec, cut), verdict)

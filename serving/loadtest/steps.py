"""A whole load test: its steps one after the other, with the engine timeline and the cold starts beside them.

Every step is a :func:`~serving.loadtest.run.run_load` of its own spec (same source, request
indexes continuing, so no prompt repeats); all times are seconds after the start of the first
step. The timeline is scraped for the whole run; cold starts are spread over the planned
duration (the sum of the step durations), and the run waits for the last one to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from serving.loadtest import timeline as tl
from serving.loadtest.client import RequestResult
from serving.loadtest.coldstart import ColdStart, Probe, Restart, cold_start, measure_shock, restart_offsets
from serving.loadtest.pacing import Clock, Sleep
from serving.loadtest.prompts import Source
from serving.loadtest.run import OnProgress, run_load
from serving.loadtest.spec import LoadSpec
from serving.loadtest.stats import LoadReport

LONG_CONTEXT_STEP = "long-context"
"""The label of the long-context preset's step, reported on its own."""


@dataclass(frozen=True, slots=True)
class ColdStartPlan:
    """How many restarts, how, and how to tell that the upstream is back.

    ``at_s`` places the restarts (seconds after the start); empty spreads ``count`` of them evenly.
    """

    count: int
    restart: Restart
    probe: Probe
    shock_window_s: float = 60.0
    at_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class RunPlan:
    """The steps (each a validated spec, with its label), what to send, and what to watch beside the load."""

    steps: tuple[LoadSpec, ...]
    labels: tuple[str, ...]
    source: Source
    offsets: Sequence[float] | None = None
    metrics_url: str | None = None
    scrape_interval_s: float = 1.0
    cold_starts: ColdStartPlan | None = None

    @property
    def planned_s(self) -> float | None:
        """The sum of the step durations, None when a step is bounded by its count only."""
        durations = [s.duration_s for s in self.steps]
        return None if any(d is None for d in durations) else sum(d for d in durations if d is not None)


@dataclass(slots=True)
class RunResult:
    """What a load test measured: per-step reports, the timeline, the cold starts and when it ran."""

    plan: RunPlan
    steps: list[LoadReport] = field(default_factory=list)
    timeline: tl.Timeline | None = None
    cold_starts: list[ColdStart] = field(default_factory=list)
    started_unix: float = 0.0
    wall_s: float = 0.0

    @property
    def results(self) -> list[RequestResult]:
        """Every request of every step, in sending order."""
        return [r for step in self.steps for r in step.results]


async def run_steps(
    plan: RunPlan,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    on_progress: OnProgress | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> RunResult:
    """Run the plan's steps in order, with the timeline and cold starts beside them."""
    result = RunResult(plan, started_unix=time.time())
    origin = clock()
    background: list[asyncio.Task[None]] = []
    restarts: asyncio.Task[list[ColdStart]] | None = None
    async with aiohttp.ClientSession() as session:
        if plan.metrics_url:
            result.timeline = tl.Timeline(plan.metrics_url, plan.scrape_interval_s)
            background.append(asyncio.create_task(
                tl.record(result.timeline, session, origin=origin, clock=clock, sleep=sleep)))
        if plan.cold_starts is not None and plan.cold_starts.count:
            restarts = asyncio.create_task(_restarts(plan.cold_starts, plan.planned_s or 0.0, session, origin,
                                                     clock, sleep, say))
        try:
            first_index = 0
            for number, (spec, label) in enumerate(zip(plan.steps, plan.labels, strict=True), 1):
                say(f"step {number}/{len(plan.steps)}: {label}")
                report = await run_load(spec, source=plan.source, offsets=plan.offsets, first_index=first_index,
                                        origin=origin, step=label, step_number=number, steps=len(plan.steps),
                                        clock=clock, sleep=sleep, on_progress=on_progress)
                result.steps.append(report)
                first_index += report.sent
            if restarts is not None:
                result.cold_starts = await restarts
                if result.timeline is not None:
                    back = max((event.ready_s for event in result.cold_starts if event.ready_s is not None),
                               default=None)
                    if back is not None:
                        await _sampled_after(result.timeline, back, clock, sleep)
        finally:
            for task in background:
                task.cancel()
            if restarts is not None and not restarts.done():
                restarts.cancel()
            for stopped in [*background, *([restarts] if restarts else [])]:
                with contextlib.suppress(asyncio.CancelledError):
                    await stopped
    result.wall_s = clock() - origin
    if plan.cold_starts is not None:
        for event in result.cold_starts:
            measure_shock(event, result.results, plan.cold_starts.shock_window_s)
    return result


async def _sampled_after(timeline: tl.Timeline, t_s: float, clock: Clock, sleep: Sleep) -> None:
    """Wait (at most three scrape intervals) until the timeline holds a scrape begun after ``t_s`` (seconds after
    the start, as the samples' times): a run whose load ended before the upstream was ready again still shows
    the engine back, not only its gap."""
    deadline = clock() + 3 * timeline.interval_s
    while not any(sample.t_s > t_s for sample in timeline.samples) and clock() < deadline:
        await sleep(timeline.interval_s / 4)


async def _restarts(
    plan: ColdStartPlan, planned_s: float, session: aiohttp.ClientSession, origin: float, clock: Clock,
    sleep: Sleep, say: Callable[[str], None],
) -> list[ColdStart]:
    events = []
    for number, at in enumerate(plan.at_s or restart_offsets(plan.count, planned_s), 1):
        await sleep(max(0.0, origin + at - clock()))
        say(f"cold start {number}/{plan.count}: restarting the upstream")
        event = await cold_start(number, plan.restart, plan.probe, session, origin=origin, clock=clock, sleep=sleep)
        events.append(event)
        if event.error:
            say(f"cold start {number}: {event.error}")
        else:
            say(f"cold start {number}: ready after {event.ready_after_s or 0.0:.1f} s, first token after "
                f"{event.first_token_after_s or 0.0:.1f} s")
    return events

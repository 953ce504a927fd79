"""One step of a load test: bounded by a count or a duration, paced closed-loop or open-loop.

Closed loop: ``concurrency`` workers, each sending its next request when the last one ends; after
a failed one the worker backs off (``backoff.Backoff``: exponential from ``retry_initial_ms`` with
jitter, at least the answer's Retry-After), so that an upstream that is down or refusing is not
hammered, and that next request counts as a retry.
Open loop: request ``i`` leaves at its offset on an absolute schedule (``pacing``), at most
``max_in_flight`` at a time; one held back by that limit counts as late (``lag_s``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeAlias

import aiohttp

from serving.loadtest.backoff import Backoff
from serving.loadtest.client import RequestResult, send_request
from serving.loadtest.pacing import Clock, Sleep, Slot, fixed_offsets, poisson_offsets, scheduled_slots
from serving.loadtest.progress import Progress
from serving.loadtest.prompts import GeneratedSource, Length, Source, build_payload
from serving.loadtest.spec import MAX_REQUESTS, LoadSpec, endpoint
from serving.loadtest.stats import LoadReport, summarize

OnProgress: TypeAlias = Callable[[Progress], None]


def default_source(spec: LoadSpec) -> GeneratedSource:
    """``prompt_tokens`` words per prompt, uncalibrated (about one token each; usage gives the real count)."""
    return GeneratedSource((Length(spec.prompt_tokens, spec.prompt_tokens),), (1.0,), spec.max_tokens, spec.chat,
                           spec.seed, name="words")


class _Tracker:
    """Counts finished requests for progress readings."""

    def __init__(self, spec: LoadSpec, clock: Clock, step: str, step_number: int, steps: int) -> None:
        self.spec = spec
        self.clock = clock
        self.start = clock()
        self.step, self.step_number, self.steps = step, step_number, steps
        self.done = self.errors = self.in_flight = 0
        self._last_done, self._last_t = 0, self.start

    def finished(self, result: RequestResult) -> None:
        self.done += 1
        self.errors += 0 if result.ok else 1

    def reading(self) -> Progress:
        now = self.clock()
        interval = now - self._last_t
        rps = (self.done - self._last_done) / interval if interval > 0 else 0.0
        self._last_done, self._last_t = self.done, now
        return Progress(now - self.start, self.done, self.errors, self.in_flight, rps, self.spec.requests,
                        self.spec.duration_s, self.step, self.step_number, self.steps)


async def run_load(
    spec: LoadSpec,
    *,
    source: Source | None = None,
    offsets: Sequence[float] | None = None,
    first_index: int = 0,
    origin: float | None = None,
    step: str = "",
    step_number: int = 1,
    steps: int = 1,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    on_progress: OnProgress | None = None,
    progress_every_s: float = 1.0,
) -> LoadReport:
    """Run a validated step against ``spec.url`` and return its report (with the raw samples).

    ``source`` gives the requests (default: ``prompt_tokens`` words); ``offsets`` is the given
    schedule of a replay or a ramp (``arrivals="scheduled"``); request indexes start at
    ``first_index`` (so that the steps of one run never repeat a prompt); ``sent_s`` is measured
    from ``origin`` (default: now).
    """
    spec.validate()
    source = source or default_source(spec)
    results: list[RequestResult] = []
    tracker = _Tracker(spec, clock, step, step_number, steps)
    zero = tracker.start if origin is None else origin
    limit = spec.concurrency if spec.concurrency is not None else spec.max_in_flight
    ticker = asyncio.create_task(_tick(tracker, on_progress, progress_every_s)) if on_progress else None

    async def one(
        session: aiohttp.ClientSession, number: int, due_s: float, lag_s: float, retry: int = 0, backoff_s: float = 0.0,
    ) -> RequestResult:
        index = first_index + number
        plan = source.plan(index)
        payload = build_payload(spec.model, plan, stream=spec.stream, ignore_eos=spec.ignore_eos)
        tracker.in_flight += 1
        sent_s = clock() - zero
        try:
            result = await send_request(session, endpoint(spec.url, chat=plan.chat), payload,
                                        timeout_s=spec.timeout_s, index=index)
        finally:
            tracker.in_flight -= 1
        result.due_s, result.lag_s, result.sent_s, result.step = due_s, lag_s, sent_s, step
        result.model, result.bucket, result.asked_prompt_tokens = payload["model"], plan.bucket, \
            plan.asked_prompt_tokens
        result.retry, result.backoff_s = retry, backoff_s
        results.append(result)
        tracker.finished(result)
        return result

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit)) as session:
            if spec.rate is not None:
                await _open_loop(spec, _offsets(spec, offsets), session, one, clock, sleep)
            else:
                await _closed_loop(spec, session, one, clock, sleep, tracker.start)
    finally:
        if ticker is not None:
            ticker.cancel()
    wall_s = clock() - tracker.start
    if on_progress is not None:
        on_progress(tracker.reading())
    return summarize(spec, sorted(results, key=lambda r: r.index), wall_s)


def _offsets(spec: LoadSpec, recorded: Sequence[float] | None) -> Iterable[float]:
    assert spec.rate is not None
    if spec.arrivals == "scheduled":
        if recorded is None:
            raise ValueError("a scheduled step needs its offsets")
        return recorded
    return poisson_offsets(spec.rate, spec.seed) if spec.arrivals == "poisson" else fixed_offsets(spec.rate)


One = Callable[..., Awaitable[RequestResult]]
"""Sends request number ``n`` (due ``due_s``, ``lag_s`` late; closed loop: the ``retry`` after failures in a row and
the ``backoff_s`` paused before it) and returns what the client saw."""


async def _closed_loop(
    spec: LoadSpec, session: aiohttp.ClientSession, one: One, clock: Clock, sleep: Sleep, start: float
) -> None:
    """``concurrency`` workers, each sending its next request as soon as the previous one ends, or backing off
    after a failed one (jitter seeded by ``spec.seed`` and the worker's number)."""
    issued = 0
    limit = spec.requests if spec.requests is not None else MAX_REQUESTS

    async def worker(worker_number: int) -> None:
        nonlocal issued
        backoff = Backoff(spec.retry_initial_ms / 1000, spec.retry_max_ms / 1000,
                          random.Random(f"{spec.seed}:{worker_number}"))  # noqa: S311 - seeded jitter, not a secret
        pause_s = 0.0
        while issued < limit:
            now = clock() - start
            if spec.duration_s is not None and now >= spec.duration_s:
                return
            number, issued = issued, issued + 1
            result = await one(session, number, now, 0.0, backoff.failures_in_a_row, pause_s)
            pause_s = backoff.pause_after(result.ok, result.retry_after_s)
            if pause_s:
                await sleep(pause_s)

    await asyncio.gather(*(worker(n) for n in range(spec.concurrency or 1)))


async def _open_loop(
    spec: LoadSpec, offsets: Iterable[float], session: aiohttp.ClientSession, one: One, clock: Clock, sleep: Sleep
) -> None:
    """Requests started on an absolute schedule, at most ``max_in_flight`` at a time."""
    gate = asyncio.Semaphore(spec.max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def gated(slot: Slot, lag_s: float) -> None:
        try:
            await one(session, slot.index, slot.due_s, lag_s)
        finally:
            gate.release()

    try:
        async for slot in scheduled_slots(offsets, count=spec.requests, duration_s=spec.duration_s, clock=clock,
                                          sleep=sleep):
            blocked_at = clock()
            await gate.acquire()
            task = asyncio.create_task(gated(slot, slot.lag_s + clock() - blocked_at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def _tick(tracker: _Tracker, on_progress: OnProgress, every_s: float) -> None:
    """Report progress every ``every_s`` seconds of real time (the injected clock only paces requests)."""
    while True:
        await asyncio.sleep(every_s)
        on_progress(tracker.reading())

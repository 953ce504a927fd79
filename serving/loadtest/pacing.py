"""Open-loop schedules: request ``i`` is due at a fixed offset from the start, however late the others left.

``fixed_offsets`` (``i / rate``), ``poisson_offsets`` (exponential gaps of mean ``1 / rate``,
seeded) and the recorded offsets of a replay all feed :func:`scheduled_slots`, which sleeps
until each slot is due on the absolute schedule, so a late start never shifts the slots after it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from exporters.errors import ConfigError

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Slot:
    """A paced request: its index, when it was due (seconds after the start) and how late it left."""

    index: int
    due_s: float
    lag_s: float


def fixed_offsets(rate: float) -> Iterator[float]:
    """0, 1/rate, 2/rate, ..."""
    return (index / rate for index in itertools.count())


def poisson_offsets(rate: float, seed: int) -> Iterator[float]:
    """Arrival times of a Poisson process of ``rate`` per second starting at 0 (the first arrival at 0)."""
    rng = random.Random(seed)  # noqa: S311 - seeded arrival times, not a secret
    due = 0.0
    while True:
        yield due
        due += rng.expovariate(rate)


async def scheduled_slots(
    offsets: Iterable[float], *, count: int | None, duration_s: float | None, clock: Clock, sleep: Sleep
) -> AsyncIterator[Slot]:
    """Yield a slot at each offset (seconds after the start), on an absolute schedule.

    A slot that is already due is yielded at once (with its lag). Stops after ``count`` slots,
    at the first slot due at or after ``duration_s``, or when the offsets run out.
    """
    start = clock()
    for index, due in enumerate(offsets):
        if count is not None and index >= count:
            return
        if duration_s is not None and due >= duration_s:
            return
        wait = start + due - clock()
        if wait > 0:
            await sleep(wait)
        yield Slot(index, due, max(0.0, clock() - start - due))


async def paced_slots(
    rate: float, *, count: int | None, duration_s: float | None, clock: Clock, sleep: Sleep
) -> AsyncIterator[Slot]:
    """Yield request slots at ``rate`` per second on an absolute schedule: slot ``i`` is due at ``i / rate``."""
    if count is None and duration_s is None:
        raise ConfigError("--requests", "a paced run must be bounded: give a request count or a duration")
    async for slot in scheduled_slots(fixed_offsets(rate), count=count, duration_s=duration_s, clock=clock,
                                      sleep=sleep):
        yield slot

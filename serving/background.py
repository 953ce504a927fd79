"""Periodic jobs on the event loop: the one wrapper of apscheduler's AsyncIOScheduler.

The readiness probe, the engine scrape and pollers, and the embedded rule engine each run through a
:class:`PeriodicJobs`: interval jobs that never overlap themselves (``max_instances=1``) and, when the
loop was too busy to start them on time, run once late instead of being skipped or piling up
(``misfire_grace_time=None``, ``coalesce=True``). Cron jobs (``serve.showback_schedule``) take a
trigger from :func:`cron_trigger`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

Job = Callable[[], Awaitable[None]]
"""A job: a coroutine function without arguments (bind any with functools.partial)."""

_EVERY_RUN_ONCE = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}

_FIELDS = ("second", "minute", "hour", "day", "month", "day_of_week")
_CRON_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WEEKDAY_NUMBER = re.compile(r"(?<![/\d])[0-7](?!\d)")
"""A weekday number, not a step (``*/2``)."""


def cron_trigger(expression: str) -> CronTrigger:
    """A crontab expression (minute hour day month weekday), or six fields with seconds first, in UTC.

    Weekday numbers are cron's (0 or 7 Sunday, 1 Monday): apscheduler 3 reads numbers from Monday = 0,
    so ``from_crontab("0 9 * * 1")`` would fire on Tuesdays; they are turned into names first.

    Raises:
        ValueError: not 5 or 6 fields, or a field apscheduler refuses.
    """
    parts = expression.split()
    if len(parts) not in (5, 6):
        raise ValueError(f"{len(parts)} fields")
    if len(parts) == 5:
        parts.insert(0, "0")
    parts[5] = _WEEKDAY_NUMBER.sub(lambda match: _CRON_WEEKDAYS[int(match.group(0))], parts[5])
    return CronTrigger(**dict(zip(_FIELDS, parts, strict=True)), timezone=UTC)


class PeriodicJobs:
    """Jobs added before :meth:`start` run on the running loop until :meth:`stop`."""

    def __init__(self) -> None:
        self._scheduler = AsyncIOScheduler()

    def every(self, seconds: float, job: Job, *, name: str) -> None:
        """Run ``job`` every ``seconds`` (the first run one interval after :meth:`start`)."""
        self._scheduler.add_job(job, "interval", seconds=seconds, id=name, **_EVERY_RUN_ONCE)

    def on(self, trigger: CronTrigger, job: Job, *, name: str) -> None:
        """Run ``job`` whenever ``trigger`` (from :func:`cron_trigger`) fires."""
        self._scheduler.add_job(job, trigger, id=name, **_EVERY_RUN_ONCE)

    def start(self) -> None:
        """Start the jobs on the running event loop (call from a coroutine)."""
        self._scheduler.start()

    def stop(self) -> None:
        """Stop the jobs; a run in progress is not waited for."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

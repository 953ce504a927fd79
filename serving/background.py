"""Periodic jobs on the event loop: the one wrapper of apscheduler's AsyncIOScheduler.

The readiness probe, the engine scrape and pollers, and the embedded rule engine each run through a
:class:`PeriodicJobs`: interval jobs that never overlap themselves (``max_instances=1``) and, when the
loop was too busy to start them on time, run once late instead of being skipped or piling up
(``misfire_grace_time=None``, ``coalesce=True``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler

Job = Callable[[], Awaitable[None]]
"""A job: a coroutine function without arguments (bind any with functools.partial)."""

_EVERY_RUN_ONCE = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}


class PeriodicJobs:
    """Jobs added before :meth:`start` run on the running loop until :meth:`stop`."""

    def __init__(self) -> None:
        self._scheduler = AsyncIOScheduler()

    def every(self, seconds: float, job: Job, *, name: str) -> None:
        """Run ``job`` every ``seconds`` (the first run one interval after :meth:`start`)."""
        self._scheduler.add_job(job, "interval", seconds=seconds, id=name, **_EVERY_RUN_ONCE)

    def start(self) -> None:
        """Start the jobs on the running event loop (call from a coroutine)."""
        self._scheduler.start()

    def stop(self) -> None:
        """Stop the jobs; a run in progress is not waited for."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)

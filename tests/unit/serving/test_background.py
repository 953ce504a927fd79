"""serving.background.PeriodicJobs: the one scheduler wrapper (readiness, engine watch, rule engine)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from serving.background import PeriodicJobs

ROOT = Path(__file__).resolve().parents[3]


async def test_a_job_runs_again_and_again_until_stopped() -> None:
    """An interval job runs on the running loop every interval, and no more once stopped."""
    runs: list[int] = []
    third = asyncio.Event()

    async def job() -> None:
        runs.append(len(runs))
        if len(runs) == 3:
            third.set()

    jobs = PeriodicJobs()
    jobs.every(0.01, job, name="count")
    jobs.start()
    await asyncio.wait_for(third.wait(), 10)
    jobs.stop()
    stopped_at = len(runs)
    await asyncio.sleep(0.05)
    assert len(runs) == stopped_at >= 3


async def test_a_slow_run_is_never_overlapped_by_the_next() -> None:
    """A run longer than the interval: the next one waits (max_instances=1), so at most one at a time."""
    running, most, done = 0, 0, asyncio.Event()

    async def slow() -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)  # five intervals
        running -= 1
        if most and not running:
            done.set()

    jobs = PeriodicJobs()
    jobs.every(0.01, slow, name="slow")
    jobs.start()
    await asyncio.wait_for(done.wait(), 10)
    await asyncio.sleep(0.1)
    jobs.stop()
    assert most == 1


async def test_stop_is_safe_before_start_and_twice() -> None:
    """Stopping jobs that never started, or stopping twice, does nothing (shutdown paths call it freely)."""
    jobs = PeriodicJobs()
    jobs.stop()
    jobs.start()
    jobs.stop()
    jobs.stop()


def test_no_other_module_builds_a_scheduler() -> None:
    """One wrapper: no package module but serving/background.py makes an apscheduler scheduler."""
    scheduler = re.compile(r"\b(?:AsyncIO|Background|Blocking)Scheduler\(")
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("serving", "exporters", "alert_rules", "dashboards", "log_pipeline")
        for path in (ROOT / package).rglob("*.py")
        if path != ROOT / "serving" / "background.py" and scheduler.search(path.read_text())
    ]
    assert offenders == []

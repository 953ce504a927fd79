"""``serve.showback_schedule``: apscheduler runs a cron job in the sidecar that writes the last period's report.

Each run writes ``serve.showback_dir/<from>_<to>/`` (report.md, report.csv, report.json and the
PNGs) from the sidecar's own ledger, covering ``serve.showback_period_days`` up to the run, in a
thread (matplotlib and file writes stay off the event loop). A run that fails is logged and the
next one runs as scheduled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import structlog
from aiohttp import web

from exporters.usage_ledger import UsageLedger
from serving.background import PeriodicJobs, cron_trigger
from serving.config import ServeConfig
from serving.showback.report import build_report, write_report

log = structlog.get_logger(__name__)


def write_scheduled_report(ledger: UsageLedger, directory: Path, period_s: float, currency: str,
                           now: float | None = None) -> Path:
    """Write the report of the period ending now into a new subdirectory of ``directory``; that subdirectory."""
    end = time.time() if now is None else now
    start = end - period_s
    stamp = "_".join(datetime.fromtimestamp(t, UTC).strftime("%Y%m%dT%H%M%SZ") for t in (start, end))
    target = directory / stamp
    document = build_report(ledger.window(start, end), start, end, currency, "sidecar ledger (scheduled)")
    write_report(document, target)
    return target


def showback_schedule_ctx(serve: ServeConfig, currency: str, ledger: UsageLedger,
                          ) -> Callable[[web.Application], AsyncIterator[None]]:
    """Cleanup context: the cron job for the app's lifetime."""

    async def run() -> None:
        try:
            target = await asyncio.to_thread(write_scheduled_report, ledger, Path(serve.showback_dir),
                                             serve.showback_period_days * 86_400, currency)
        except Exception:  # a failed report must not stop the schedule or the sidecar
            log.exception("showback_report_failed", directory=serve.showback_dir)
            return
        log.info("showback_report_written", directory=str(target))

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        jobs = PeriodicJobs()
        jobs.on(cron_trigger(serve.showback_schedule), run, name="showback")
        jobs.start()
        yield
        jobs.stop()

    return ctx

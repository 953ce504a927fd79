"""A closed-loop worker backs off exponentially with jitter after failures, and the retries are reported."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from serving.loadtest.backoff import JITTER
from serving.loadtest.capacity import SloTarget
from serving.loadtest.markdown import render
from serving.loadtest.report import ReportContext, build_document
from serving.loadtest.run import default_source, run_load
from serving.loadtest.spec import LoadSpec
from serving.loadtest.steps import RunPlan, RunResult
from serving.loadtest.table import format_report

INITIAL_MS, MAX_MS = 40.0, 200.0
FAILURES = 5


class FailingFirst:
    """An upstream that answers 503 to its first ``failures`` requests, then 200; it notes when each arrived."""

    def __init__(self, failures: int, retry_after: str | None = None) -> None:
        self.failures = failures
        self.retry_after = retry_after
        self.arrivals: list[float] = []

    async def handle(self, _request: web.Request) -> web.Response:
        """503 (with Retry-After when set) or a completion."""
        self.arrivals.append(time.monotonic())
        if len(self.arrivals) <= self.failures:
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return web.json_response({"error": {"message": "starting"}}, status=503, headers=headers)
        return web.json_response({"choices": [{"text": "ok"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})


async def _run(aiohttp_server: Any, fake: FailingFirst, requests: int) -> tuple[Any, list[float], LoadSpec]:
    app = web.Application()
    app.router.add_post("/v1/completions", fake.handle)
    server = await aiohttp_server(app)
    spec = LoadSpec(url=f"http://127.0.0.1:{server.port}", model="m", requests=requests, concurrency=1,
                    stream=False, retry_initial_ms=INITIAL_MS, retry_max_ms=MAX_MS)
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await asyncio.sleep(seconds)

    return await run_load(spec, sleep=sleep), pauses, spec


async def test_the_waits_double_from_the_initial_one_with_bounded_jitter_and_the_retries_are_counted(
    aiohttp_server: Any,
) -> None:
    """Five 503s in a row: the fake sees the requests at least 40, 80, 160, 200, 200 ms apart (doubling, capped),
    each wait drawn within +50 %; the five requests after a failure are the retries, in the table, JSON and
    report.md; after the success the next request goes at once."""
    fake = FailingFirst(FAILURES)
    report, pauses, spec = await _run(aiohttp_server, fake, FAILURES + 2)
    bases = [min(MAX_MS, INITIAL_MS * 2 ** k) / 1000 for k in range(FAILURES)]
    gaps = [later - earlier for earlier, later in zip(fake.arrivals, fake.arrivals[1:], strict=False)]
    assert len(fake.arrivals) == FAILURES + 2
    assert len(pauses) == FAILURES
    for base, pause, gap in zip(bases, pauses, gaps, strict=False):
        assert base <= pause <= base * (1 + JITTER), (base, pause)
        assert gap >= base, (base, gap)  # what the upstream saw
    assert [r.retry for r in report.results] == [0, 1, 2, 3, 4, 5, 0]
    assert report.retries == FAILURES
    assert report.to_dict()["retries"] == FAILURES
    assert f"; {FAILURES} retries after a failure" in format_report(spec, report)
    document = build_document(RunResult(RunPlan((spec,), ("concurrency 1",), default_source(spec)), [report]),
                              ReportContext(SloTarget(1.0, 0.5)))
    assert document["totals"]["retries"] == FAILURES
    assert f"({FAILURES} of them retries" in render(document)
    assert f"| concurrency 1 | concurrency 1 | {FAILURES + 2} | 2 | {FAILURES} | {FAILURES} |" in render(document)


async def test_a_retry_after_longer_than_the_backoff_is_waited_out(aiohttp_server: Any) -> None:
    """A 503 with Retry-After: 1 makes the worker wait at least 1 s, more than its 40 ms backoff."""
    fake = FailingFirst(1, retry_after="1")
    report, pauses, _ = await _run(aiohttp_server, fake, 2)
    assert pauses == [1.0]
    assert fake.arrivals[1] - fake.arrivals[0] >= 1.0
    assert report.results[0].retry_after_s == 1.0
    assert report.retries == 1

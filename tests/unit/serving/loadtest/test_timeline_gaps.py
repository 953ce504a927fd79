"""While the engine cannot be read the load-test timeline has a gap, not a flat line."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp
from aiohttp import web

from exporters.catalog import engine as ce
from serving.loadtest import timeline as tl
from serving.loadtest.plots import increase, with_gaps

LIVE = (f"# TYPE {ce.ENGINE_REQUESTS.name} gauge\n"
        f'{ce.ENGINE_REQUESTS.series}{{model_name="m",state="running"}} 2\n'
        f"# TYPE {ce.KV_USAGE.name} gauge\n"
        f'{ce.KV_USAGE.series}{{model_name="m"}} 0.84\n')
STALE = (f"# TYPE {ce.SCRAPE_STALE.name} gauge\n"
         f'{ce.SCRAPE_STALE.series}{{upstream="http://vllm"}} 1\n')
"""The sidecar's /metrics while its engine series are stale: only its own series."""


async def test_a_failed_scrape_and_stale_engine_series_are_missing_values(aiohttp_server: Any) -> None:
    """Live, stale (engine series absent), unreachable (503), live again: the timeline holds 2, None, None, 2."""
    answers = iter([(200, LIVE), (200, STALE), (503, "down"), (200, LIVE)])

    async def metrics(_request: web.Request) -> web.Response:
        status, text = next(answers, (200, LIVE))
        return web.Response(status=status, text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await aiohttp_server(app)
    timeline = tl.Timeline(f"http://127.0.0.1:{server.port}/metrics", 0.02)
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(tl.record(timeline, session, origin=time.monotonic(), clock=time.monotonic,
                                             sleep=asyncio.sleep))
        while len(timeline.samples) < 4 and not task.done():
            await asyncio.sleep(0.01)
        task.cancel()
    samples = timeline.samples[:4]
    assert [s.reading.running for s in samples] == [2.0, None, None, 2.0]
    assert [s.reading.kv_usage for s in samples] == [0.84, None, None, 0.84]
    assert timeline.failures == 1
    assert [s.t_s for s in samples] == sorted(s.t_s for s in samples)


def test_missing_values_become_breaks_in_the_plotted_lines() -> None:
    """None is plotted as NaN (matplotlib leaves the segment out); a counter's increase skips the gap."""
    plotted = with_gaps([2.0, None, 2.0])
    assert plotted[0] == plotted[2] == 2.0
    assert math.isnan(plotted[1])
    assert increase([(0.0, 5.0), (1.0, None), (2.0, 1.0), (3.0, 3.0)]) == [(0.0, 0.0), (1.0, None), (2.0, 1.0),
                                                                            (3.0, 3.0)]

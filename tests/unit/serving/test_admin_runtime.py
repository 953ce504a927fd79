"""GET /admin/runtime: the sidecar's task, fd, memory and in-flight counts, for loopback clients only."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from serving import config as cfg
from serving.app import PROXY, build_app
from serving.endpoints import json_errors
from tests.fakes.faulty_upstream import FaultyUpstream, ThreadedServer
from tests.unit.serving.inprocess import READ_TIMEOUT_S, open_fds, send, start_sidecar, wait_for

FIELDS = {"asyncio_tasks", "open_fds", "rss_bytes", "active_requests"}


@pytest.fixture(name="upstream", scope="module")
def _upstream() -> Iterator[ThreadedServer]:
    with ThreadedServer(FaultyUpstream(record=False).app) as server:
        yield server


async def test_runtime_counts_the_process_and_the_requests_in_flight(upstream: ThreadedServer, tmp_path: Path) -> None:
    """The four counts are integers of this process; active_requests follows a request that is in flight."""
    sidecar, runner = await start_sidecar(upstream.url, tmp_path / "logs")

    async def read() -> dict[str, int]:
        async with sidecar.session.get(sidecar.url + "/admin/runtime") as response:
            assert response.status == 200
            assert response.headers["Cache-Control"] == "no-store"
            return await response.json()

    try:
        idle = await read()
        assert set(idle) == FIELDS
        assert all(isinstance(value, int) for value in idle.values())
        assert idle["active_requests"] == 0
        assert idle["asyncio_tasks"] >= 1  # at least the handler answering
        assert idle["rss_bytes"] > 0
        assert abs(idle["open_fds"] - open_fds()) <= 2  # the sidecar runs in the test's process
        silent = asyncio.create_task(send(sidecar, "silent_before_status", stream=False))
        busy = 0
        for _ in range(40):  # the silent request stays in flight for READ_TIMEOUT_S
            busy = (await read())["active_requests"]
            if busy:
                break
            await asyncio.sleep(READ_TIMEOUT_S / 40)
        assert busy == 1
        assert (await silent).status == 504
        assert (await read())["active_requests"] == 0
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_runtime_is_guarded_like_every_admin_endpoint() -> None:
    """A non-loopback client without the admin token is refused by the app's admin guard."""
    app = build_app(cfg.defaults())
    remote = make_mocked_request("GET", "/admin/runtime", app=app).clone(remote="192.0.2.7")
    match = await app.router.resolve(remote)
    assert match.http_exception is None  # the route exists
    (guard,) = match.apps[-1].middlewares  # the /admin sub-application's own middleware
    assert list(app.middlewares) == [json_errors]  # the proxied requests pass no admin middleware

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(text="reached")

    assert (await guard(remote, handler)).status == 403


async def test_requests_in_flight_gauge_follows_a_request(upstream: ThreadedServer, tmp_path: Path) -> None:
    """inferwatch_requests_in_flight reads 1 for the model and route while a request waits upstream, 0 after."""
    sidecar, runner = await start_sidecar(upstream.url, tmp_path / "logs")
    proxy = sidecar.app[PROXY]
    proxy.learn_models(["fake-model"])
    labels = {"model_name": "fake-model", "route": "/v1/completions"}

    def gauge() -> float | None:
        return sidecar.registry.get_sample_value("inferwatch_requests_in_flight", labels)

    try:
        assert not gauge()  # absent, or zero once the upstream's models were read
        silent = asyncio.create_task(send(sidecar, "silent_before_status", stream=False))
        assert await wait_for(lambda: gauge() == 1.0, READ_TIMEOUT_S)
        assert (await silent).status == 504
        assert gauge() == 0.0
        other = {"model_name": "other", "route": "/v1/completions"}  # a model the upstream never named
        await send(sidecar, None, stream=True, model="not-served")
        assert sidecar.registry.get_sample_value("inferwatch_requests_in_flight", other) == 0.0
    finally:
        await sidecar.session.close()
        await runner.cleanup()

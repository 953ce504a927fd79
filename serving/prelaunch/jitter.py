"""A delaying HTTP proxy: every request waits a random 300 ms-5 s (configurable) before it goes on.

It stands between the load and the target for the checklist's network-jitter line, so the client's timeouts
and retries meet the delays a bad network gives. The delay is drawn per request (seeded), applied before the
request is forwarded; the answer, streamed or not, is relayed as it comes.
"""

from __future__ import annotations

import asyncio
import random
from types import TracebackType

import aiohttp
from aiohttp import web

SHUTDOWN_S = 2.0
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"})


class JitterProxy:
    """``async with JitterProxy(target, 0.3, 5.0) as proxy``: ``proxy.url`` delays each request to ``target``."""

    def __init__(self, target: str, min_s: float, max_s: float, *, seed: int = 0) -> None:
        if not 0 <= min_s <= max_s:
            raise ValueError(f"jitter bounds {min_s:g}-{max_s:g} s: need 0 <= min <= max")
        self.target = target.rstrip("/")
        self.min_s, self.max_s = min_s, max_s
        self.delays_s: list[float] = []
        self.url = ""
        self._random = random.Random(seed)  # noqa: S311 - a delay, not a secret
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> JitterProxy:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        # Requests the client gave up on are still being delayed: a short grace, not aiohttp's minute, at the end.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        delay = self._random.uniform(self.min_s, self.max_s)
        self.delays_s.append(delay)
        await asyncio.sleep(delay)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        try:
            async with self._session.request(request.method, self.target + request.path_qs, headers=headers,
                                             data=await request.read()) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as err:
            return web.json_response({"error": {"message": f"jitter proxy: {err}"}}, status=502)


__all__ = ["JitterProxy"]

"""Polls Ollama's ``/api/tags`` and ``/api/ps`` every ``scrape.interval_s`` once the engine is Ollama, for the
model gauges of exporters/ollama_models.py (Ollama has no ``/metrics``). A failed poll sets
``inferwatch_ollama_poll_up`` to 0 and keeps the last good lists; nothing here raises into the sidecar."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from exporters.ollama_models import OllamaCollector, OllamaModels, parse_models
from serving.bounded_read import read_at_most

log = structlog.get_logger(__name__)
MAX_BYTES = 4 * 1024 * 1024


class OllamaWatch:
    """The latest :class:`OllamaModels` and the poll that refreshes it."""

    def __init__(self, upstream: str, session: Callable[[], aiohttp.ClientSession], timeout_s: float) -> None:
        self.upstream = upstream.rstrip("/")
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.latest: OllamaModels | None = None

    async def _get(self, path: str) -> Any:
        async with self._session().get(self.upstream + path, timeout=self._timeout) as response:
            if response.status != 200:
                raise ValueError(f"{path} answered {response.status}")
            return orjson.loads(await read_at_most(response.content, MAX_BYTES))

    async def poll(self) -> None:
        """One poll of both endpoints."""
        try:
            self.latest = parse_models(self.upstream, await self._get("/api/tags"), await self._get("/api/ps"))
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            log.debug("ollama_poll_failed", upstream=self.upstream, error=str(err))
            previous = self.latest or OllamaModels(self.upstream, False)
            self.latest = replace(previous, ok=False)


def ollama_watch_ctx(
    is_ollama: Callable[[], bool], upstream: str, session: Callable[[], aiohttp.ClientSession],
    registry: CollectorRegistry, interval_s: float, timeout_s: float,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp ``cleanup_ctx``: the collector, and a poll every ``interval_s`` while the engine is Ollama."""

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        watch = OllamaWatch(upstream, session, timeout_s)
        registry.register(OllamaCollector(lambda: watch.latest))

        async def loop() -> None:
            while True:
                if is_ollama():
                    try:
                        await watch.poll()
                    except Exception:  # a background job never takes the sidecar down
                        log.exception("ollama_poll_crashed")
                await asyncio.sleep(interval_s)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx

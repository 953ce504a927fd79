"""The sidecar's own endpoints: ``/metrics``, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder


def metrics_handler(registry: CollectorRegistry) -> web.Handler:
    """Prometheus text by default, OpenMetrics (with exemplars) when the scraper asks for it."""

    async def handle(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        # Rendering is CPU-only and fast (a few ms); it reads snapshots, never does I/O.
        body = encoder(registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    return handle


async def healthz(_request: web.Request) -> web.Response:
    """The process is alive and serving."""
    return web.json_response({"status": "ok"})


class Readiness:
    """Probes the upstream's health endpoint; ``/readyz`` answers from a fresh probe."""

    def __init__(
        self, upstream: str, path: str, session: object, timeout_s: float = 2.0, *,
        on_result: Callable[[bool], None] | None = None, details: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """``on_result`` hears every probe's outcome; ``details`` adds to ``/readyz``'s JSON (cold starts)."""
        self.url = upstream.rstrip("/") + path
        self._on_result = on_result
        self._details = details
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.last_ok: bool | None = None
        self.last_error: str | None = None
        self.last_probe_unix: float | None = None
        self.lost = False
        """The last probe that got an outcome found the upstream not ready: it answered other than 200, or
        nothing listened. A probe that timed out leaves this as it was: a busy engine can be slow to answer."""

    async def probe(self) -> bool:
        """GET the upstream health URL once; remember and return whether it answered 200."""
        try:
            async with self._session().get(self.url, timeout=self._timeout) as response:  # type: ignore[operator]
                ok = response.status == 200
                self.last_error = None if ok else f"upstream answered {response.status}"
            self.lost = not ok
        except TimeoutError as err:
            ok, self.last_error = False, f"upstream unreachable: {err.__class__.__name__}: {err}"
        except aiohttp.ClientError as err:
            ok, self.last_error, self.lost = False, f"upstream unreachable: {err.__class__.__name__}: {err}", True
        self.last_ok, self.last_probe_unix = ok, time.time()
        if self._on_result is not None:
            self._on_result(ok)
        return ok

    async def handle(self, _request: web.Request) -> web.Response:
        """200 when the upstream is reachable and ready, else 503 with the reason."""
        ok = await self.probe()
        body: dict[str, Any] = {"status": "ready" if ok else "not_ready", "upstream": self.url}
        if not ok:
            body["reason"] = self.last_error or "unknown"
        if self._details is not None:
            body.update(self._details())
        return web.json_response(body, status=200 if ok else 503)

"""The sidecar's own endpoints: ``/metrics``, ``/healthz`` and ``/readyz``, and its own error answers.

Outside the proxied ``/v1/*`` a refusal or an unknown path gets the proxy's error shape too
(serving/errors.py): ``{"error": {"message", "type", "code", "trace_id"}}`` with the ``x-trace-id``
header, never aiohttp's plain-text page.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from serving.errors import error_body
from serving.tracing import TRACE_HEADER, request_trace_id

_KINDS = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          413: "request_too_large"}


def error_response(
    request: web.BaseRequest, status: int, message: str, kind: str | None = None,
    headers: dict[str, str] | None = None, fields: dict[str, Any] | None = None,
) -> web.Response:
    """The sidecar's own JSON error answer to a request outside the proxy, with its trace id (and ``fields``
    beside the message)."""
    trace_id = request_trace_id(request.headers.get("traceparent"))
    body = error_body(message, kind or _KINDS.get(status, "invalid_request_error"), status, trace_id=trace_id,
                      **(fields or {}))
    return web.Response(body=body, status=status, content_type="application/json",
                        headers={TRACE_HEADER: trace_id, "Cache-Control": "no-store", **(headers or {})})


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own error answers (no such path, method not allowed, body too large) in the JSON shape."""
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        allowed = getattr(err, "allowed_methods", None)
        headers = {"Allow": ",".join(sorted(allowed))} if allowed else None
        message = f"{request.method} {request.path}: {err.reason}"
        return error_response(request, err.status, message, headers=headers)


def metrics_handler(registry: CollectorRegistry) -> Handler:
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
        self, upstream: str, path: str, session: Callable[[], aiohttp.ClientSession], timeout_s: float = 2.0, *,
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
        lost = self.lost
        try:
            async with self._session().get(self.url, timeout=self._timeout) as response:
                ok = response.status == 200
                self.last_error = None if ok else f"upstream answered {response.status}"
            lost = not ok
        except TimeoutError as err:
            ok, self.last_error = False, f"upstream unreachable: {err.__class__.__name__}: {err}"
        except aiohttp.ClientError as err:
            ok, self.last_error, lost = False, f"upstream unreachable: {err.__class__.__name__}: {err}", True
        # no await from here to on_result: /metrics never sees lost and the ready gauge disagree
        self.last_ok, self.last_probe_unix, self.lost = ok, time.time(), lost
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

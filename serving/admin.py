"""The admin endpoints (``/admin/*``): on loopback only, or with the configured bearer token.

Everything the sidecar serves besides the proxied API, ``/metrics``, ``/healthz`` and ``/readyz``
lives in the ``/admin/`` sub-application (so the proxied requests never pass its middleware) and
passes :func:`admin_guard`: a client on a loopback address is let in;
any other needs ``Authorization: Bearer <token>`` with the token read from
``serve.admin_token_file`` (compared in constant time): without it or with a wrong one, 401
(``unauthorized``, with ``WWW-Authenticate``). Without a token file no credential helps, so
non-loopback clients get 403 (``forbidden``). Both are the sidecar's JSON error with a ``trace_id``.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from collections.abc import Awaitable, Callable

import psutil
from aiohttp import web
from aiohttp.typedefs import Middleware

from serving.endpoints import error_response
from serving.proxy import Proxy
from serving.rule_engine import RULE_RUNNER
from serving.signing import read_secret_file
from serving.workers import from_unix_socket

ADMIN_PREFIX = "/admin/"
ADMIN_MOUNT = "/admin"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_admin_token(path: str) -> bytes | None:
    """The bearer token in ``path`` (whitespace stripped); None when no file is configured.

    Raises:
        ConfigError: the file cannot be read or holds fewer than ``MIN_KEY_BYTES`` bytes.
    """
    return read_secret_file(path, "serve.admin_token_file", "token") if path else None


def _is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote.split("%")[0]).is_loopback
    except ValueError:
        return False


def admin_guard(token: bytes | None) -> Middleware:
    """An aiohttp middleware refusing ``/admin/*`` to non-loopback clients without the bearer token."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(ADMIN_PREFIX) or _is_loopback(request.remote) or from_unix_socket(request):
            # the primary's private socket: a secondary of `serve --workers` that checked the client itself
            return await handler(request)
        offered = request.headers.get("Authorization", "")
        scheme, _, value = offered.partition(" ")
        if token is not None and scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token):
            return await handler(request)
        if token is None:  # no credential can let a remote client in: refused, not unauthenticated
            return error_response(request, 403, "admin endpoints answer loopback clients only "
                                  "(no serve.admin_token_file)", "forbidden")
        problem = "a wrong bearer token" if offered else "no 'Authorization: Bearer <serve.admin_token_file>'"
        return error_response(request, 401, f"admin endpoints: {problem}", "unauthorized",
                              headers={"WWW-Authenticate": 'Bearer realm="inferwatch admin"'})

    return guard


async def alerts(request: web.Request) -> web.Response:
    """The embedded rule engine's alerts (pending, firing, recently resolved) with their labels."""
    runner = request.config_dict.get(RULE_RUNNER)
    body = {"enabled": runner is not None, "alerts": list(runner.alert_snapshot) if runner is not None else []}
    return web.json_response(body, headers={"Cache-Control": "no-store"})


def runtime_handler(proxy: Proxy) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``/admin/runtime``: the sidecar process's own counts, for leak checks."""

    async def runtime(_request: web.Request) -> web.Response:
        process = psutil.Process()
        body = {
            "asyncio_tasks": len(asyncio.all_tasks()),
            "open_fds": process.num_fds(),
            "rss_bytes": process.memory_info().rss,
            "active_requests": proxy.active,
        }
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    return runtime


def admin_app(token: bytes | None, proxy: Proxy) -> web.Application:
    """The ``/admin/`` sub-application, guarded by :func:`admin_guard`; mount it with ``add_subapp``."""
    app = web.Application(middlewares=[admin_guard(token)])
    app.router.add_get("/alerts", alerts)
    app.router.add_get("/runtime", runtime_handler(proxy))
    return app

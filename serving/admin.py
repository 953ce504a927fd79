"""The admin endpoints (``/admin/*``): on loopback only, or with the configured bearer token.

Everything the sidecar serves besides the proxied API, ``/metrics``, ``/healthz`` and ``/readyz``
lives under ``/admin/`` and passes :func:`admin_guard`: a client on a loopback address is let in;
any other needs ``Authorization: Bearer <token>`` with the token read from
``serve.admin_token_file`` (compared in constant time). Without a token file, non-loopback
clients get 403.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from exporters.errors import ConfigError
from serving.errors import error_body
from serving.rule_engine import RULE_RUNNER

ADMIN_PREFIX = "/admin/"
MIN_TOKEN_BYTES = 16

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def load_admin_token(path: str) -> bytes | None:
    """The bearer token in ``path`` (whitespace stripped); None when no file is configured.

    Raises:
        ConfigError: the file cannot be read or holds fewer than ``MIN_TOKEN_BYTES`` bytes.
    """
    if not path:
        return None
    try:
        token = Path(path).read_bytes().strip()
    except OSError as err:
        raise ConfigError("serve.admin_token_file", f"cannot read the token file: {err.strerror}", path) from err
    if len(token) < MIN_TOKEN_BYTES:
        raise ConfigError("serve.admin_token_file", f"the token must be at least {MIN_TOKEN_BYTES} bytes", path)
    return token


def _is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote.split("%")[0]).is_loopback
    except ValueError:
        return False


def admin_guard(token: bytes | None) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """An aiohttp middleware refusing ``/admin/*`` to non-loopback clients without the bearer token."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith(ADMIN_PREFIX) or _is_loopback(request.remote):
            return await handler(request)
        offered = request.headers.get("Authorization", "")
        scheme, _, value = offered.partition(" ")
        if token is not None and scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token):
            return await handler(request)
        status, message = (401, "admin endpoints need 'Authorization: Bearer <serve.admin_token_file>'") \
            if token is not None else (403, "admin endpoints answer loopback clients only (no serve.admin_token_file)")
        return web.Response(body=error_body(message, "forbidden", status), status=status,
                            content_type="application/json", headers={"Cache-Control": "no-store"})

    return guard


async def alerts(request: web.Request) -> web.Response:
    """The embedded rule engine's alerts (pending, firing, recently resolved) with their labels."""
    runner = request.app.get(RULE_RUNNER)
    body = {"enabled": runner is not None, "alerts": list(runner.alert_snapshot) if runner is not None else []}
    return web.json_response(body, headers={"Cache-Control": "no-store"})


def add_admin_routes(app: web.Application) -> None:
    """Register the admin endpoints (guarded by :func:`admin_guard` installed as middleware)."""
    app.router.add_get(ADMIN_PREFIX + "alerts", alerts)

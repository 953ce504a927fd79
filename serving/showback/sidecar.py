"""The sidecar's usage endpoint, ``GET /admin/usage?from=UNIX&to=UNIX``: its ledger's rows for a window."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web

from exporters.usage_ledger import Key, Usage, UsageLedger
from serving.errors import error_body

USAGE_PATH = "/usage"
"""Under the admin mount: ``/admin/usage``."""
SCHEMA = "inferwatch.usage/1"


def rows_to_json(rows: dict[Key, Usage]) -> list[dict[str, Any]]:
    """The rows as JSON objects: tenant, model, pool and the usage figures."""
    return [{"tenant": tenant, "model": model, "pool": pool, **asdict(usage)}
            for (tenant, model, pool), usage in sorted(rows.items())]


def rows_from_json(items: list[dict[str, Any]]) -> dict[Key, Usage]:
    """The inverse of :func:`rows_to_json`.

    Raises:
        ValueError: an item is not a usage row.
    """
    rows: dict[Key, Usage] = {}
    for item in items:
        try:
            key = (str(item["tenant"]), str(item["model"]), str(item["pool"]))
            figures = {name: item[name] for name in Usage.__slots__}
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a usage row: {item!r:.200}") from err
        rows[key] = Usage(**figures)
    return rows


def usage_handler(ledger: UsageLedger, currency: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler answering the ledger's rows of ``[from, to)`` (Unix seconds)."""

    async def handle(request: web.Request) -> web.Response:
        try:
            start, end = float(request.query["from"]), float(request.query["to"])
        except (KeyError, ValueError):
            return web.Response(status=400, content_type="application/json", body=error_body(
                "expected ?from=UNIX_SECONDS&to=UNIX_SECONDS", "invalid_request_error", 400))
        return web.json_response({"schema": SCHEMA, "from": start, "to": end, "currency": currency,
                                  "bucket_s": ledger.bucket_s, "rows": rows_to_json(ledger.window(start, end))})

    return handle

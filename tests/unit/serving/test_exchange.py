"""AiohttpExchange: the proxy's view of a /v1 request that reached aiohttp's server (a handed-over connection)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from serving.exchange import AiohttpExchange, BodyTooLargeError


async def test_the_body_limit_is_the_callers_even_under_a_larger_application_limit(aiohttp_client: Any) -> None:
    async def handler(request: web.Request) -> web.Response:
        exchange = AiohttpExchange(request)
        try:
            body = await exchange.read_body(10, 1.0)
        except BodyTooLargeError:
            return web.Response(status=413)
        exchange.respond(200, {"X-Length": str(len(body))}, body)
        assert exchange.response is not None
        return exchange.response  # type: ignore[return-value]

    app = web.Application(client_max_size=1000)
    app.router.add_post("/v1/x", handler)
    client = await aiohttp_client(app)
    assert (await client.post("/v1/x", data=b"0123456789")).headers["X-Length"] == "10"
    assert (await client.post("/v1/x", data=b"0123456789a")).status == 413
    assert (await client.post("/v1/x", data=b"x" * 2000)).status == 413  # the application's own limit

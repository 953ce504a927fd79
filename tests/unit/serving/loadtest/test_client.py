"""The load test's client against an in-process aiohttp server."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from serving.loadtest.client import send_request

ERROR = b'{"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "code": 404}}'


async def _error_in_two_pieces(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=404, headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(ERROR[:20])
    await asyncio.sleep(0.2)
    await response.write(ERROR[20:])
    await response.write_eof()
    return response


async def test_an_error_answer_that_arrives_in_pieces_gives_its_whole_message(aiohttp_server: Any) -> None:
    """The error detail is the JSON error's message, not the raw start of what had come when it was read."""
    app = web.Application()
    app.router.add_post("/v1/completions", _error_in_two_pieces)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        result = await send_request(session, f"http://127.0.0.1:{server.port}/v1/completions",
                                    {"model": "nope", "prompt": "hi"}, timeout_s=5.0)
    assert (result.status, result.error) == (404, "404")
    assert result.detail == "The model `nope` does not exist."

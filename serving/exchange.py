"""One HTTP request and its answer, as the proxy sees them, whichever server took the request.

The proxy (serving/proxy.py) reads the request and answers it through :class:`Exchange`. Two
servers provide one: the front (serving/front.py), a protocol-level HTTP/1.1 server that takes
``/v1/*`` on the listen port, and aiohttp's server through :class:`AiohttpExchange`, for a
``/v1/*`` request on a connection the front handed to aiohttp (its first request was for
another path) and for an application served by aiohttp alone (tests, embedding).

A streamed answer is written by the stream relay (serving/stream_relay.py) straight to the
client's transport; :class:`ClientStream` is what it needs for that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter


class BodyTooLargeError(Exception):
    """The request's body is larger than the limit it was read with."""


class ClientStream(Protocol):
    """A streamed answer whose head went out: the client's transport and its flow control."""

    transport: asyncio.Transport | None
    chunked: bool
    """Each piece must go out as one HTTP/1.1 chunk (else unframed: an HTTP/1.0 client, ended by the close)."""

    @property
    def writing_paused(self) -> bool:
        """The client's socket is full: wait in :meth:`drain` before writing more."""

    async def drain(self) -> None:
        """Wait until the client's socket takes more."""

    async def finish(self, last: bytes) -> None:
        """Write ``last`` (an error event, or nothing) and the end of the body; a gone client is fine."""


class Exchange(Protocol):
    """A request being answered: what the proxy reads of it and the two ways it answers."""

    method: str
    path: str
    """The decoded path, without the query string."""
    path_qs: str
    """The path and query string, as forwarded upstream."""
    raw_path: str
    """The target exactly as the client sent it (what an HMAC signature covers)."""
    content_length: int | None

    @property
    def headers(self) -> Mapping[str, str]:
        """Case-insensitive."""

    @property
    def client_address(self) -> str:
        """The client's IP address (its connection's peer), empty when unknown."""

    async def read_body(self, max_bytes: int, timeout_s: float) -> bytes:
        """The whole body.

        Raises:
            BodyTooLargeError: it is larger than ``max_bytes``.
            TimeoutError: it did not arrive within ``timeout_s``.
        """

    def respond(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """Answer with a whole body (its length is added here)."""

    async def start_stream(self, status: int, headers: dict[str, str]) -> ClientStream:
        """Send the head of a streamed answer; the body follows through the returned stream."""


class AiohttpStream:
    """:class:`ClientStream` of a prepared aiohttp response."""

    def __init__(self, request: web.Request, response: web.StreamResponse, writer: AbstractStreamWriter) -> None:
        self._protocol = request.protocol
        self._response = response
        self._writer = writer
        self.transport: asyncio.Transport | None = request.transport
        self.chunked = response.headers.get("Transfer-Encoding") == "chunked"  # as aiohttp chose in prepare()

    @property
    def writing_paused(self) -> bool:
        return self._protocol is not None and self._protocol.writing_paused

    async def drain(self) -> None:
        await self._writer.drain()

    async def finish(self, last: bytes) -> None:
        try:
            if last:
                await self._response.write(last)
            await self._response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass


class AiohttpExchange:
    """:class:`Exchange` over an aiohttp request; the handler returns :attr:`response` when the proxy is done."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.method = request.method
        self.path = request.path
        self.path_qs = request.path_qs
        self.raw_path = request.raw_path
        self.headers: Mapping[str, str] = request.headers
        self.content_length = request.content_length
        self.response: web.StreamResponse | None = None

    @property
    def client_address(self) -> str:
        return self._request.remote or ""

    async def read_body(self, max_bytes: int, timeout_s: float) -> bytes:
        request = self._request
        try:
            if request.content.is_eof():  # the body came with the headers (most requests): no timer needed
                body = await request.read()
            else:
                async with asyncio.timeout(timeout_s):
                    body = await request.read()
        except web.HTTPRequestEntityTooLarge:  # the application's client_max_size
            raise BodyTooLargeError from None
        if len(body) > max_bytes:
            raise BodyTooLargeError
        return body

    def respond(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.response = web.Response(body=body, status=status, headers=headers)

    async def start_stream(self, status: int, headers: dict[str, str]) -> ClientStream:
        response = self.response = web.StreamResponse(status=status, headers=headers)
        writer = await response.prepare(self._request)
        assert writer is not None
        return AiohttpStream(self._request, response, writer)


async def aiohttp_handler(handle: ProxyHandler, request: web.Request) -> web.StreamResponse:
    """Run ``handle`` on an aiohttp request and return the answer it made."""
    exchange = AiohttpExchange(request)
    await handle(exchange)
    assert exchange.response is not None, "the proxy answers every request"
    return exchange.response


class ProxyHandler(Protocol):
    """What answers an exchange: :meth:`serving.proxy.Proxy.handle`."""

    async def __call__(self, exchange: Exchange, /) -> None: ...

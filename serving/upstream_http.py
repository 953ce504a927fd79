"""The proxy's HTTP/1.1 client to its upstream: keep-alive connections on asyncio protocols.

Why not aiohttp's client, which the rest of the sidecar uses for its own calls: on the request
path it cost about 225 µs of CPU per request on the 2-core bench machine, as much as the whole
Rust router in front of the same upstream (BENCHMARKS.md, "Proxy cost against peers"). This
module does only what the proxy needs and nothing else: one upstream, one request at a time on
each connection with its whole body at once, the answer parsed by httptools (llhttp, the parser
of Node.js and uvicorn), and the connection reused when the answer is complete.

Between :meth:`UpstreamPool.request` and :meth:`UpstreamConnection.release` (or ``close``) a
connection *is* the answer: ``status``, ``headers``, then ``read_body`` (the whole body) or ``relay``
(the body handed on piece by piece from the socket's own callback: no task switch per piece).
Failures are :class:`UpstreamError` subclasses, so the proxy can name each to its client:

- :class:`ConnectTimeoutError`, :class:`UnreachableError`: no connection;
- :class:`ReadTimeoutError`: the upstream stayed silent for the read timeout;
- :class:`DisconnectedError`: the connection ended (or the answer was not HTTP) before the answer did.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import zlib
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from exporters.configuring import http_url

KEEP_ALIVE_S = 4.0
"""An idle connection older than this is closed instead of reused: vLLM's server (uvicorn) closes its
own at 5 s, and a request written into a connection the server is closing would fail for nothing."""
HIGH_WATER_BYTES = 1 << 20
"""Answer bytes buffered and not yet taken at which the socket stops being read (a slow client)."""
_DEFAULT_PORTS = {"http": 80, "https": 443}
_CHUNK_SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,8})\r\n")
"""An HTTP/1.1 chunk's size line without extensions, as uvicorn (vLLM's server) and most servers write it."""
_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


class UpstreamError(Exception):
    """The upstream did not give a complete answer."""


class ConnectTimeoutError(UpstreamError):
    """The upstream did not accept a connection within the connect timeout."""


class UnreachableError(UpstreamError):
    """The upstream refused the connection, or its name or address could not be reached."""


class ReadTimeoutError(UpstreamError):
    """The upstream stayed silent for the read timeout."""


class DisconnectedError(UpstreamError):
    """The connection ended, or the answer was not well-formed HTTP, before the answer was complete."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to the upstream; while a request is out, it is that request's answer."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._head: asyncio.Future[None] | None = None  # set when the status line and headers are in
        self._waiter: asyncio.Future[None] | None = None  # set when more of the body came, or the end
        self._sink: Callable[[bytes], bool] | None = None  # relay(): takes the body as it comes
        self._whole_chunk_sink: Callable[[bytes, int, int], bool | None] | None = None  # see take_whole_chunks
        self._at_chunk_start = False  # the parser stands between two chunks of a chunked, uncompressed body
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._header_list: list[tuple[str, str]] = []
        self._decoder: zlib._Decompress | None = None
        self._head_only = False
        self._interim = False
        self._until_eof = False
        self._complete = False
        self._keep_alive = False
        self._error: UpstreamError | None = None
        self.closed = False
        self.status = 0
        self.headers = _NO_HEADERS
        self.bytes_received = 0
        """Every byte read from the socket so far: moves whenever the upstream speaks (the stall watch)."""
        self.idle_since = 0.0
        self.connect_ns = 0
        """How long opening this connection took, for the request that opened it (0 for one reusing it)."""
        self.sent_ns = 0
        """When the current request was written (``time.perf_counter_ns``)."""

    # -- the request's side ------------------------------------------------------------------------

    def start(self, request: bytes, *, head_only: bool) -> None:
        """Send ``request`` (head and body, one write) and expect its answer."""
        self._head = asyncio.get_running_loop().create_future()
        self._chunks, self._buffered, self._header_list = [], 0, []
        self._decoder, self._interim, self._until_eof, self._complete = None, False, False, False
        self._whole_chunk_sink, self._at_chunk_start = None, False
        self._head_only, self._keep_alive, self.status, self.headers = head_only, False, 0, _NO_HEADERS
        assert self._transport is not None
        self.sent_ns = time.perf_counter_ns()
        self._transport.write(request)

    async def wait_head(self, timeout_s: float) -> None:
        """Wait for the status line and headers; raises the connection's failure or :class:`ReadTimeoutError`."""
        assert self._head is not None
        # A plain timer, not asyncio.timeout(): that costs a few µs more per request, and the error is ours
        timer = asyncio.get_running_loop().call_later(timeout_s, self._head_timed_out, timeout_s)
        try:
            await self._head
        finally:
            timer.cancel()
        if self._error is not None:
            raise self._error

    def _head_timed_out(self, timeout_s: float) -> None:
        if self._head is not None and not self._head.done():
            self.abort(ReadTimeoutError(f"no status line within {timeout_s:g} s"))

    async def read_body(self, timeout_s: float) -> bytes:
        """The whole body; ``timeout_s`` is the longest silence allowed between two pieces of it."""
        pieces: list[bytes] = []
        while not self._complete:
            if self._error is not None:
                raise self._error
            if self._chunks:  # taken as they come, so a large body never pauses the socket for good
                pieces.append(self._take())
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._waiter
            except TimeoutError:
                self.abort(ReadTimeoutError(f"silent for {timeout_s:g} s in the middle of the body"))
        if self._error is not None:
            raise self._error
        pieces.append(self._take())
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def relay(self, sink: Callable[[bytes], bool]) -> bool:
        """Hand the body to ``sink`` as it arrives, called from the socket's callback, once per socket read.

        Each call gets everything that came since the last one (what was buffered first), without
        waking the calling task: a paced stream (one event per read) costs a future, a task switch
        and the awaits up the caller's stack less per piece. ``sink`` must not raise; it returns
        False to stop taking (the caller has something to do, such as waiting for its own client
        to drain; the socket pauses at ``HIGH_WATER_BYTES`` meanwhile). Returns True at the end of
        the answer, False when ``sink`` stopped it; raises the connection's failure after the
        pieces that came before it. Silence is not watched here: the proxy's stall watch calls
        :meth:`abort` (one timer per stream, not one per read).
        """
        if self._chunks and not sink(self._take()):
            return False
        while not self.finished:
            self._sink = sink
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                stopped, self._sink = self._sink is None, None
            if stopped:
                return False
        if self._chunks and not sink(self._take()):  # what the last read brought with a failure or the end
            return False
        if self._error is not None:
            raise self._error
        return True

    def take_whole_chunks(self, sink: Callable[[bytes, int, int], bool | None]) -> None:
        """While :meth:`relay` hands the body on, offer ``sink`` first each socket read that is exactly one HTTP chunk.

        ``sink(data, start, end)`` gets the read as it came, ``<size>\\r\\n<data>\\r\\n``, with the chunk's
        data at ``data[start:end]``; it returns None to decline (the read then goes through the parser
        to relay's sink, as any other), else what relay's sink would: True to go on, False to stop. It is
        the usual read of a paced stream, one event per HTTP chunk per read: taken this way it costs no
        parser call, callbacks, list or join. For this answer only (:meth:`start` forgets it).
        """
        self._whole_chunk_sink = sink

    @property
    def finished(self) -> bool:
        """The answer is complete or has failed: nothing more will come."""
        return self._complete or self._error is not None

    def abort(self, error: UpstreamError) -> None:
        """Fail the answer with ``error`` (a reader waiting gets it) and close the connection."""
        if self._error is None:
            self._error = error
        self._at_chunk_start = False
        self._wake()
        self.close()

    def release(self) -> None:
        """Done with the answer: back to the pool if it was read to its end and may be reused, else closed."""
        if self._complete and self._error is None and not self.closed and not self._chunks \
                and not self._head_only and self._keep_alive:
            self._head = None
            self._pool.keep(self)
        else:
            self.close()

    def close(self) -> None:
        """Close the connection (an answer not read to its end cannot be reused)."""
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks, self._buffered = [], 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return data

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._head is not None and not self._head.done() and self._error is not None:
            self._head.set_result(None)  # wait_head raises the error

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.bytes_received += len(data)
        if self._at_chunk_start and self._sink is not None and self._whole_chunk_sink is not None:
            # Exactly one whole chunk, where the parser stands between chunks: handed on without the
            # parser, which then stands where it would after the chunk, between chunks (take_whole_chunks).
            size_line = _CHUNK_SIZE_LINE.match(data)
            if size_line is not None:
                start, end = size_line.end(), len(data) - 2
                if end > start and int(size_line[1], 16) == end - start and data.endswith(b"\r\n"):
                    go_on = self._whole_chunk_sink(data, start, end)
                    if go_on is not None:
                        if not go_on:
                            self._end_relay()
                        return
        if self._head is None or self.finished:  # the upstream spoke out of turn: never reuse this one
            self.close()
            return
        try:
            self._parser.feed_data(data)  # calls on_body once per HTTP chunk: that only appends
        except httptools.HttpParserError as err:
            self.abort(DisconnectedError(f"the upstream's answer is not well-formed HTTP/1.1: {err}"))
            return
        if self._at_chunk_start and not data.endswith(b"\r\n"):  # a chunk ended, the next one began
            self._at_chunk_start = False
        if self._chunks and self._sink is not None:  # relay(): handed on now, no wake-up
            if not self._sink(self._take()):
                self._end_relay()
        elif self._chunks:  # one wake-up and one high-water check per socket read, however many chunks
            self._buffered += len(data)
            if self._buffered > HIGH_WATER_BYTES and not self._paused and self._transport is not None:
                self._paused = True
                self._transport.pause_reading()
            self._wake()

    def _end_relay(self) -> None:
        """The sink stopped taking: wake :meth:`relay`, which returns False; later pieces wait in the buffer."""
        self._sink = None
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self._pool.lost(self)
        if self._head is None or self.finished:
            return
        if self._until_eof and self._head.done():  # a body without a length ends with the connection
            self._complete = True
            self._wake()
            return
        reason = f"the connection was reset ({exc})" if exc is not None else "the upstream closed the connection"
        self.abort(DisconnectedError(reason))

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_list.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self._error is not None:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            self._interim, self._header_list = True, []
            return
        headers = CIMultiDict(self._header_list)
        encoding = headers.get("Content-Encoding", "identity").lower()
        if encoding in ("gzip", "x-gzip", "deflate"):  # asked for identity, got compressed anyway
            self._decoder = zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)  # gzip or zlib, from the header
        elif encoding != "identity":
            self.abort(DisconnectedError(f"the upstream answered with Content-Encoding {encoding!r}, though asked "
                                    "for identity"))
            return
        self.status, self.headers = status, CIMultiDictProxy(headers)
        self._keep_alive = self._parser.should_keep_alive()  # read now: the parser forgets it once the answer ends
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self._until_eof = "Content-Length" not in headers and not chunked and status not in (204, 304)
        if self._head_only:  # the answer to HEAD has no body, whatever its headers say
            self._complete = True
        self._at_chunk_start = chunked and self._decoder is None and not self._complete
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._decoder is None:
            self._chunks.append(body)
        elif self._error is None:
            try:
                body = self._decoder.decompress(body)
            except zlib.error as err:
                self.abort(DisconnectedError(f"the upstream's compressed body is corrupt: {err}"))
                return
            if body:
                self._chunks.append(body)

    def on_chunk_header(self) -> None:
        self._at_chunk_start = False

    def on_chunk_complete(self) -> None:
        # Between chunks again (llhttp calls this once the chunk's closing CRLF is read); the read that
        # brought it may hold the start of the next size line: data_received looks at the read's end.
        self._at_chunk_start = self._decoder is None and self._error is None

    def on_message_complete(self) -> None:
        self._at_chunk_start = False
        if self._error is not None:
            return
        if self._interim:
            self._interim = False
            return
        self._complete = True
        self._wake()


def upstream_address(base_url: str) -> tuple[str, int]:
    """The host and port of an http(s) base URL (``server.address``, ``server.port``), the scheme's port when
    none is given."""
    parts = urlsplit(base_url)
    return parts.hostname or "", parts.port or _DEFAULT_PORTS[parts.scheme]


class UpstreamPool:
    """Connections to one upstream (``http://`` or ``https://`` base URL, any path prefix), kept alive and reused."""

    def __init__(self, base_url: str, connect_timeout_s: float) -> None:
        problem = http_url(base_url)
        if problem is not None:
            raise ValueError(f"upstream {base_url!r} {problem}")
        parts = urlsplit(base_url)
        self._host, self._port = upstream_address(base_url)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._host_header = parts.netloc.rpartition("@")[2]
        self._prefix = parts.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[UpstreamConnection] = []  # the most recently used last
        self._open: set[UpstreamConnection] = set()

    @property
    def in_use(self) -> int:
        """Connections carrying a request now (open and not idle in the pool)."""
        return len(self._open) - len(self._idle)

    async def request(
        self, method: str, target: str, headers: dict[str, str], body: bytes | None, read_timeout_s: float,
    ) -> UpstreamConnection:
        """Send a request and wait for its status line; ``target`` is the path and query after the base URL.

        Raises:
            UpstreamError: no connection, or no status line (each kind its own subclass).
        """
        connection = self._idle_connection()
        if connection is None:
            began_ns = time.perf_counter_ns()
            connection = await self._connect()
            connection.connect_ns = time.perf_counter_ns() - began_ns
        else:
            connection.connect_ns = 0
        lines = [f"{method} {self._prefix}{target} HTTP/1.1\r\nHost: {self._host_header}\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("utf-8", "surrogateescape")  # how aiohttp's server decoded them
        try:
            connection.start(head + body if body else head, head_only=method == "HEAD")
            await connection.wait_head(read_timeout_s)
        except BaseException:  # cancelled, timed out or failed: this connection's state is unknown
            connection.close()
            raise
        return connection

    def keep(self, connection: UpstreamConnection) -> None:
        """Take back a connection whose answer was read to its end."""
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    def lost(self, connection: UpstreamConnection) -> None:
        """Forget a connection that closed."""
        self._open.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    def close(self) -> None:
        """Close every connection (shutdown)."""
        for connection in list(self._open):
            connection.close()

    def _idle_connection(self) -> UpstreamConnection | None:
        oldest_usable = time.monotonic() - KEEP_ALIVE_S
        while self._idle:
            connection = self._idle.pop()
            if connection.closed:
                continue
            if connection.idle_since < oldest_usable:
                connection.close()
                continue
            return connection
        return None

    async def _connect(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: UpstreamConnection(self), self._host, self._port, ssl=self._ssl
                )
        except TimeoutError:
            raise ConnectTimeoutError(f"no connection within {self._connect_timeout_s:g} s") from None
        except OSError as err:
            raise UnreachableError(str(err)) from None
        self._open.add(connection)
        return connection

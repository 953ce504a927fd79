"""The front: the sidecar's HTTP/1.1 server on the listen port, ``/v1/*`` answered at a protocol's cost.

Why not aiohttp's server for the proxied API: on the 2-core bench machine it cost 180-205 µs of
CPU per non-streamed request more than a bare relay on asyncio protocols, close to the whole
Rust router's cost for the same request (BENCHMARKS.md, "Proxy cost against peers"). The
front parses requests with httptools (llhttp, the parser of Node.js and uvicorn) and hands each
``/v1/*`` request to the proxy as an :class:`~serving.exchange.Exchange`, in a task of its own.

Every other path (``/metrics``, ``/healthz``, ``/readyz``, ``/admin/*``) stays aiohttp's: a
connection whose first request is for one of them is handed to aiohttp's server with every byte
it sent, and is aiohttp's from then on. A connection that asks for another path after ``/v1/*``
requests is handed over too, with the waiting requests written out again from what was parsed.

What the front keeps of aiohttp's server behaviour, since the reliability tests hold the proxy
to it:

- keep-alive and pipelining: answers go out in request order, one request handled at a time;
- the slow-header limit: a connection that has not delivered a complete request head within
  ``serve.client_header_timeout_s`` of its start or its previous answer is closed;
- head limits: a request line or header field over 8,190 bytes, over 128 header fields, or a
  head over ``MAX_HEAD_BYTES`` still coming in, is refused with 414 or 431, malformed HTTP with
  400 (the sidecar's JSON error, with a new trace id); what the client still sends is read and
  dropped for ``LINGER_S`` (so it reads the answer, not a reset), and the connection closed;
- ``Expect: 100-continue`` is answered when the proxy starts reading the body;
- a client that goes away cancels its request's task (the proxy then drops the upstream request).

Body size and body time limits are the proxy's (serving/admission.py), as they were.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

import httptools
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from serving.errors import error_body
from serving.exchange import BodyTooLargeError, ProxyHandler
from serving.tracing import request_trace_id

log = structlog.get_logger(__name__)


def _no_aiohttp() -> asyncio.Protocol:
    raise RuntimeError("Front.listen() sets aiohttp's server")

FRONT_PREFIX = ("/v1/", "/api/")
"""Requests the front answers itself (the OpenAI API, and Ollama's native one); everything else is aiohttp's."""
MAX_LINE_BYTES = 8190
"""The longest request target and header field (aiohttp's own limits)."""
MAX_HEADERS = 128
MAX_HEAD_BYTES = MAX_LINE_BYTES * (MAX_HEADERS + 1)
"""The most a request head may take, read before it is complete (httptools holds a field until its end)."""
_REASONS = {status.value: status.phrase for status in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
LINGER_S = 2.0
"""How long a refused client's further bytes are read and dropped before the close (so it gets the answer,
not a reset: closing a socket with unread data resets the connection)."""
_REFRAMED = frozenset({"content-length", "transfer-encoding", "expect"})
_REFUSAL_KINDS = {400: "malformed_request", 413: "request_too_large", 414: "request_target_too_long",
                  431: "request_head_too_large"}
"""``error.type`` of the front's own refusals of a request head (the proxy's error shape, serving/errors.py)."""


class HeadRefusedError(Exception):
    """The request's head breaks a limit: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Clock:
    """The ``Date`` header's value, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = 0
        self._value = ""

    def date(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True)
        return self._value


_CLOCK = _Clock()


def _head(status: int, headers: dict[str, str], framing: str) -> bytes:
    """An answer's status line and headers; ``framing`` is the length or chunking line(s), CRLF-ended."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nDate: {_CLOCK.date()}\r\n"]
    lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
    lines.append(framing)
    lines.append("\r\n")
    return "".join(lines).encode("latin-1", "replace")  # upstream values were decoded as latin-1: back unchanged


class FrontRequest:
    """One request taken by the front: the proxy's :class:`~serving.exchange.Exchange`."""

    __slots__ = (
        "_body", "_body_size", "_continue_sent", "_waiter", "answered", "complete", "connection", "content_length",
        "expect_continue", "head_only", "header_list", "headers", "http_10", "keep_alive", "method", "path",
        "path_qs", "raw_path", "too_large",
    )

    def __init__(
        self, connection: FrontConnection, method: str, target: str, http_10: bool, keep_alive: bool,
        header_list: list[tuple[str, str]],
    ) -> None:
        self.connection = connection
        self.method = method
        self.raw_path = target
        path, _, _ = target.partition("?")
        self.path_qs = target
        self.path = URL.build(path=path, encoded=True).path if "%" in path else path
        self.http_10 = http_10
        self.keep_alive = keep_alive
        self.header_list = header_list
        """The fields in order, decoded as UTF-8 with surrogate escapes: encoded again, they are the bytes."""
        self.headers = CIMultiDictProxy(CIMultiDict(header_list))
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.expect_continue = self.headers.get("Expect", "").lower() == "100-continue"
        self.head_only = method == "HEAD"
        self._body: list[bytes] = []
        self._body_size = 0
        self._continue_sent = False
        self._waiter: asyncio.Future[None] | None = None
        self.too_large = False
        """More body came than the front keeps (``serve.max_body_bytes``): the rest was read and dropped."""
        self.complete = False
        """The whole request (its body included) has been read."""
        self.answered = False

    @property
    def client_address(self) -> str:
        """The client's IP address (its connection's peer), empty when unknown."""
        transport = self.connection.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else ""

    # -- the request's side (the connection's parser calls these) -------------------------------

    def add_body(self, data: bytes, limit: int) -> None:
        self._body_size += len(data)
        if self._body_size > limit:
            self.too_large, self._body = True, []
        elif not self.too_large:
            self._body.append(data)
        self._wake()

    def end(self) -> None:
        self.complete = True
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def body(self) -> bytes:
        return self._body[0] if len(self._body) == 1 else b"".join(self._body)

    def as_bytes(self) -> bytes:
        """The request written out again from what was parsed, its body with a length (for a hand-over)."""
        lines = [b"%s %s HTTP/1.%d\r\n" % (self.method.encode(), self.raw_path.encode("utf-8", "surrogateescape"),
                                          0 if self.http_10 else 1)]
        lines.extend(f"{name}: {value}\r\n".encode("utf-8", "surrogateescape") for name, value in self.header_list
                     if name.lower() not in _REFRAMED)
        body = self.body()
        if body or self.content_length is not None:
            lines.append(b"Content-Length: %d\r\n" % len(body))
        lines.append(b"\r\n")
        lines.append(body)
        return b"".join(lines)

    # -- Exchange ------------------------------------------------------------------------------

    async def read_body(self, max_bytes: int, timeout_s: float) -> bytes:
        if not self.complete and not self.too_large:
            if self.expect_continue and not self._continue_sent:
                self._continue_sent = True
                self.connection.write(_CONTINUE)
            async with asyncio.timeout(timeout_s):
                while not self.complete and not self.too_large:
                    self._waiter = asyncio.get_running_loop().create_future()
                    await self._waiter
        if self.too_large or self._body_size > max_bytes:
            raise BodyTooLargeError
        return self.body()

    def respond(self, status: int, headers: dict[str, str], body: bytes) -> None:
        length = "" if status < 200 or status in (204, 304) else f"Content-Length: {len(body)}\r\n"
        framing = length + self._connection_header()
        head = _head(status, headers, framing)
        self.connection.write(head if self.head_only else head + body)
        self.connection.answered(self)

    async def start_stream(self, status: int, headers: dict[str, str]) -> FrontStream:
        chunked = not self.http_10 and not self.head_only
        if self.http_10:
            self.keep_alive = False  # an HTTP/1.0 client reads an unframed body to the connection's end
        framing = ("Transfer-Encoding: chunked\r\n" if chunked else "") + self._connection_header()
        self.connection.write(_head(status, headers, framing))
        return FrontStream(self, chunked)

    def _connection_header(self) -> str:
        if not self.keep_alive:
            return "Connection: close\r\n"
        return "Connection: keep-alive\r\n" if self.http_10 else ""


class FrontStream:
    """:class:`~serving.exchange.ClientStream` of a front request whose head went out."""

    __slots__ = ("_connection", "_request", "chunked", "transport")

    def __init__(self, request: FrontRequest, chunked: bool) -> None:
        self._request = request
        self._connection = request.connection
        self.chunked = chunked
        self.transport = request.connection.transport

    @property
    def writing_paused(self) -> bool:
        return self._connection.writing_paused  # read after every write of a stream

    async def drain(self) -> None:
        await self._connection.drain()

    async def finish(self, last: bytes) -> None:
        request, connection = self._request, self._connection
        if not request.head_only:
            if self.chunked:
                connection.write((b"%x\r\n%b\r\n" % (len(last), last) if last else b"") + _LAST_CHUNK)
            elif last:
                connection.write(last)
        connection.answered(request)


class FrontConnection(asyncio.Protocol):
    """One client connection: requests parsed in order, ``/v1/*`` handed to the proxy, the rest to aiohttp."""

    def __init__(self, front: Front) -> None:
        self._front = front
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._raw: bytearray | None = bytearray()  # every byte until the first head is in (a hand-over)
        self._handing_over = False  # the first request is aiohttp's: the parser's callbacks are ignored
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._in_head = True  # the next bytes belong to a request head (none has begun, or one is coming in)
        self._head_bytes = 0  # bytes read while in a head
        self._parsing: FrontRequest | None = None  # the request whose body is being read
        self._in_message = False
        self._queue: deque[FrontRequest] = deque()  # heads in, in order; the first is the one being answered
        self._task: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_deadline: float | None = None  # loop time the idle limit runs out; None: a request is in
        self._reading_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._feeding = False
        self._over_pending = False  # the first request in the queue is aiohttp's: hand over once all is parsed
        self._refusal = b""  # a refused head's answer, sent after the answers before it
        self._discarding = False  # refused: what the client still sends is dropped until the close
        self.writing_paused = False
        self.closing = False

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self._front.connections.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if self._raw is not None:
            self._raw += data
        self._feeding = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # a request asked to switch protocols: answered, then closed
            if self._queue:
                self._queue[-1].keep_alive = False
            self._stop_reading()
        except httptools.HttpParserCallbackError as err:  # a callback raised: httptools wraps it
            context = err.__context__
            if not isinstance(context, HeadRefusedError):
                raise
            self._refuse(context.status, str(context))
            return  # one answer per refused head: no head-size check or hand-over after it
        except httptools.HttpParserError as err:
            if not self._handing_over:  # else aiohttp reads the same bytes and answers them itself
                self._refuse(400, f"malformed HTTP request: {err}")
                return
        finally:
            self._feeding = False
        if self._in_head and self.transport is not None:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:  # an endless field or header block: never buffered whole
                self._refuse(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
                return
        if self._handing_over:
            self._hand_over(bytes(self._raw or b""))
        elif self._over_pending:
            self._try_hand_over()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._front.connections.discard(self)
        self._cancel_idle_timer()
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client left: its request is dropped upstream too
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection"))
        for request in self._queue:
            request.end()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        """Wait until the client's socket takes more (or raise ConnectionResetError: it is gone)."""
        if self.transport is None:
            raise ConnectionResetError("the client closed the connection")
        if self.writing_paused:
            self._drain_waiter = self._loop.create_future()
            await self._drain_waiter

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._handing_over:
            return
        self._in_message = self._in_head = True
        self._url, self._headers, self._head_bytes = b"", [], 0

    def on_url(self, url: bytes) -> None:
        if self._handing_over:
            return
        self._url += url
        if len(self._url) > MAX_LINE_BYTES:
            raise HeadRefusedError(414, f"request target longer than {MAX_LINE_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._handing_over:
            return
        if len(name) + len(value) > MAX_LINE_BYTES:
            raise HeadRefusedError(431, f"a header field longer than {MAX_LINE_BYTES} bytes")
        if len(self._headers) >= MAX_HEADERS:
            raise HeadRefusedError(431, f"more than {MAX_HEADERS} header fields")
        self._headers.append((name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._handing_over:
            return
        parser = self._parser
        target = self._url.decode("utf-8", "surrogateescape")
        first = self._raw is not None  # no head came before this one
        if first and not target.startswith(FRONT_PREFIX):  # aiohttp's connection from its first byte
            self._handing_over = True
            return
        self._raw = None
        self._idle_deadline = None  # a head is in: not idle
        request = FrontRequest(self, parser.get_method().decode("ascii", "replace"), target,
                               parser.get_http_version() == "1.0", parser.should_keep_alive(), self._headers)
        self._parsing = request
        self._queue.append(request)
        if len(self._queue) == 1:
            self._start(request)

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.add_body(body, self._front.max_body_bytes)

    def on_message_complete(self) -> None:
        if self._handing_over:
            return
        self._in_message = False
        request, self._parsing = self._parsing, None
        if request is None:
            return
        request.end()
        if request.answered:  # the answer went out before the body was all in (a refusal)
            self._next()
        elif len(self._queue) > 1 and not self._over_pending:  # pipelined: wait for the earlier answers
            self._stop_reading()

    # -- requests, in order ------------------------------------------------------------------------

    def _start(self, request: FrontRequest) -> None:
        """Answer the first request in the queue: the proxy's task, or the hand-over to aiohttp."""
        if request.path.startswith(FRONT_PREFIX):
            # a context of its own: the request before it on the connection may have started this one,
            # and its context variables (the log's trace_id) are not this request's
            self._task = self._loop.create_task(self._serve(request), context=contextvars.Context())
        else:
            self._over_pending = True
            if not self._feeding:  # else at the end of this read, when the parser has taken all of it
                self._try_hand_over()

    def _try_hand_over(self) -> None:
        """Hand the connection over with the requests waiting, once none of them is parsed halfway."""
        if self._in_message or not all(waiting.complete for waiting in self._queue):
            self._resume_reading()  # the rest of a body, or of a request behind it, first
            return
        if any(waiting.too_large for waiting in self._queue):  # cannot be written out again: aiohttp's 413
            self._refuse(413, f"request body larger than {self._front.max_body_bytes} bytes")
            return
        self._hand_over(b"".join(waiting.as_bytes() for waiting in self._queue))

    async def _serve(self, request: FrontRequest) -> None:
        try:
            await self._front.handler(request)
        except asyncio.CancelledError:  # the client left (connection_lost)
            return
        except Exception:  # the proxy answers every request; a bug must still not leave the client hanging
            log.exception("front_handler_failed", path=request.path)
            if not request.answered:
                request.keep_alive = False
                trace_id = request_trace_id(request.headers.get("traceparent"))
                request.respond(500, {"Content-Type": "application/json", "x-trace-id": trace_id},
                                error_body("the sidecar failed on this request", "sidecar_error", 500,
                                           trace_id=trace_id))
                return
        if not request.answered:
            self._close()

    def answered(self, request: FrontRequest) -> None:
        """``request``'s answer went out completely: on to the next request, or close."""
        request.answered = True
        if not request.keep_alive or self.closing:
            self._close()
        elif request.complete:
            self._next()
        else:  # answered before its body was in (refused): the rest is read and dropped, for a while
            self._arm_idle_timer()

    def _next(self) -> None:
        self._queue.popleft()
        self._task = None
        if len(self._queue) <= 1:  # nothing more waits behind the next one: read on (its body, the next head)
            self._resume_reading()
        if self._queue:
            self._start(self._queue[0])
        else:
            self._arm_idle_timer()

    # -- the connection ---------------------------------------------------------------------------

    def _hand_over(self, data: bytes) -> None:
        """Give the connection to aiohttp's server, ``data`` being what it would have read so far."""
        transport = self.transport
        self._front.connections.discard(self)
        self._cancel_idle_timer()
        self._queue.clear()
        self.transport = None
        if transport is None or transport.is_closing():
            return
        handler = self._front.aiohttp_protocol()
        transport.set_protocol(handler)
        if self._reading_paused:
            transport.resume_reading()
        handler.connection_made(transport)
        handler.data_received(data)

    def _refuse(self, status: int, message: str) -> None:
        """Answer a head the front cannot take (after the answers before it), then close."""
        self._stop_reading()
        trace_id = request_trace_id(None)  # the head was not taken: no traceparent to join
        body = error_body(message, _REFUSAL_KINDS.get(status, "invalid_request_error"), status, trace_id=trace_id)
        answer = _head(status, {"Content-Type": "application/json", "x-trace-id": trace_id},
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n") + body
        self._over_pending = False
        proxying = bool(self._queue) and self._queue[0].path.startswith(FRONT_PREFIX)
        if not proxying:  # nothing being answered (or only a hand-over waiting): the refusal goes out now
            self._queue.clear()
            self._refusal = answer
            self._close()
            return
        self._queue[-1].keep_alive = False  # after the answers to the requests already taken
        self._refusal = answer

    def _close(self) -> None:
        transport = self.transport
        if transport is None:
            return
        if not self._refusal:
            transport.close()
            return
        transport.write(self._refusal)  # then read and drop the rest for a while, and close
        self._refusal, self._discarding = b"", True
        self._resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
        self._loop.call_later(LINGER_S, transport.close)

    def _stop_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _arm_idle_timer(self) -> None:
        """Count ``serve.client_header_timeout_s`` from now (the connection's start, or an answer).

        One timer per connection, moved only when it fires (as the stream relay's stall watch):
        cancelling and re-arming one at every request and answer cost a few µs a request.
        """
        self._idle_deadline = self._loop.time() + self._front.header_timeout_s
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_at(self._idle_deadline, self._idle_timed_out)

    def _cancel_idle_timer(self) -> None:
        self._idle_deadline = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_timed_out(self) -> None:
        self._idle_timer = None
        deadline = self._idle_deadline
        if deadline is None:  # a request is being answered: armed again after its answer
            return
        if self._loop.time() < deadline:  # an answer since: not idle that long yet
            self._idle_timer = self._loop.call_at(deadline, self._idle_timed_out)
            return
        # no complete head since the start or the last answer (slow or idle), or a refused body still coming
        if not self._queue or self._queue[0].answered:
            self._close()

    def shut(self) -> None:
        """Close now if idle, else after the answer being sent (shutdown)."""
        self.closing = True
        if not self._queue:
            self._close()

    @property
    def busy(self) -> bool:
        return bool(self._queue)


class Front:
    """The listen port's server: :class:`FrontConnection` per client; see the module's doc."""

    def __init__(self, handler: ProxyHandler, *, header_timeout_s: float, max_body_bytes: int) -> None:
        self.handler = handler
        self.aiohttp_protocol: Callable[[], asyncio.Protocol] = _no_aiohttp
        """Makes aiohttp's protocol for a connection handed over (the runner's server, set by :meth:`listen`)."""
        self.header_timeout_s = header_timeout_s
        self.max_body_bytes = max_body_bytes
        self.connections: set[FrontConnection] = set()
        self._servers: list[asyncio.Server] = []

    async def listen(self, runner: web.BaseRunner, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Take connections on HOST:PORT (port 0: any free one), handing other paths to ``runner``'s server.

        Returns the port. Raises:
            OSError: the address cannot be listened on.
        """
        if runner.server is None:
            raise RuntimeError("the aiohttp runner is not set up")
        self.aiohttp_protocol = runner.server
        server = await asyncio.get_running_loop().create_server(
            lambda: FrontConnection(self), host, port, reuse_port=reuse_port or None, backlog=1024,
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def shutdown(self, timeout_s: float) -> None:
        """Stop listening, let requests being answered finish for up to ``timeout_s``, then close everything."""
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.shut()
        deadline = time.monotonic() + timeout_s
        while any(c.busy for c in self.connections) and time.monotonic() < deadline:  # noqa: ASYNC110 - waits for requests to finish, which set no event
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        for server in self._servers:
            await server.wait_closed()


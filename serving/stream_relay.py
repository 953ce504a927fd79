"""The proxy's hot loop: one SSE answer relayed from the upstream to the client, measured on the way.

Per piece of the stream (everything one socket read brought), the work is: note the time,
hand the bytes to the :class:`~serving.sse.SseReader` (which counts and times the events and
returns what to forward), write that to the client. Where that work runs is what this module
is about. Waking the handler's task for every piece (a future, a task switch, the awaits back
up the handler's stack) and going through aiohttp's writer cost more than the work itself on a
stream paced one event per read, as a GPU's decode paces it (BENCHMARKS.md, "Proxy cost
against peers": about 40 µs per event on the 2-core machine). So the pieces are handled in the
upstream connection's socket callback (:meth:`UpstreamConnection.relay`) and written straight to
the client's transport with HTTP/1.1 chunk framing, after the server sent the status line and
headers (:meth:`~serving.exchange.Exchange.start_stream`). The task wakes only when the stream
ends or fails, when the reader judged it broken, when the request ran out of time, when the
client went away, and when the client's socket is full: then it waits for it to drain and hands
back to the callback.

The usual read of a paced stream is exactly one HTTP chunk holding one ordinary content event. Such
a read skips even the HTTP parser (:meth:`UpstreamConnection.take_whole_chunks`): the reader tells
it is forwarded unchanged by a few byte comparisons (:meth:`~serving.sse.SseReader.take_event`) and
it goes out to the client in the upstream's own chunk framing (:meth:`StreamRelay._relay_whole_chunk`).
Every other read goes through the parser and :meth:`~serving.sse.SseReader.feed`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from serving.exchange import ClientStream
from serving.upstream_http import ReadTimeoutError, UpstreamConnection


class PieceReader(Protocol):
    """What the relay hands each piece to: :class:`serving.sse.SseReader` (or a pass-through, for a floor)."""

    def feed(self, data: bytes, now_ns: int) -> bytes:
        """Take a piece that arrived at ``now_ns``; return the bytes to forward now."""

    def take_event(self, data: bytes, start: int, end: int, now_ns: int) -> bool:
        """Take ``data[start:end]``, a piece that arrived at ``now_ns``, if it is to be forwarded unchanged and
        that is quick to tell (True); else do nothing and return False: it goes to :meth:`feed`."""

    @property
    def broken(self) -> bool:
        """The stream cannot be forwarded further (the reader forwards nothing more)."""


class StallWatch:
    """``serve.read_timeout_s`` between the reads of a stream, on one timer instead of one per read.

    A timer per read (cancelled and re-armed each time) costs more than the proxy's own work on a
    chunk (about 3 µs with uvloop on the 2-core machine). Here the relay only notes when it
    last got data and how many bytes the connection had received by then; one timer, re-armed
    only when it fires, ends the stream with :class:`ReadTimeoutError` when the upstream has sent
    nothing for that long. Bytes that came while the relay was busy writing to the client count as
    the upstream speaking, so a slow client is never taken for a silent upstream.
    """

    __slots__ = ("_handle", "_loop", "_timeout_ns", "_timeout_s", "_upstream", "bytes_read", "last_read_ns")

    def __init__(self, upstream: UpstreamConnection, timeout_s: float) -> None:
        self._upstream = upstream
        self.last_read_ns = time.perf_counter_ns()
        """When the relay last got data (perf_counter_ns)."""
        self.bytes_read = upstream.bytes_received
        """The connection's bytes received by then (the relay takes everything buffered at each read)."""
        self._timeout_s = timeout_s
        self._timeout_ns = int(timeout_s * 1e9)
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(timeout_s, self._check)

    def _check(self) -> None:
        upstream = self._upstream
        self._handle = None
        if upstream.finished:
            return
        left_ns = self.last_read_ns + self._timeout_ns - time.perf_counter_ns()
        if left_ns > 0:
            self._handle = self._loop.call_later(left_ns / 1e9, self._check)
        elif upstream.bytes_received != self.bytes_read:  # data waits for the relay (client full): not silent
            self._handle = self._loop.call_later(self._timeout_s, self._check)
        else:
            upstream.abort(ReadTimeoutError(f"silent for {self._timeout_s:g} s in the middle of the stream"))

    def stop(self) -> None:
        """Drop the timer (the stream ended)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class StreamRelay:
    """Relays one upstream SSE answer to the client through ``reader``; :meth:`run` does it.

    After :meth:`run` returns, the stream ended one of three ways: the reader judged it broken
    (``reader.broken``), :attr:`past_deadline`, or the upstream finished its answer
    (whether completely is the caller's to judge from the reader). Whatever the reader returned
    for the pieces read by then was written to the client, in order.
    """

    def __init__(
        self, upstream: UpstreamConnection, reader: PieceReader, read_timeout_s: float, deadline_ns: int | None,
    ) -> None:
        self._upstream = upstream
        self._reader = reader
        self._feed = reader.feed
        self._take_event = reader.take_event
        self._deadline_ns = deadline_ns
        self._stall = StallWatch(upstream, read_timeout_s)
        self._client: ClientStream | None = None
        self._transport: asyncio.Transport | None = None
        self._chunked = True
        self.past_deadline = False
        """The request's total time (``serve.request_timeout_s``) ran out in the middle of the stream."""
        self.client_gone = False
        """The client's connection closed under a write."""
        self._failed: Exception | None = None  # raised in the socket callback; re-raised in the task
        self.client_wait_ns = 0
        """Time spent waiting for the client's full socket to drain (a slow reader)."""

    async def run(self, client: ClientStream) -> None:
        """Relay until the stream ends (see the class) to ``client``, whose head went out.

        Raises:
            ConnectionResetError: the client went away.
            ReadTimeoutError: the upstream stayed silent for the read timeout (the stall watch).
            DisconnectedError: the upstream's connection broke.
        """
        self._client, self._transport, self._chunked = client, client.transport, client.chunked
        self._upstream.take_whole_chunks(self._relay_whole_chunk)
        try:
            # The socket callback does the work (see the module's doc); this task wakes to drain or at the end.
            while not await self._upstream.relay(self._relay_piece):
                if self._failed is not None:
                    raise self._failed
                if self.client_gone:
                    raise ConnectionResetError("the client closed the connection")
                if self._ended():
                    return
                began_ns = time.perf_counter_ns()
                await client.drain()  # the client's socket is full: wait until it takes more
                self.client_wait_ns += time.perf_counter_ns() - began_ns
        finally:
            self._stall.stop()

    def _ended(self) -> bool:
        return self.past_deadline or self._reader.broken

    def _relay_whole_chunk(self, data: bytes, start: int, end: int) -> bool | None:
        """The upstream connection's first sink for a socket read that is exactly one HTTP chunk, its data at
        ``data[start:end]``; None when the reader does not take it as it is (then :meth:`_relay_piece` gets it).

        The usual read of a paced stream: one event, forwarded unchanged in the upstream's own chunk framing.
        """
        now_ns = time.perf_counter_ns()
        try:
            if not self._take_event(data, start, end, now_ns):
                return None
        except Exception as err:  # a bug here must fail this request in its task, not the socket callback
            self._failed = err
            return False
        return self._send(now_ns, data if self._chunked else data[start:end])

    def _relay_piece(self, chunk: bytes) -> bool:
        """The upstream connection's sink (called from its socket callback): read, write, go on or stop.

        Runs once per socket read of the upstream that :meth:`_relay_whole_chunk` did not take.
        """
        now_ns = time.perf_counter_ns()
        try:
            out = self._feed(chunk, now_ns)
        except Exception as err:  # a bug here must fail this request in its task, not the socket callback
            self._failed = err
            return False
        if out and self._chunked:
            out = b"%x\r\n%b\r\n" % (len(out), out)  # one HTTP/1.1 chunk per piece (unframed for HTTP/1.0)
        return self._send(now_ns, out) and not self._reader.broken

    def _send(self, now_ns: int, framed: bytes) -> bool:
        """Note a read of the upstream at ``now_ns`` and write ``framed`` to the client; False when the task
        must take over: the client went away or its socket is full, or the request ran out of time."""
        stall = self._stall
        stall.last_read_ns = now_ns
        stall.bytes_read = self._upstream.bytes_received
        if self._deadline_ns is not None and now_ns > self._deadline_ns:
            self.past_deadline = True
        if framed:
            transport = self._transport
            if transport is None or transport.is_closing():
                self.client_gone = True
                return False
            transport.write(framed)
            if self._client is not None and self._client.writing_paused:
                return False  # the client's socket is full: the task waits for it to drain
        return not self.past_deadline

"""The request path's upstream client against byte-level upstreams: reuse, bodies, and every way an answer breaks.

A real server cannot be made to send a body without a length, a gzip body nobody asked for, a
malformed status line or an interim 100 answer on demand, so these upstreams are scripted bytes
on loopback. The proxy's behaviour against a real vLLM is in tests/integration/test_proxy_real.py.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from serving import upstream_http
from serving.upstream_http import (
    ConnectTimeoutError,
    DisconnectedError,
    ReadTimeoutError,
    UnreachableError,
    UpstreamConnection,
    UpstreamPool,
)
from tests.fakes.faulty_upstream import unaccepting_listener

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]
"""Writes the answer to one request (given its head and body) and may close the connection."""


class ScriptedUpstream:
    """A loopback server answering each request with ``answer``; counts connections and requests."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                await self.answer(request, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture(name="scripted")
async def _scripted() -> AsyncIterator[Callable[[Answer], Awaitable[ScriptedUpstream]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> ScriptedUpstream:
        upstream = ScriptedUpstream(answer)
        upstream.server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
        servers.append(upstream.server)
        return upstream

    yield start
    for server in servers:
        server.close()


def fixed(raw: bytes, *, close: bool = False) -> Answer:
    async def answer(_request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()
        if close:
            writer.close()
    return answer


async def status_and_body(
    upstream: ScriptedUpstream, method: str = "GET", body: bytes | None = None
) -> tuple[int, bytes]:
    """One request on a pool of its own: the answer's status and whole body; the pool closed after."""
    pool = UpstreamPool(upstream.url, 5.0)
    answer = await pool.request(method, "/", {}, body, 5.0)
    try:
        return answer.status, await answer.read_body(5.0)
    finally:
        answer.release()
        pool.close()


OK_JSON = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok": "1"}'


async def test_a_connection_is_reused_while_the_upstream_keeps_it_alive(scripted) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(OK_JSON))
    pool = UpstreamPool(upstream.url, 5.0)
    for _ in range(5):
        answer = await pool.request("POST", "/v1/completions", {"X-Trace": "t"}, b'{"a": 1}', 5.0)
        assert (answer.status, answer.headers["content-type"]) == (200, "application/json")
        assert await answer.read_body(5.0) == b'{"ok": "1"}'
        answer.release()
    assert upstream.connections == 1
    assert pool.in_use == 0
    first = upstream.requests[0]
    assert first.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"\r\nX-Trace: t\r\n" in first
    assert b"\r\nContent-Length: 8\r\n" in first
    assert first.endswith(b'\r\n\r\n{"a": 1}')
    pool.close()


async def test_the_base_urls_path_and_host_are_sent(scripted) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(OK_JSON))
    pool = UpstreamPool(upstream.url + "/prefix/", 5.0)
    answer = await pool.request("GET", "/v1/models?x=1", {}, None, 5.0)
    await answer.read_body(5.0)
    answer.release()
    host = upstream.url.removeprefix("http://")
    assert upstream.requests[0] == f"GET /prefix/v1/models?x=1 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    pool.close()


async def test_connection_close_and_an_unfinished_answer_are_not_reused(scripted) -> None:  # type: ignore[no-untyped-def]
    closing = OK_JSON.replace(b"Content-Length", b"Connection: close\r\nContent-Length")
    upstream = await scripted(fixed(closing))
    pool = UpstreamPool(upstream.url, 5.0)
    for _ in range(2):
        answer = await pool.request("GET", "/", {}, None, 5.0)
        await answer.read_body(5.0)
        answer.release()
    assert upstream.connections == 2

    chunked = await scripted(fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"))
    pool = UpstreamPool(chunked.url, 5.0)
    taken: list[bytes] = []

    def first_piece_only(piece: bytes) -> bool:
        taken.append(piece)
        return False

    for _ in range(2):
        answer = await pool.request("GET", "/", {}, None, 5.0)
        assert await answer.relay(first_piece_only) is False
        answer.release()  # the body's end never came: closed, not pooled
    assert taken == [b"hello", b"hello"]
    assert chunked.connections == 2
    assert await _eventually(lambda: pool.in_use == 0)


async def test_an_idle_connection_past_the_keep_alive_limit_is_replaced(scripted, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(OK_JSON))
    pool = UpstreamPool(upstream.url, 5.0)
    monkeypatch.setattr(upstream_http, "KEEP_ALIVE_S", 0.05)
    for _ in range(2):
        answer = await pool.request("GET", "/", {}, None, 5.0)
        await answer.read_body(5.0)
        answer.release()
        await asyncio.sleep(0.1)
    assert upstream.connections == 2
    pool.close()


async def test_a_body_without_a_length_ends_with_the_connection(scripted) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end", close=True))
    pool = UpstreamPool(upstream.url, 5.0)
    answer = await pool.request("GET", "/", {}, None, 5.0)
    assert await answer.read_body(5.0) == b"to the end"
    answer.release()
    assert await _eventually(lambda: pool.in_use == 0)


async def test_a_gzip_body_is_decompressed(scripted) -> None:  # type: ignore[no-untyped-def]
    body = gzip.compress(b'{"usage": {"prompt_tokens": 3}}')
    raw = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    assert await status_and_body(await scripted(fixed(raw))) == (200, b'{"usage": {"prompt_tokens": 3}}')


async def test_an_unknown_content_encoding_is_an_error(scripted) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\nxx"))
    pool = UpstreamPool(upstream.url, 5.0)
    with pytest.raises(DisconnectedError, match="Content-Encoding 'br'"):
        await pool.request("GET", "/", {}, None, 5.0)
    assert await _eventually(lambda: pool.in_use == 0)


async def test_an_interim_100_answer_is_skipped(scripted) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(b"HTTP/1.1 100 Continue\r\n\r\n" + OK_JSON))
    assert await status_and_body(upstream, "POST", b"{}") == (200, b'{"ok": "1"}')


async def test_the_answer_to_head_has_no_body(scripted) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n"))
    pool = UpstreamPool(upstream.url, 5.0)
    answer = await pool.request("HEAD", "/", {}, None, 5.0)
    assert (answer.status, answer.headers["Content-Length"]) == (200, "11")
    assert await answer.read_body(5.0) == b""
    answer.release()
    assert await _eventually(lambda: pool.in_use == 0)


@pytest.mark.parametrize(("raw", "error", "words"), [
    (b"", DisconnectedError, "closed the connection"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", DisconnectedError, "closed the connection"),
    (b"SMTP ready\r\n\r\n", DisconnectedError, "not well-formed HTTP"),
])
async def test_a_broken_answer_is_named(scripted, raw: bytes, error: type[Exception], words: str) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(fixed(raw, close=True))
    pool = UpstreamPool(upstream.url, 5.0)
    async def whole_answer() -> bytes:
        answer = await pool.request("GET", "/", {}, None, 5.0)
        return await answer.read_body(5.0)

    with pytest.raises(error, match=words):
        await whole_answer()
    assert await _eventually(lambda: pool.in_use == 0)


async def test_silence_before_the_status_line_and_within_the_body_is_a_read_timeout(scripted) -> None:  # type: ignore[no-untyped-def]
    async def silent(_request: bytes, _writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)

    pool = UpstreamPool((await scripted(silent)).url, 5.0)
    with pytest.raises(ReadTimeoutError, match=r"no status line within 0\.2 s"):
        await pool.request("GET", "/", {}, None, 0.2)
    pool = UpstreamPool((await scripted(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\npart"))).url, 5.0)
    answer = await pool.request("GET", "/", {}, None, 0.2)
    with pytest.raises(ReadTimeoutError, match="in the middle of the body"):
        await answer.read_body(0.2)
    assert await _eventually(lambda: pool.in_use == 0)


async def test_a_refused_connection_is_unreachable() -> None:
    server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(UnreachableError):
        await UpstreamPool(f"http://127.0.0.1:{port}", 5.0).request("GET", "/", {}, None, 5.0)


async def test_a_connection_not_accepted_in_time_is_a_connect_timeout() -> None:
    with unaccepting_listener() as url, pytest.raises(ConnectTimeoutError, match=r"no connection within 0\.2 s"):
        await UpstreamPool(url, 0.2).request("GET", "/", {}, None, 5.0)


LARGE_BODY = bytes(range(256)) * (4 * 1024 * 1024 // 256)


@pytest.fixture(name="large_answer")
async def _large_answer(scripted, monkeypatch) -> AsyncIterator[tuple[UpstreamConnection, ScriptedUpstream]]:  # type: ignore[no-untyped-def]
    """The answer (status line in) to a request for a 4 MiB body, the high-water mark at 64 KiB."""
    monkeypatch.setattr(upstream_http, "HIGH_WATER_BYTES", 64 * 1024)
    upstream = await scripted(fixed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(LARGE_BODY), LARGE_BODY)))
    pool = UpstreamPool(upstream.url, 5.0)
    yield await pool.request("GET", "/", {}, None, 5.0), upstream
    pool.close()


async def test_a_non_streamed_body_larger_than_the_high_water_mark_is_read_whole(large_answer) -> None:  # type: ignore[no-untyped-def]
    answer, upstream = large_answer
    assert await answer.read_body(2.0) == LARGE_BODY
    answer.release()
    assert upstream.connections == 1


async def _eventually(condition: Callable[[], bool], seconds: float = 2.0) -> bool:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return True
        await asyncio.sleep(0.01)
    return condition()


def paced_chunks(pieces: list[bytes], *, then_close: bool = False) -> Answer:
    """A chunked answer whose head goes out first and each piece 10 ms after the one before."""
    async def answer(_request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            await asyncio.sleep(0.01)
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        if then_close:
            writer.close()
        else:
            writer.write(b"0\r\n\r\n")
    return answer


async def test_relay_hands_each_piece_over_in_the_socket_callback(scripted) -> None:  # type: ignore[no-untyped-def]
    """No task wakes per piece: the sink runs in the protocol's callback, outside any task."""
    pieces = [b"data: %d\n\n" % i for i in range(5)]
    upstream = await scripted(paced_chunks(pieces))
    pool = UpstreamPool(upstream.url, 5.0)
    answer = await pool.request("GET", "/", {}, None, 5.0)
    taken: list[tuple[bytes, bool]] = []

    def sink(piece: bytes) -> bool:
        taken.append((piece, asyncio.current_task() is None))
        return True

    assert await answer.relay(sink) is True
    assert b"".join(piece for piece, _ in taken) == b"".join(pieces)
    assert len(taken) == len(pieces)
    assert all(in_callback for _, in_callback in taken)
    answer.release()
    assert pool.in_use == 0  # read to its end: back in the pool
    pool.close()


async def test_a_slow_reader_pauses_the_socket_and_loses_nothing(large_answer) -> None:  # type: ignore[no-untyped-def]
    """Stopping (a client to drain) pauses the socket at the high-water mark; nothing is lost or reordered."""
    answer, _upstream = large_answer
    received: list[bytes] = []

    def stop_after_one(piece: bytes) -> bool:
        received.append(piece)
        return False

    assert await answer.relay(stop_after_one) is False
    await asyncio.sleep(0.2)  # the client drains slowly; the upstream keeps sending until the high-water mark
    assert sum(map(len, received)) < len(LARGE_BODY)
    most = 0

    def take(piece: bytes) -> bool:
        nonlocal most
        received.append(piece)
        most = max(most, len(piece))
        return True

    assert await answer.relay(take) is True
    assert b"".join(received) == LARGE_BODY
    assert most < 1024 * 1024, "the socket kept being read while nobody took the data"
    answer.release()


async def test_relay_raises_the_failure_after_the_pieces_before_it(scripted) -> None:  # type: ignore[no-untyped-def]
    upstream = await scripted(paced_chunks([b"data: 1\n\n", b"data: 2\n\n"], then_close=True))
    pool = UpstreamPool(upstream.url, 5.0)
    answer = await pool.request("GET", "/", {}, None, 5.0)
    received: list[bytes] = []
    with pytest.raises(DisconnectedError):
        await answer.relay(lambda piece: received.append(piece) is None)
    assert b"".join(received) == b"data: 1\n\ndata: 2\n\n"
    answer.release()
    pool.close()


def written_reads(reads: list[bytes], head: bytes = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") -> Answer:
    """An answer written as ``head`` and then ``reads``, each its own write 10 ms after the one before."""
    async def answer(_request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        for data in reads:
            await asyncio.sleep(0.01)
            writer.write(data)
            await writer.drain()
    return answer


async def relay_both_ways(upstream: ScriptedUpstream, take: Callable[[bytes], bool]) -> tuple[list[bytes], list[bytes]]:
    """Relay one answer, offering whole chunks to a sink that takes those ``take`` says; (taken whole, the rest).

    The connection must end up back in the pool: read to its end, with the parser where the answer left it.
    """
    pool = UpstreamPool(upstream.url, 5.0)
    answer = await pool.request("GET", "/", {}, None, 5.0)
    whole: list[bytes] = []
    rest: list[bytes] = []

    def whole_chunk(data: bytes, start: int, end: int) -> bool | None:
        if not take(data[start:end]):
            return None
        whole.append(data[start:end])
        return True

    answer.take_whole_chunks(whole_chunk)
    assert await asyncio.wait_for(answer.relay(lambda piece: rest.append(piece) is None), 5.0) is True
    answer.release()
    assert pool.in_use == 0
    pool.close()
    return whole, rest


async def test_a_read_of_one_whole_chunk_is_offered_whole_and_the_rest_goes_through_the_parser(scripted) -> None:  # type: ignore[no-untyped-def]
    """Reads of exactly one chunk go to the whole-chunk sink when it takes them; declined ones, a chunk cut in
    two and two chunks in one read reach relay's sink; every byte arrives once, in order."""
    pieces = [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n", b"data: 4\n\n", b"data: 5\n\n"]
    framed = [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces]
    reads = [framed[0], framed[1], framed[2][:6], framed[2][6:], framed[3] + framed[4], b"0\r\n\r\n"]
    upstream = await scripted(written_reads(reads))
    order: list[bytes] = []
    whole, rest = await relay_both_ways(upstream, lambda data: order.append(data) is None and data != pieces[1])
    assert whole == [pieces[0]]
    assert order == pieces[:2]  # the cut chunk and the read of two were never offered whole
    assert b"".join(rest) == b"".join(pieces[1:])


async def test_a_read_that_continues_a_chunk_is_never_taken_for_a_whole_one(scripted) -> None:  # type: ignore[no-untyped-def]
    """A chunk's data cut so that its second read looks exactly like a chunk of its own (``5\\r\\nhello\\r\\n``)
    is the end of that chunk: relayed as such, never offered whole."""
    data = b"data: a5\r\nhello"
    reads = [b"%x\r\n%s" % (len(data), data[:7]), data[7:] + b"\r\n", b"0\r\n\r\n"]
    assert reads[1] == b"5\r\nhello\r\n"
    upstream = await scripted(written_reads(reads))
    whole, rest = await relay_both_ways(upstream, lambda _data: True)
    assert whole == []
    assert b"".join(rest) == data


async def test_a_compressed_chunked_answer_is_never_offered_whole(scripted) -> None:  # type: ignore[no-untyped-def]
    """Its chunks hold gzip bytes, not the answer: they go through the decoder to relay's sink."""
    body = gzip.compress(b"data: 1\n\n" * 20)
    reads = [b"%x\r\n%s\r\n" % (len(body), body), b"0\r\n\r\n"]
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
    upstream = await scripted(written_reads(reads, head))
    whole, rest = await relay_both_ways(upstream, lambda _data: True)
    assert whole == []
    assert b"".join(rest) == b"data: 1\n\n" * 20

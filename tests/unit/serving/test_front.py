"""The front (serving/front.py) on raw connections: HTTP/1.1 as clients speak it, and the hand-over to aiohttp.

Each test talks bytes to a sidecar started as `serve` starts it, in front of the fake upstream,
and reads the answers as a client would; what the front must keep of aiohttp's server
(keep-alive, pipelining, limits, Expect, HTTP/1.0, HEAD, cancellation) is checked on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from serving.exchange import Exchange
from serving.front import MAX_HEAD_BYTES, Front
from tests.fakes.faulty_upstream import ThreadedServer
from tests.fakes.openai_upstream import FakeOpenAI
from tests.unit.serving.inprocess import Sidecar, requests_counted, sse_events, start_sidecar, wait_for

COMPLETION = json.dumps({"model": "fake-model", "prompt": "hello there", "max_tokens": 4}).encode()
STREAM = json.dumps({"model": "fake-model", "prompt": "hello there", "max_tokens": 4, "stream": True}).encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


@pytest.fixture(name="fake", scope="module")
def _fake() -> Iterator[tuple[ThreadedServer, FakeOpenAI]]:
    fake = FakeOpenAI(token_delay_s=0.0)
    with ThreadedServer(fake.app) as server:
        yield server, fake


@pytest.fixture(name="sidecar")
async def _sidecar(fake: tuple[ThreadedServer, FakeOpenAI], tmp_path: Path) -> AsyncIterator[Sidecar]:
    sidecar, serving = await start_sidecar(fake[0].url, tmp_path / "logs", client_header_timeout_s=0.5,
                                           client_body_timeout_s=0.5)
    try:
        yield sidecar
    finally:
        await sidecar.session.close()
        await serving.cleanup()


def post(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: x", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def get(path: str, *extra: str, method: str = "GET") -> bytes:
    return ("\r\n".join([f"{method} {path} HTTP/1.1", "Host: x", *extra]) + "\r\n\r\n").encode()


async def connect(sidecar: Sidecar) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = sidecar.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def read_answer(reader: asyncio.StreamReader, *, head_only: bool = False) -> Answer:
    """One answer, its body framed by Content-Length, chunks, or the connection's end."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    status_line, *lines = head.decode("latin-1").split("\r\n")[:-2]
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    status = int(status_line.split()[1])
    if head_only or status in (100, 204, 304):
        return Answer(status, headers, b"")
    if "content-length" in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5.0)
    elif headers.get("transfer-encoding") == "chunked":
        pieces = []
        while size := int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 5.0)).strip(), 16):
            pieces.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readexactly(2)
        body = b"".join(pieces)
    else:
        body = await asyncio.wait_for(reader.read(), 5.0)
    return Answer(status, headers, body)


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), 5.0) == b""


async def test_keep_alive_answers_each_request_on_one_connection(sidecar: Sidecar) -> None:
    reader, writer = await connect(sidecar)
    for _ in range(3):
        writer.write(post("/v1/completions", COMPLETION))
        answer = await read_answer(reader)
        assert answer.status == 200
        assert json.loads(answer.body)["usage"]["completion_tokens"] == 4
        assert len(answer.headers["x-trace-id"]) == 32
        assert "date" in answer.headers
    writer.write(post("/v1/completions", STREAM))
    answer = await read_answer(reader)
    assert answer.headers["transfer-encoding"] == "chunked"
    assert sse_events(answer.body)[-1] == "[DONE]"
    writer.close()
    assert requests_counted(sidecar.registry, "ok") == 4


async def test_pipelined_requests_are_answered_in_order(sidecar: Sidecar) -> None:
    reader, writer = await connect(sidecar)
    prompts = [f"prompt number {i}" for i in range(4)]
    writer.write(b"".join(post("/v1/completions", json.dumps({"model": "fake-model", "prompt": p, "max_tokens": i + 1,
                                                                "stream": i % 2 == 1}).encode())
                          for i, p in enumerate(prompts)))
    for i in range(4):
        answer = await read_answer(reader)
        assert answer.status == 200
        if i % 2:
            assert len([e for e in sse_events(answer.body) if e != "[DONE]" and e["choices"]]) == i + 1
        else:
            assert json.loads(answer.body)["usage"]["completion_tokens"] == i + 1
    writer.close()


async def test_a_pipelined_request_whose_body_comes_later_is_read_on(sidecar: Sidecar) -> None:
    """Reading pauses while pipelined requests wait, and goes on for the body of the one answered next."""
    reader, writer = await connect(sidecar)
    request = post("/v1/completions", COMPLETION)
    writer.write(request + request + request[:-10])  # the third's body is not all there yet
    for _ in range(2):
        assert (await read_answer(reader)).status == 200
    await asyncio.sleep(0.1)
    writer.write(request[-10:])
    assert json.loads((await read_answer(reader)).body)["usage"]["completion_tokens"] == 4
    writer.close()


async def test_a_connection_opened_for_another_path_is_aiohttps_from_its_first_byte(sidecar: Sidecar) -> None:
    """/healthz first: aiohttp answers it, and the /v1 requests after it on that connection too."""
    reader, writer = await connect(sidecar)
    writer.write(get("/healthz"))
    answer = await read_answer(reader)
    assert (answer.status, json.loads(answer.body)) == (200, {"status": "ok"})
    assert "aiohttp" in answer.headers.get("server", "")  # aiohttp's own answer
    writer.write(post("/v1/completions", COMPLETION))
    answer = await read_answer(reader)
    assert answer.status == 200
    assert json.loads(answer.body)["choices"][0]["text"]
    writer.close()
    assert requests_counted(sidecar.registry, "ok") == 1


async def test_bytes_after_a_handed_over_request_are_aiohttps_to_judge(sidecar: Sidecar) -> None:
    """A malformed request behind /healthz in the same read: the connection is aiohttp's, so is the answer."""
    reader, writer = await connect(sidecar)
    writer.write(get("/healthz") + b"NOT HTTP AT ALL\r\n\r\n")
    answer = await read_answer(reader)
    assert answer.status == 400
    assert "aiohttp" in answer.headers["server"]  # aiohttp's parser judged the bytes, not the front's
    assert await closed(reader)
    writer.close()


async def test_another_path_after_v1_requests_is_handed_over_whole(sidecar: Sidecar) -> None:
    """/v1 then /metrics then /v1, pipelined: the last two are written out again for aiohttp, in order."""
    reader, writer = await connect(sidecar)
    writer.write(post("/v1/completions", COMPLETION) + get("/metrics") + post("/v1/completions", COMPLETION))
    first = await read_answer(reader)
    metrics = await read_answer(reader)
    last = await read_answer(reader)
    assert first.status == metrics.status == last.status == 200
    assert "server" not in first.headers
    assert "aiohttp" in metrics.headers["server"]
    assert b"inferwatch_requests_total" in metrics.body
    assert json.loads(last.body)["usage"]["completion_tokens"] == 4
    writer.close()


async def test_the_sidecar_answers_a_post_to_another_path_after_v1_with_its_body(sidecar: Sidecar) -> None:
    """A body of a handed-over request keeps its bytes (aiohttp answers 405 for a POST to /healthz)."""
    reader, writer = await connect(sidecar)
    writer.write(post("/v1/completions", COMPLETION))
    assert (await read_answer(reader)).status == 200
    writer.write(post("/healthz", b'{"x": 1}') + get("/healthz"))
    assert (await read_answer(reader)).status == 405
    assert json.loads((await read_answer(reader)).body) == {"status": "ok"}
    writer.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (get("/v1/models?" + "x" * 9000), 414),
        (get("/v1/models", "X-Big: " + "y" * 9000), 431),
        (get("/v1/models", *(f"X-{i}: 1" for i in range(200))), 431),
        (b"GET /v1/models HTTP/1.1\r\nHost x\r\n\r\n", 400),
    ],
    ids=["long target", "long field", "too many fields", "malformed"],
)
async def test_heads_over_the_limits_are_refused_and_the_connection_closed(
    sidecar: Sidecar, request_bytes: bytes, status: int
) -> None:
    """The refusal is the sidecar's JSON error (the shape every /v1 error has) with a trace id, then the close."""
    reader, writer = await connect(sidecar)
    writer.write(request_bytes)
    answer = await read_answer(reader)
    assert answer.status == status
    assert answer.headers["connection"] == "close"
    error = json.loads(answer.body)["error"]
    assert (set(error), error["code"]) == ({"message", "type", "code", "trace_id"}, status)
    assert error["trace_id"] == answer.headers["x-trace-id"]
    assert len(error["trace_id"]) == 32
    assert await closed(reader)
    writer.close()


async def test_an_endless_header_field_is_cut_off_before_it_fills_memory(sidecar: Sidecar) -> None:
    """httptools holds a field until its end: the front stops reading a head past its limit."""
    reader, writer = await connect(sidecar)
    writer.write(b"GET /v1/models HTTP/1.1\r\nX-Endless: ")
    with contextlib.suppress(ConnectionError):
        for _ in range(MAX_HEAD_BYTES // 65536 + 2):
            writer.write(b"y" * 65536)
            await writer.drain()
    answer = await read_answer(reader)
    assert answer.status == 431
    assert await closed(reader)
    writer.close()


async def test_a_bad_head_behind_a_request_is_refused_after_its_answer(sidecar: Sidecar) -> None:
    reader, writer = await connect(sidecar)
    writer.write(post("/v1/completions", COMPLETION) + b"NOT HTTP AT ALL\r\n\r\n")
    assert (await read_answer(reader)).status == 200
    assert (await read_answer(reader)).status == 400
    assert await closed(reader)
    writer.close()


async def test_expect_continue_is_answered_before_the_body_is_sent(sidecar: Sidecar) -> None:
    reader, writer = await connect(sidecar)
    request = post("/v1/completions", COMPLETION, "Expect: 100-continue")
    head, _, body = request.partition(b"\r\n\r\n")
    writer.write(head + b"\r\n\r\n")
    interim = await read_answer(reader)
    assert interim.status == 100
    writer.write(body)
    answer = await read_answer(reader)
    assert answer.status == 200
    writer.close()


async def test_http_10_clients_get_framed_answers_and_a_closed_connection(sidecar: Sidecar) -> None:
    for body in (COMPLETION, STREAM):
        reader, writer = await connect(sidecar)
        writer.write(post("/v1/completions", body, version="1.0"))
        answer = await read_answer(reader)
        assert answer.status == 200
        assert "transfer-encoding" not in answer.headers  # HTTP/1.0 has no chunks: the close ends the stream
        if body is STREAM:
            assert sse_events(answer.body)[-1] == "[DONE]"
        else:
            assert json.loads(answer.body)["usage"]["completion_tokens"] == 4
        assert await closed(reader)
        writer.close()


async def test_head_gets_the_head_only_and_the_connection_stays(sidecar: Sidecar) -> None:
    reader, writer = await connect(sidecar)
    writer.write(get("/v1/models", method="HEAD") + get("/v1/models"))
    head = await read_answer(reader, head_only=True)  # a body after it would be read as the next answer's head
    assert head.status == 200
    models = await read_answer(reader)
    assert json.loads(models.body)["data"][0]["id"] == "fake-model"
    writer.close()


async def test_a_chunked_request_body_reaches_the_upstream_whole(
    sidecar: Sidecar, fake: tuple[ThreadedServer, FakeOpenAI]
) -> None:
    reader, writer = await connect(sidecar)
    pieces = [COMPLETION[i:i + 7] for i in range(0, len(COMPLETION), 7)]
    chunked = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    writer.write(get("/v1/completions", "Transfer-Encoding: chunked", "Content-Type: application/json",
                     method="POST") + chunked)
    assert (await read_answer(reader)).status == 200
    assert fake[1].requests[-1]["body"]["prompt"] == "hello there"
    writer.close()


async def test_an_idle_connection_is_closed_after_the_header_timeout(sidecar: Sidecar) -> None:
    """serve.client_header_timeout_s counts from the previous answer, as from the connection's start."""
    reader, writer = await connect(sidecar)
    writer.write(post("/v1/completions", COMPLETION))
    assert (await read_answer(reader)).status == 200
    started = asyncio.get_running_loop().time()
    assert await closed(reader)
    assert 0.4 < asyncio.get_running_loop().time() - started < 2.0
    writer.close()


async def test_a_client_leaving_mid_stream_cancels_its_upstream_request(tmp_path: Path) -> None:
    fake = FakeOpenAI(token_delay_s=0.05)
    with ThreadedServer(fake.app) as server:
        sidecar, serving = await start_sidecar(server.url, tmp_path / "logs")
        try:
            reader, writer = await connect(sidecar)
            writer.write(post("/v1/completions", json.dumps(
                {"model": "fake-model", "prompt": "p", "max_tokens": 100, "stream": True}).encode()))
            await asyncio.wait_for(reader.readuntil(b"data: "), 5.0)
            writer.close()
            assert await wait_for(lambda: fake.cancelled == 1)
            assert await wait_for(lambda: requests_counted(sidecar.registry, "cancelled") == 1)
        finally:
            await sidecar.session.close()
            await serving.cleanup()


async def test_shutdown_lets_the_answer_being_sent_finish(tmp_path: Path) -> None:
    fake = FakeOpenAI(token_delay_s=0.02)
    with ThreadedServer(fake.app) as server:
        sidecar, serving = await start_sidecar(server.url, tmp_path / "logs")
        await sidecar.session.close()
        reader, writer = await connect(sidecar)
        writer.write(post("/v1/completions", json.dumps(
            {"model": "fake-model", "prompt": "p", "max_tokens": 20, "stream": True}).encode()))
        assert await wait_for(lambda: fake.generations == 1)
        stopping = asyncio.create_task(serving.front.shutdown(5.0))
        answer = await read_answer(reader)
        await stopping
        await serving.runner.cleanup()
        assert sse_events(answer.body)[-1] == "[DONE]"
        assert await closed(reader)
        writer.close()


async def test_each_request_runs_in_a_context_of_its_own() -> None:
    """The request before it on a connection starts the next one: its context variables must not carry over."""
    bound: contextvars.ContextVar[str | None] = contextvars.ContextVar("bound", default=None)
    seen: list[str | None] = []

    async def handler(request: Exchange) -> None:
        seen.append(bound.get())
        bound.set(request.path)  # as the proxy binds the log's trace_id
        request.respond(200, {}, b"ok")

    runner = web.AppRunner(web.Application())
    await runner.setup()
    front = Front(handler, header_timeout_s=5.0, max_body_bytes=1000)
    port = await front.listen(runner, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/v1/a") + get("/v1/b") + get("/v1/c"))
        for _ in range(3):
            assert (await read_answer(reader)).body == b"ok"
        writer.close()
        assert seen == [None, None, None]
    finally:
        await front.shutdown(1.0)
        await runner.cleanup()


async def test_a_handler_that_fails_still_answers_the_json_error_with_the_callers_trace_id() -> None:
    """A bug in the proxy must not leave the client hanging nor answer plain text: a JSON 500 naming a trace id,
    the caller's traceparent's when it sent one."""

    async def handler(_request: Exchange) -> None:
        raise RuntimeError("a bug")

    runner = web.AppRunner(web.Application())
    await runner.setup()
    front = Front(handler, header_timeout_s=5.0, max_body_bytes=1000)
    port = await front.listen(runner, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/v1/a", "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
        answer = await read_answer(reader)
        writer.close()
        assert answer.status == 500
        error = json.loads(answer.body)["error"]
        assert (error["code"], error["trace_id"]) == (500, "4bf92f3577b34da6a3ce929d0e0e4736")
        assert answer.headers["x-trace-id"] == error["trace_id"]
    finally:
        await front.shutdown(1.0)
        await runner.cleanup()


async def test_a_request_handed_over_mid_connection_keeps_its_header_bytes() -> None:
    """Header bytes that are not UTF-8 reach aiohttp unchanged when a request is written out again."""
    odd = b"caf\xe9 \xc3\xa9 \xff"

    async def handler(request: Exchange) -> None:
        request.respond(200, {}, b"ok")

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=dict(request.raw_headers)[b"X-Odd"])

    app = web.Application()
    app.router.add_get("/echo", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    front = Front(handler, header_timeout_s=5.0, max_body_bytes=1000)
    port = await front.listen(runner, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(get("/v1/a") + b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Odd: " + odd + b"\r\n\r\n")
        assert (await read_answer(reader)).body == b"ok"
        assert (await read_answer(reader)).body == odd
        writer.close()
    finally:
        await front.shutdown(1.0)
        await runner.cleanup()


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_a_paced_streams_reads_go_out_whole_in_the_clients_framing(
    sidecar: Sidecar, fake: tuple[ThreadedServer, FakeOpenAI], monkeypatch: pytest.MonkeyPatch, version: str,
) -> None:
    """Paced, each read of the upstream is one HTTP chunk holding one event: the relay takes the plain ones
    whole (no parser) and writes them in the upstream's own chunk framing, or unframed to an HTTP/1.0
    client; either way the client gets every event, whole and in order."""
    from serving.sse import SseReader

    taken_whole = 0
    take_event = SseReader.take_event

    def counted(self: SseReader, data: bytes, start: int, end: int, now_ns: int) -> bool:
        nonlocal taken_whole
        taken = take_event(self, data, start, end, now_ns)
        taken_whole += taken
        return taken

    monkeypatch.setattr(SseReader, "take_event", counted)
    monkeypatch.setattr(fake[1], "token_delay_s", 0.01)
    tokens = 12
    body = json.dumps({"model": "fake-model", "prompt": "hello", "max_tokens": tokens, "stream": True}).encode()
    reader, writer = await connect(sidecar)
    writer.write(post("/v1/completions", body, version=version))
    answer = await read_answer(reader)
    writer.close()
    assert answer.status == 200
    assert ("transfer-encoding" in answer.headers) == (version == "1.1")
    events = sse_events(answer.body)
    assert events[-1] == "[DONE]"
    texts = [event["choices"][0]["text"] for event in events[:-1]]
    assert texts == [f" w{i}" for i in range(tokens)]
    assert taken_whole >= tokens - 4  # all but the stream's first few and last events

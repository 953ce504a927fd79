"""A fault-injecting upstream: the fake vLLM API, misbehaving on request.

The fault is chosen per request by the ``x-fault`` header (which the sidecar forwards like
any other header), so one upstream serves normal and faulty requests side by side and a test
can check that the next normal request after a fault still succeeds. Without the header it is
:class:`~tests.fakes.openai_upstream.FakeOpenAI`. Each fault works for streamed and
non-streamed requests unless its name says otherwise; "after a few chunks" means after
``CHUNKS_BEFORE_FAULT`` content events.

:func:`unaccepting_listener` gives an address whose TCP connects hang (the accept queue is
full), for the connect timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web

from tests.fakes.openai_upstream import PROMPT_TOKENS, FakeOpenAI

FAULT_HEADER = "x-fault"
CHUNKS_BEFORE_FAULT = 3
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of "
               "which 1.02 GiB is free.")
HTML_502 = (b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1>"
            b"</center><hr><center>nginx</center></body></html>")

FAULTS = (
    "reset_before_status",  # RST after reading the request, before any byte of the answer
    "reset_mid_stream",  # streamed: headers and a few chunks, then RST
    "reset_mid_body",  # non-streamed: headers and half the body, then RST
    "silent_before_status",  # never answers
    "silent_mid_stream",  # streamed: a few chunks, then silence
    "drip",  # streamed: a chunk every 50 ms, forever
    "drip_body",  # non-streamed: headers, then one body byte every 50 ms, forever
    "error_500_json",  # vLLM's JSON error body
    "error_500_html",  # a load balancer's HTML page
    "error_503_retry_after",  # vLLM's admission rejection, Retry-After: 7
    "error_429_retry_after",  # rate limited, Retry-After: 7
    "error_500_oom",  # vLLM's CUDA OOM error body
    "error_502_odd_type",  # a JSON error whose "type" is no short plain word (markup and a newline)
    "bad_json_event",  # streamed: a few chunks, then a data line that is not JSON
    "truncated_event",  # streamed: a few chunks, then half an event and a clean end
    "no_done",  # streamed: every chunk, then a clean end without [DONE]
    "oversized_event",  # streamed: a few chunks, then one event of OVERSIZED_EVENT_BYTES
    "mid_stream_error_event",  # streamed: a few chunks, then vLLM's error event and [DONE]
    "mid_stream_oom_event",  # streamed: a few chunks, then an error event with the CUDA OOM message and [DONE]
    "echo_prompt_400",  # a validation error quoting the request's prompt, as pydantic's messages do
    "own_cache_control",  # a normal non-streamed answer carrying its own Cache-Control
)
OVERSIZED_EVENT_BYTES = 256 * 1024
SILENCE_S = 30.0
"""How long a silent fault stays silent: far past any timeout a test sets, yet bounded."""


def _usage(completion: int) -> dict[str, int]:
    return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": completion,
            "total_tokens": PROMPT_TOKENS + completion}


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(i: int, chat: bool) -> bytes:
    choice = ({"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None} if chat
              else {"index": 0, "text": f" w{i}", "finish_reason": None})
    return _event({"id": "x", "created": int(time.time()), "model": "m", "choices": [choice]})


def _vllm_error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _reset(request: web.Request) -> None:
    """Close the connection with a TCP RST (SO_LINGER 0), as a crashed process or a proxy does."""
    transport = request.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class FaultyUpstream(FakeOpenAI):
    """The fake upstream with the faults of :data:`FAULTS`, chosen by the ``x-fault`` request header."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.faults_served: list[str] = []

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """A normal answer, or the fault the request asks for."""
        fault = request.headers.get(FAULT_HEADER)
        if fault is None:
            return await super().generate(request)
        if fault not in FAULTS:
            return web.json_response(_vllm_error(f"unknown fault {fault!r}", "BadRequestError", 400), status=400)
        self.faults_served.append(fault)
        body = await request.json()
        chat = request.path.endswith("chat/completions")
        stream = bool(body.get("stream"))
        if fault == "reset_before_status":
            _reset(request)
            return web.Response()  # never sent: the connection is gone
        if fault == "silent_before_status":
            await asyncio.sleep(SILENCE_S)
        if fault.startswith("error_"):
            return self._error_answer(fault)
        if fault == "echo_prompt_400":
            quoted = json.dumps(body.get("prompt", body.get("messages")))
            return web.json_response(_vllm_error(f"1 validation error: input_value={quoted} is not allowed",
                                                 "BadRequestError", 400), status=400)
        if fault == "own_cache_control":
            return web.json_response({"id": "x", "object": "completion", "model": "m", "choices": [],
                                      "usage": _usage(0)}, headers={"Cache-Control": "private, max-age=5"})
        if not stream:
            return await self._non_streamed_fault(request, fault, chat)
        return await self._streamed_fault(request, fault, chat)

    @staticmethod
    def _error_answer(fault: str) -> web.Response:
        if fault == "error_500_html":
            return web.Response(body=HTML_502, status=500, content_type="text/html")
        if fault == "error_500_oom":
            return web.json_response(_vllm_error(OOM_MESSAGE, "InternalServerError", 500), status=500)
        if fault == "error_500_json":
            return web.json_response(_vllm_error("engine step failed", "InternalServerError", 500), status=500)
        if fault == "error_502_odd_type":
            return web.json_response(_vllm_error("bad gateway", "<b>Bad\nGateway</b>", 502), status=502)
        status = 503 if fault == "error_503_retry_after" else 429
        return web.json_response(_vllm_error("The server is overloaded; retry later", "ServiceUnavailableError",
                                             status), status=status, headers={"Retry-After": "7"})

    async def _non_streamed_fault(self, request: web.Request, fault: str, chat: bool) -> web.StreamResponse:
        text = " ".join(f"w{i}" for i in range(8))
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        body = json.dumps({"id": "x", "object": "completion", "model": "m", "choices": [choice],
                           "usage": _usage(8)}).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        if fault == "reset_mid_body":
            await response.write(body[: len(body) // 2])
            await asyncio.sleep(0.05)
            _reset(request)
            return response
        if fault == "drip_body":
            for byte in body:
                await response.write(bytes([byte]))
                await asyncio.sleep(0.05)
            await asyncio.sleep(SILENCE_S)
        # faults that exist only for streams: answer normally
        await response.write(body)
        await response.write_eof()
        return response

    async def _streamed_fault(self, request: web.Request, fault: str, chat: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        if fault == "drip":
            deadline = time.monotonic() + SILENCE_S
            i = 0
            while time.monotonic() < deadline:
                await response.write(_chunk(i, chat))
                i += 1
                await asyncio.sleep(0.05)
        for i in range(CHUNKS_BEFORE_FAULT):
            await response.write(_chunk(i, chat))
        await asyncio.sleep(0.02)  # let the first chunks reach the client before the fault
        if fault in ("reset_mid_stream", "reset_mid_body"):
            _reset(request)
            return response
        if fault == "silent_mid_stream":
            await asyncio.sleep(SILENCE_S)
        if fault == "bad_json_event":
            await response.write(b"data: {this is not json\n\n")
            await response.write(_chunk(99, chat))
        elif fault == "truncated_event":
            await response.write(b'data: {"id": "x", "choices": [{"index": 0, "te')
        elif fault == "oversized_event":
            await response.write(b'data: {"id": "x", "pad": "' + b"x" * OVERSIZED_EVENT_BYTES + b'"}\n\n')
            await response.write(b"data: [DONE]\n\n")
        elif fault in ("mid_stream_error_event", "mid_stream_oom_event"):
            message = OOM_MESSAGE if fault == "mid_stream_oom_event" else "engine step failed"
            await response.write(_event(_vllm_error(message, "InternalServerError", 500)))
            await response.write(b"data: [DONE]\n\n")
        elif fault == "no_done":
            await response.write(_event({"id": "x", "model": "m", "choices": [], "usage": _usage(3)}))
        await response.write_eof()
        return response


@contextlib.contextmanager
def unaccepting_listener() -> Iterator[str]:
    """A loopback ``http://`` address whose TCP connects hang: its accept queue is full and never served."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    fillers: list[socket.socket] = []
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        for _ in range(8):  # Linux queues backlog + 1; further SYNs are dropped and the connect waits
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield f"http://127.0.0.1:{port}"
    finally:
        for filler in fillers:
            filler.close()
        server.close()


class ThreadedServer:
    """An aiohttp app served on loopback by its own event loop in a thread.

    The sidecar under test then owns its event loop alone, so a test can count its tasks, and
    the upstream's handlers are cancelled when the sidecar drops a connection.
    """

    def __init__(self, make_app: Callable[[], web.Application]) -> None:
        self._make_app = make_app
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-upstream", daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self._make_app(), handler_cancellation=True, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

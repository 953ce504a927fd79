"""A fast in-process fake of vLLM's OpenAI API, for unit tests and the proxy benchmark.

It streams ``max_tokens`` one-word chunks with no delay (or ``token_delay_s`` each), honours
``stream_options.include_usage`` and ``continuous_usage_stats`` the way vLLM does, and shows
faults on request: model ``fail`` -> 500, ``overloaded`` -> 503, ``oom`` -> 500 with an
out-of-memory message, ``stall`` -> never answers, ``slow`` -> answers after 0.5 s,
``break`` -> stream cut after 2 chunks. For warm-up and load-test tests it can also delay the
first answer of its k-th generation request (``first_token_delays_s[k]``) and answer 503 to the
first ``unhealthy_for`` health checks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

PROMPT_TOKENS = 7


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class FakeOpenAI:
    """The fake upstream; ``requests`` records what it received (headers and bodies)."""

    def __init__(
        self,
        token_delay_s: float = 0.0,
        record: bool = True,
        first_token_delays_s: Sequence[float] = (),
        unhealthy_for: int = 0,
    ) -> None:
        self.token_delay_s = token_delay_s
        self.record = record
        self.first_token_delays_s = tuple(first_token_delays_s)
        self.unhealthy_for = unhealthy_for
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self.tokenize_calls = 0
        self.generations = 0
        self.health_checks = 0

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/tokenize", self.tokenize)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        """Ready, except for the first ``unhealthy_for`` checks (503)."""
        self.health_checks += 1
        if self.health_checks <= self.unhealthy_for:
            return web.Response(status=503, text="starting")
        return web.Response(text="")

    async def tokenize(self, request: web.Request) -> web.Response:
        """Every prompt is PROMPT_TOKENS tokens long."""
        await request.read()
        self.tokenize_calls += 1
        return web.json_response({"count": PROMPT_TOKENS, "max_model_len": 2048, "tokens": []})

    async def models(self, _request: web.Request) -> web.Response:
        """One model."""
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """Completions and chat completions, streamed or not."""
        body = await request.json()
        if self.record:
            self.requests.append({"path": request.path, "headers": dict(request.headers), "body": body})
        model = body.get("model", "fake-model")
        n = int(body.get("max_tokens", 16))
        nth, self.generations = self.generations, self.generations + 1
        if nth < len(self.first_token_delays_s):
            await asyncio.sleep(self.first_token_delays_s[nth])
        chat = request.path.endswith("chat/completions")
        if model == "fail":
            return web.json_response({"error": {"message": "internal failure"}}, status=500)
        if model == "oom":
            return web.json_response({"error": {"message": "CUDA out of memory. Tried to allocate 2.00 GiB"}},
                                     status=500)
        if model == "overloaded":
            return web.json_response({"error": {"message": "queue full"}}, status=503)
        if model == "stall":
            await asyncio.sleep(3600)
        if model == "slow":
            await asyncio.sleep(0.5)
        if not body.get("stream"):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s * n)  # paced like a stream: the whole answer at the end
            text = " ".join(f"w{i}" for i in range(n))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"id": "x", "object": "completion", "model": model, "choices": [choice],
                                      "usage": _usage(PROMPT_TOKENS, n)})
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        try:
            for i in range(n):
                if model == "break" and i == 2:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                finish = "length" if i == n - 1 else None
                choice = ({"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": finish}
                          if chat else {"index": 0, "text": f" w{i}", "finish_reason": finish})
                chunk: dict[str, Any] = {"id": "x", "created": int(time.time()), "model": model, "choices": [choice]}
                if continuous:
                    chunk["usage"] = _usage(PROMPT_TOKENS, i + 1)
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
            if include_usage:
                final = {"id": "x", "model": model, "choices": [], "usage": _usage(PROMPT_TOKENS, n)}
                await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        return response

"""A fast in-process fake of vLLM's OpenAI API, for unit tests (and, as the faulty upstream's base, the soak).

It streams ``max_tokens`` one-word chunks with no delay (or ``token_delay_s`` each), honours
``stream_options.include_usage`` and ``continuous_usage_stats`` the way vLLM does, and shows
faults on request: model ``fail`` -> 500, ``overloaded`` -> 503, ``oom`` -> 500 with an
out-of-memory message, ``stall`` -> never answers, ``slow`` -> answers after 0.5 s,
``break`` -> stream cut after 2 chunks. For warm-up and load-test tests it can also delay the
first answer of its k-th generation request (``first_token_delays_s[k]``) and answer 503 to the
first ``unhealthy_for`` health checks. For load-test tests: ``count_prompt_words`` makes a prompt
one token per word plus one (plus four per chat message) in ``/tokenize`` and usage alike;
``tokenize=False`` removes ``/tokenize``; ``max_model_len`` goes on the ``/v1/models`` card of
``model_name``; ``latency_per_in_flight_s`` holds each answer back that long per generation in
flight when it arrived (itself included), so latency grows with load in a known way; and
``metrics_text`` is served at ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from exporters.tokenizer_drift import PROBE_TEXTS

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
        *,
        count_prompt_words: bool = False,
        tokenize: bool = True,
        model_name: str = "fake-model",
        max_model_len: int | None = None,
        latency_per_in_flight_s: float = 0.0,
        metrics_text: str | None = None,
    ) -> None:
        self.token_delay_s = token_delay_s
        self.record = record
        self.first_token_delays_s = tuple(first_token_delays_s)
        self.unhealthy_for = unhealthy_for
        self.requests: list[dict[str, Any]] = []
        self.cancelled = 0
        self.tokenize_calls = 0
        """Calls of /tokenize for a request's prompt size (serve.exact_live_token_counts)."""
        self.fingerprint_probes = 0
        self.generations = 0
        self.health_checks = 0
        self.count_prompt_words = count_prompt_words
        self.has_tokenize = tokenize
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.latency_per_in_flight_s = latency_per_in_flight_s
        self.metrics_text = metrics_text
        self.in_flight = 0
        self.usage_prompt_tokens = 0
        self.usage_completion_tokens = 0

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        if self.has_tokenize:
            app.router.add_post("/tokenize", self.tokenize)
        if self.metrics_text is not None:
            app.router.add_get("/metrics", self.metrics)
        return app

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        """Tokens of a request's prompt: PROMPT_TOKENS, or by words with ``count_prompt_words``."""
        if not self.count_prompt_words:
            return PROMPT_TOKENS
        if isinstance(body.get("messages"), list):
            return sum(4 + len(str(m.get("content", "")).split()) for m in body["messages"])
        return 1 + len(str(body.get("prompt", "")).split())

    async def metrics(self, _request: web.Request) -> web.Response:
        """The configured exposition text."""
        return web.Response(text=self.metrics_text or "", content_type="text/plain")

    async def health(self, _request: web.Request) -> web.Response:
        """Ready, except for the first ``unhealthy_for`` checks (503)."""
        self.health_checks += 1
        if self.health_checks <= self.unhealthy_for:
            return web.Response(status=503, text="starting")
        return web.Response(text="")

    async def tokenize(self, request: web.Request) -> web.Response:
        """Every prompt is PROMPT_TOKENS tokens long (or counted by words, see ``count_prompt_words``)."""
        body = await request.json()
        if body.get("prompt") in PROBE_TEXTS:  # the sidecar's tokenizer fingerprint, taken when it sees us ready
            self.fingerprint_probes += 1
        else:
            self.tokenize_calls += 1
        return web.json_response({"count": self.prompt_tokens(body), "max_model_len": self.max_model_len or 2048,
                                  "tokens": []})

    async def models(self, _request: web.Request) -> web.Response:
        """One model (with ``max_model_len`` when configured)."""
        card: dict[str, Any] = {"id": self.model_name, "object": "model"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [card]})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """Completions and chat completions, streamed or not."""
        self.in_flight += 1
        try:
            return await self._generate(request)
        finally:
            self.in_flight -= 1

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.latency_per_in_flight_s:
            await asyncio.sleep(self.latency_per_in_flight_s * self.in_flight)
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
        prompt_tokens = self.prompt_tokens(body)
        if not body.get("stream"):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s * n)  # paced like a stream: the whole answer at the end
            text = " ".join(f"w{i}" for i in range(n))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            self._count_usage(prompt_tokens, n)
            return web.json_response({"id": "x", "object": "completion", "model": model, "choices": [choice],
                                      "usage": _usage(prompt_tokens, n)})
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        created = int(time.time())  # one time for every chunk of the answer, as vLLM stamps them
        try:
            for i in range(n):
                if model == "break" and i == 2:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                finish = "length" if i == n - 1 else None
                choice = ({"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": finish}
                          if chat else {"index": 0, "text": f" w{i}", "finish_reason": finish})
                chunk: dict[str, Any] = {"id": "x", "created": created, "model": model, "choices": [choice]}
                if continuous:
                    chunk["usage"] = _usage(prompt_tokens, i + 1)
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
            if include_usage:
                final = {"id": "x", "model": model, "choices": [], "usage": _usage(prompt_tokens, n)}
                await response.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            self._count_usage(prompt_tokens, n)
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            raise
        return response

    def _count_usage(self, prompt: int, completion: int) -> None:
        """Add a finished generation to the usage sums (``usage_prompt_tokens``, ``usage_completion_tokens``)."""
        self.usage_prompt_tokens += prompt
        self.usage_completion_tokens += completion

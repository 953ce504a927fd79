"""A protocol-faithful fake of Ollama's HTTP API, written from its API reference (docs.ollama.com: api/generate,
api/chat, api/tags, api/ps, api/usage, api/streaming, openai compatibility), for the sidecar's tests in front of
Ollama (no Ollama server can be installed from the package registries here; ../shared/reference/engines.md §3).

- ``GET /``: ``Ollama is running`` (text/plain); ``GET /api/version``; no ``/metrics`` (404, as Go's mux answers).
- ``GET /api/tags``: the pulled models; ``GET /api/ps``: the models loaded, each ``size``, ``size_vram``,
  ``expires_at`` (``keep_alive`` 5 minutes after its last use), ``context_length``.
- ``POST /api/generate`` and ``/api/chat``: NDJSON (``application/x-ndjson``) unless ``"stream": false``; parts
  ``{"model", "created_at", "response" | "message", "done": false}``, then the final message with ``done_reason``
  (``length`` at ``options.num_predict``, default 8) and the usage fields in integer nanoseconds. The durations
  are the fake's own, measured: the first request for a model after it was unloaded sleeps ``load_s`` (a cold
  start: ``load_duration``), the prompt ``prompt_s`` (``prompt_eval_duration``), each token ``token_s``
  (``eval_duration``); ``total_duration`` spans them all. A zero duration is left out (Go's ``omitempty``).
  An unknown model answers 404 ``{"error": "model \"X\" not found, try pulling it first"}``.
- ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``: the OpenAI-compatible API (SSE, ``[DONE]``,
  usage only with ``stream_options.include_usage``, as a last chunk with ``choices: []``; ``fp_ollama``).

Run ``python -m tests.fakes.ollama_upstream --port P`` (a process of its own, as the tests start it) or use
:func:`build_app` in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

MODELS = {"tinyllama:latest": 637700138, "qwen2:0.5b": 352164041}
KEEP_ALIVE_S = 300.0
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class FakeOllama:
    """The fake's state: which models are loaded and until when."""

    def __init__(self, load_s: float = 0.3, prompt_s: float = 0.02, token_s: float = 0.01) -> None:
        self.load_s, self.prompt_s, self.token_s = load_s, prompt_s, token_s
        self.loaded_until: dict[str, float] = {}
        self._ids = itertools.count()

    async def _load(self, model: str) -> int:
        """Load the model if it is not loaded; the ns it took (0 when it was loaded)."""
        now = time.time()
        if self.loaded_until.get(model, 0.0) > now:
            self.loaded_until[model] = now + KEEP_ALIVE_S
            return 0
        started = time.perf_counter_ns()
        await asyncio.sleep(self.load_s)
        self.loaded_until[model] = time.time() + KEEP_ALIVE_S
        return time.perf_counter_ns() - started

    async def _run(self, model: str, prompt_tokens: int, tokens: int):  # type: ignore[no-untyped-def]
        """Yield ``(piece, None)`` per token, then ``(None, metrics)``: the final message's usage fields."""
        started = time.perf_counter_ns()
        load_ns = await self._load(model)
        prompt_began = time.perf_counter_ns()
        await asyncio.sleep(self.prompt_s)
        eval_began = time.perf_counter_ns()
        prompt_ns = eval_began - prompt_began
        for index in range(tokens):
            await asyncio.sleep(self.token_s)
            yield (" " if index else "") + WORDS[index % len(WORDS)], None
        eval_ns = time.perf_counter_ns() - eval_began
        metrics = {
            "total_duration": time.perf_counter_ns() - started, "load_duration": load_ns,
            "prompt_eval_count": prompt_tokens, "prompt_eval_duration": prompt_ns,
            "eval_count": tokens, "eval_duration": eval_ns,
        }
        yield None, {key: value for key, value in metrics.items() if value}  # omitempty

    @staticmethod
    def _not_found(model: Any) -> web.Response:
        return web.json_response({"error": f"model \"{model}\" not found, try pulling it first"}, status=404)

    async def native(self, request: web.Request) -> web.StreamResponse:
        """``/api/generate`` and ``/api/chat``."""
        body = await request.json()
        model = body.get("model")
        if model not in MODELS:
            return self._not_found(model)
        chat = request.path == "/api/chat"
        if chat:
            text = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        else:
            text = str(body.get("prompt", ""))
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        tokens = int(options.get("num_predict", 8))
        prompt_tokens = len(text.split()) + 1

        def part(piece: str) -> dict[str, Any]:
            head = {"model": model, "created_at": _now()}
            return {**head, "message": {"role": "assistant", "content": piece}, "done": False} if chat else {
                **head, "response": piece, "done": False}

        def final(metrics: dict[str, Any], whole: str) -> dict[str, Any]:
            message = part(whole)
            message.update(done=True, done_reason="length", **metrics)
            if not chat:
                message["context"] = list(range(prompt_tokens + tokens))
            return message

        if body.get("stream", True) is False:
            pieces = []
            async for piece, metrics in self._run(model, prompt_tokens, tokens):
                if piece is not None:
                    pieces.append(piece)
                else:
                    return web.json_response(final(metrics, "".join(pieces)))
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        async for piece, metrics in self._run(model, prompt_tokens, tokens):
            line = part(piece) if piece is not None else final(metrics, "")
            await response.write(json.dumps(line).encode() + b"\n")
        await response.write_eof()
        return response

    async def openai(self, request: web.Request) -> web.StreamResponse:
        """``/v1/chat/completions`` and ``/v1/completions``, Ollama's OpenAI compatibility."""
        body = await request.json()
        model = body.get("model")
        if model not in MODELS:
            return web.json_response({"error": {"message": f"model \"{model}\" not found, try pulling it first",
                                                "type": "api_error", "param": None, "code": None}}, status=404)
        chat = request.path == "/v1/chat/completions"
        text = (" ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
                if chat else str(body.get("prompt", "")))
        tokens, prompt_tokens = int(body.get("max_tokens", 8)), len(text.split()) + 1
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{next(self._ids) % 999}"
        head = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model, "system_fingerprint": "fp_ollama"}

        def choice(piece: str, reason: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": reason}
            return {"index": 0, "text": piece, "finish_reason": reason}

        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        if not body.get("stream"):
            pieces = [p async for p, _ in self._run(model, prompt_tokens, tokens) if p is not None]
            whole = "".join(pieces)
            answer = {**head, "object": "chat.completion" if chat else "text_completion", "usage": usage,
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": whole},
                                   "finish_reason": "length"} if chat else
                                  {"index": 0, "text": whole, "finish_reason": "length"}]}
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async for piece, _metrics in self._run(model, prompt_tokens, tokens):
            if piece is None:
                break
            await response.write(b"data: " + json.dumps({**head, "choices": [choice(piece, None)]}).encode() + b"\n\n")
        await response.write(b"data: " + json.dumps({**head, "choices": [choice("", "length")]}).encode() + b"\n\n")
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            await response.write(b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def tags(self, _request: web.Request) -> web.Response:
        """``GET /api/tags``."""
        return web.json_response({"models": [
            {"name": name, "model": name, "modified_at": "2026-11-30T10:00:00.000000000Z", "size": size,
             "digest": f"{abs(hash(name)):064x}"[:64],
             "details": {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                         "parameter_size": "1B", "quantization_level": "Q4_0"}}
            for name, size in MODELS.items()]})

    async def ps(self, _request: web.Request) -> web.Response:
        """``GET /api/ps``: the models loaded now; all of a model on the GPU but 10 %."""
        now = time.time()
        return web.json_response({"models": [
            {"name": name, "model": name, "size": MODELS[name] + 100_000_000,
             "digest": f"{abs(hash(name)):064x}"[:64],
             "details": {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"],
                         "parameter_size": "1B", "quantization_level": "Q4_0"},
             "expires_at": (datetime.now(UTC) + timedelta(seconds=until - now)).isoformat(),
             "size_vram": int((MODELS[name] + 100_000_000) * 0.9), "context_length": 4096}
            for name, until in sorted(self.loaded_until.items()) if until > now]})

    async def models(self, _request: web.Request) -> web.Response:
        """``GET /v1/models``."""
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 1764496800, "owned_by": "library"} for name in MODELS]})


async def root(_request: web.Request) -> web.Response:
    """``GET /``: Ollama's liveness text."""
    return web.Response(text="Ollama is running")


async def version(_request: web.Request) -> web.Response:
    """``GET /api/version``."""
    return web.json_response({"version": "0.12.6"})


def build_app(fake: FakeOllama | None = None) -> web.Application:
    """The fake's aiohttp application."""
    fake = fake or FakeOllama()
    app = web.Application()
    app.router.add_get("/", root)
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", fake.tags)
    app.router.add_get("/api/ps", fake.ps)
    app.router.add_post("/api/generate", fake.native)
    app.router.add_post("/api/chat", fake.native)
    app.router.add_post("/v1/chat/completions", fake.openai)
    app.router.add_post("/v1/completions", fake.openai)
    app.router.add_get("/v1/models", fake.models)
    return app


def main() -> None:
    """Serve the fake on 127.0.0.1:PORT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--load-s", type=float, default=0.3)
    args = parser.parse_args()
    web.run_app(build_app(FakeOllama(load_s=args.load_s)), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()

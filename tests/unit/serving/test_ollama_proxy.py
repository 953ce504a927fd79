"""Ollama's native API through an in-process sidecar: its error shape kept, a cut stream ended in its own shape.

The upstream is the protocol-faithful fake (tests/fakes/ollama_upstream.py), or, for the cut stream (a fault a
real server cannot be made to show), a handler that stops before Ollama's final message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from exporters.records import AnswerPhases, RequestRecord
from serving.workers import record_from_wire
from tests.fakes.ollama_upstream import FakeOllama, build_app
from tests.unit.serving.inprocess import requests_counted, start_sidecar


async def test_an_unknown_model_keeps_ollamas_error_shape_with_the_trace_id(
    aiohttp_server: Any, tmp_path: Path,
) -> None:
    """Ollama's 404 for a model it has not pulled reaches the client as Ollama writes errors (a string), with the
    type and the trace id added; it counts as a client error."""
    upstream = await aiohttp_server(build_app(FakeOllama(load_s=0.0)))
    sidecar, serving = await start_sidecar(f"http://127.0.0.1:{upstream.port}", tmp_path / "logs")
    try:
        async with sidecar.session.post(sidecar.url + "/api/generate", json={"model": "nope", "prompt": "x"}) as got:
            status, body, trace_id = got.status, json.loads(await got.read()), got.headers["x-trace-id"]
        assert status == 404
        assert body["error"] == 'model "nope" not found, try pulling it first'
        assert body["trace_id"] == trace_id
        assert requests_counted(sidecar.registry, "client_error") == 1
    finally:
        await sidecar.session.close()
        await serving.cleanup()


async def test_a_stream_cut_before_the_final_message_ends_with_an_ndjson_error_line(
    aiohttp_server: Any, tmp_path: Path,
) -> None:
    """Two parts and no done message: the client gets both parts, then one JSON line naming the failure; the
    request is an upstream error."""

    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for piece in ("a", "b"):
            await response.write(json.dumps({"model": "m", "response": piece, "done": False}).encode() + b"\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/api/generate", cut)
    upstream = await aiohttp_server(app)
    sidecar, serving = await start_sidecar(f"http://127.0.0.1:{upstream.port}", tmp_path / "logs")
    try:
        async with sidecar.session.post(sidecar.url + "/api/generate", json={"model": "m", "prompt": "x"}) as got:
            lines = [json.loads(line) for line in (await got.read()).splitlines()]
        assert [line.get("response") for line in lines[:2]] == ["a", "b"]
        assert lines[2]["type"] == "upstream_stream_truncated"
        assert "final done message" in lines[2]["error"]
        assert requests_counted(sidecar.registry, "upstream_error") == 1
    finally:
        await sidecar.session.close()
        await serving.cleanup()


def test_a_secondary_workers_record_keeps_the_answers_engine_phases() -> None:
    """serve --workers N: a record sent to the primary as JSON comes back with its AnswerPhases, not a dict."""
    phases = AnswerPhases("ollama", prefill_s=0.02, decode_s=0.1, load_s=0.3, total_s=0.43, prompt_tokens=3,
                          generated_tokens=8)
    record = RequestRecord(trace_id="ab" * 16, span_id="cd" * 8, route="/api/generate", answer_phases=phases)
    assert record_from_wire(orjson.loads(orjson.dumps(record))).answer_phases == phases

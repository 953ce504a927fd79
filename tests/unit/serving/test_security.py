"""Security on the request path: no-store answers, no secret or prompt text in any output, HMAC, NFC, admin."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from log_pipeline.chain import configure_logging
from log_pipeline.query import Archive
from serving.admin import admin_guard
from serving.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from tests.fakes.faulty_upstream import FaultyUpstream, ThreadedServer
from tests.unit.serving.inprocess import Sidecar, send, start_sidecar, wait_for

SECRET = "sk-inferwatch-test-7f3c9a1e5b"
PROMPT = "the quick violet walrus recites 88 sonnets"


@pytest.fixture(name="fast", scope="module")
def _fast() -> Iterator[tuple[ThreadedServer, FaultyUpstream]]:
    fake = FaultyUpstream()
    with ThreadedServer(fake.app) as server:
        yield server, fake


@pytest.fixture(name="diagnostics")
def _diagnostics() -> Iterator[io.StringIO]:
    """The sidecar's own logs, configured as ``serve`` configures them, captured."""
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    configure_logging("debug", stream=stream, cache=False)
    yield stream
    structlog.reset_defaults()
    root.handlers[:], root.level = saved


async def test_every_proxied_answer_is_no_store_unless_the_upstream_chose(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path
) -> None:
    """Streams, JSON answers and errors get Cache-Control: no-store; an upstream's own value is kept."""
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    try:
        for answer in (await send(sidecar, None, stream=True), await send(sidecar, None, stream=False),
                       await send(sidecar, "error_500_json", stream=False)):
            assert answer.headers["Cache-Control"] == "no-store"
        async with sidecar.session.get(sidecar.url + "/v1/models") as response:
            assert response.headers["Cache-Control"] == "no-store"
        own = await send(sidecar, "own_cache_control", stream=False)
        assert own.headers.getall("Cache-Control") == ["private, max-age=5"]
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_no_secret_or_prompt_text_in_any_output(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path, diagnostics: io.StringIO
) -> None:
    """A unique secret in every credential header and a unique prompt never reach logs, spans or metrics.

    Requests succeed, fail upstream, fail mid-stream and quote the prompt in a validation
    error; then the archive, the diagnostics on stderr, every span and /metrics (with exemplars)
    are searched for both strings. The upstream still receives the Authorization header.
    """
    server, fake = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    headers = {"Authorization": f"Bearer {SECRET}", "Proxy-Authorization": f"Basic {SECRET}",
               "Cookie": f"session={SECRET}", "X-Api-Key": SECRET, "api-key": SECRET}
    try:
        for fault, stream in [(None, True), (None, False), ("error_500_json", False), ("reset_mid_stream", True),
                              ("echo_prompt_400", False), ("reset_before_status", False)]:
            for chat in (False, True):
                answer = await send(sidecar, fault, stream=stream, chat=chat, prompt=PROMPT, headers=headers)
                await wait_for(lambda a=answer: any(Archive(sidecar.logs).find(a.headers["x-trace-id"])), 5.0)
        assert any(r["headers"].get("Authorization") == f"Bearer {SECRET}" for r in fake.requests)
        async with sidecar.session.get(sidecar.url + "/metrics",
                                       headers={"Accept": "application/openmetrics-text; version=1.0.0"}) as r:
            metrics = await r.text()
        assert "trace_id=" in metrics  # exemplars were rendered, and searched
        records = json.dumps(list(Archive(sidecar.logs).records()))
        assert records.count('"trace_id"') >= 12
        spans = sidecar.spans.get_finished_spans()
        assert len(spans) >= 12
        span_text = json.dumps([s.to_json() for s in spans])
        logs = diagnostics.getvalue()
        assert "upstream_disconnected" in logs  # the failures were logged, and searched
        for name, text in [("log records", records), ("diagnostics", logs), ("spans", span_text),
                           ("/metrics", metrics)]:
            assert SECRET not in text, f"the secret leaked into {name}"
            assert PROMPT not in text, f"the prompt text leaked into {name}"
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_diagnostics_carry_the_trace_id_of_the_request(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path, diagnostics: io.StringIO
) -> None:
    """A failure logged while serving a request is a JSON line with that request's trace id."""
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    try:
        answer = await send(sidecar, "reset_before_status", stream=False)
        lines = [json.loads(line) for line in diagnostics.getvalue().splitlines()]
        (line,) = [entry for entry in lines if entry["event"] == "upstream_disconnected"]
        assert line["trace_id"] == answer.headers["x-trace-id"]
        assert line["level"] == "warning"
    finally:
        await sidecar.session.close()
        await runner.cleanup()


KEY = b"0123456789abcdef-shared-key"


@pytest.fixture(name="signed_sidecar")
async def _signed_sidecar(fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path) -> AsyncIterator[Sidecar]:
    server, _ = fast
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(KEY + b"\n")
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs", hmac_key_file=str(key_file))
    yield sidecar
    await sidecar.session.close()
    await runner.cleanup()


async def _post_signed(sidecar: Sidecar, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    async with sidecar.session.post(sidecar.url + "/v1/completions", data=body,
                                    headers={"Content-Type": "application/json", **headers}) as response:
        return response.status, await response.json()


async def test_hmac_signatures_are_verified(signed_sidecar: Sidecar) -> None:
    """A good signature passes once; a missing, wrong, stale or replayed one gets 401 with a JSON error."""
    body = json.dumps({"model": "fake-model", "prompt": "hi", "max_tokens": 2}).encode()
    now = int(time.time())

    def headers(timestamp: int, signed_body: bytes = body) -> dict[str, str]:
        return {TIMESTAMP_HEADER: str(timestamp),
                SIGNATURE_HEADER: sign(KEY, "POST", "/v1/completions", timestamp, signed_body)}

    good = headers(now)
    status, answer = await _post_signed(signed_sidecar, body, good)
    assert status == 200
    assert answer["usage"]["completion_tokens"] == 2
    for sent_headers, problem in [
        ({}, "missing"),
        (headers(now, b"{}"), "does not match"),
        (headers(now - 400), "behind the sidecar's clock"),
        (good, "replay"),
    ]:
        status, answer = await _post_signed(signed_sidecar, body, sent_headers)
        assert status == 401
        assert answer["error"]["type"] == "unauthorized"
        assert problem in answer["error"]["message"]
        assert len(answer["error"]["trace_id"]) == 32


async def test_nfc_normalization_is_opt_in_and_counted(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path
) -> None:
    """With serve.normalize_unicode the upstream receives NFC text and the change is counted; off, nothing changes."""
    server, fake = fast
    decomposed = "cafe\u0301 \u1100\u1161"  # é and 가 as combining sequences
    for enabled, expected in [(False, decomposed), (True, "caf\u00e9 \uac00")]:
        sidecar, runner = await start_sidecar(server.url, tmp_path / f"logs-{enabled}", normalize_unicode=enabled)
        try:
            await send(sidecar, None, stream=False, chat=True, prompt=decomposed)
            assert fake.requests[-1]["body"]["messages"][0]["content"] == expected
            await send(sidecar, None, stream=False, prompt="already NFC")
            normalized = sidecar.registry.get_sample_value("inferwatch_requests_normalized_total")
            assert normalized == (1.0 if enabled else 0.0)
        finally:
            await sidecar.session.close()
            await runner.cleanup()


async def test_admin_endpoints_answer_loopback_or_the_bearer_token(tmp_path: Path) -> None:
    """/admin/* is open to loopback clients; others need the configured bearer token (401), or get 403 without one."""

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    token = b"admin-token-0123456789"
    remote = make_mocked_request("GET", "/admin/alerts").clone(remote="192.0.2.7")
    with_token = make_mocked_request("GET", "/admin/alerts", headers={"Authorization": "Bearer admin-token-0123456789"}
                                     ).clone(remote="192.0.2.7")
    wrong = make_mocked_request("GET", "/admin/alerts", headers={"Authorization": "Bearer nope"}).clone(
        remote="192.0.2.7")
    local = make_mocked_request("GET", "/admin/alerts").clone(remote="127.0.0.1")
    api = make_mocked_request("GET", "/v1/models").clone(remote="192.0.2.7")
    guarded = admin_guard(token)
    assert (await guarded(remote, handler)).status == 401
    assert (await guarded(wrong, handler)).status == 401
    assert (await guarded(with_token, handler)).status == 200
    assert (await guarded(local, handler)).status == 200
    assert (await guarded(api, handler)).status == 200
    assert (await admin_guard(None)(remote, handler)).status == 403


async def test_admin_alerts_over_loopback(fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path) -> None:
    """GET /admin/alerts from loopback lists the embedded engine's alerts as JSON."""
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    try:
        async with sidecar.session.get(sidecar.url + "/admin/alerts") as response:
            assert response.status == 200
            body = await response.json()
        assert body["enabled"] is True
        assert isinstance(body["alerts"], list)
    finally:
        await sidecar.session.close()
        await runner.cleanup()


def test_admin_token_shorter_than_16_bytes_is_a_config_error(tmp_path: Path) -> None:
    """A short admin token file is refused at start-up with the key named."""
    from exporters.errors import ConfigError
    from serving import config as cfg
    from serving.app import build_app

    short = tmp_path / "token"
    short.write_text("short")
    with pytest.raises(ConfigError, match=r"serve\.admin_token_file"):
        build_app(cfg.replace(cfg.defaults(), "serve", admin_token_file=str(short)))



@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_spans_follow_the_genai_conventions(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path, stream: bool
) -> None:
    """A chat completion's span carries OpenTelemetry's GenAI attributes, with what the upstream answered."""
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    try:
        answer = await send(sidecar, None, stream=stream, chat=True, max_tokens=4)
        (span,) = [s for s in sidecar.spans.get_finished_spans()
                   if format(s.context.trace_id, "032x") == answer.headers["x-trace-id"]]
        attributes = dict(span.attributes or {})
        host, port = server.url.removeprefix("http://").split(":")
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "vllm"
        assert attributes["gen_ai.request.model"] == "fake-model"
        assert attributes["gen_ai.response.model"] == "fake-model"
        assert attributes["gen_ai.usage.input_tokens"] == 7
        assert attributes["gen_ai.usage.output_tokens"] == 4
        assert attributes["gen_ai.response.finish_reasons"] == ("length",)
        assert (attributes["server.address"], attributes["server.port"]) == (host, int(port))
        assert "error.type" not in attributes
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_an_upstream_cookie_never_reaches_another_clients_request(tmp_path: Path) -> None:
    """The sidecar's one upstream session keeps no cookie jar: a Set-Cookie goes to its client, and
    is not replayed on the next client's request (one client's session would become everyone's)."""
    seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.json_response({"object": "list", "data": []})
        response.set_cookie("session", "alice")
        return response

    upstream = web.Application()
    upstream.router.add_get("/v1/models", answer)
    with ThreadedServer(upstream) as server:
        # by name, as in compose or Kubernetes (aiohttp's jar ignores cookies of IP addresses)
        sidecar, runner = await start_sidecar(server.url.replace("127.0.0.1", "localhost"), tmp_path / "logs")
        try:
            for _ in range(2):  # a fresh client each time
                async with aiohttp.ClientSession() as client, client.get(sidecar.url + "/v1/models") as response:
                    assert response.cookies["session"].value == "alice"  # the client gets its cookie
        finally:
            await sidecar.session.close()
            await runner.cleanup()
    assert seen[-2:] == [None, None]

"""The proxy against an in-process fake upstream: pass-through, measurement, tracing and failures."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from exporters.catalog import request
from serving import config as cfg
from serving.app import INFLIGHT, build_app
from tests.fakes.openai_upstream import PROMPT_TOKENS, FakeOpenAI

Clients = Callable[..., Awaitable[TestClient]]


@pytest.fixture(name="fake")
def _fake() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture(name="setup")
async def _setup(
    fake: FakeOpenAI, aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients
) -> tuple[TestClient, CollectorRegistry, web.Application]:
    upstream = await aiohttp_server(fake.app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           read_timeout_s=1.0)
    registry = CollectorRegistry()
    app = build_app(settings, registry)
    client = await aiohttp_client(app)
    return client, registry, app


UPSTREAM_LABELLED = frozenset(name for spec in request.SPECS if "lane" in spec.labels for name in spec.sample_names())
"""Samples of the request families, which carry ``lane`` and ``role`` (one upstream here: default, primary)."""


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    if name in UPSTREAM_LABELLED:
        labels = {"lane": "default", "role": "primary", **labels}
    return registry.get_sample_value(name, labels) or 0.0


async def test_streamed_chat_passes_through_and_is_measured(setup: Any, fake: FakeOpenAI) -> None:
    """A streamed chat completion arrives intact, without the injected usage, and is counted with its tokens."""
    client, registry, _ = setup
    response = await client.post("/v1/chat/completions", json={
        "model": "m", "stream": True, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    text = await response.text()
    assert response.status == 200
    assert len(response.headers["x-trace-id"]) == 32
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert len(chunks) == 5
    assert all("usage" not in c for c in chunks)
    sent = fake.requests[-1]["body"]["stream_options"]
    assert sent == {"include_usage": True}  # the final usage chunk only: nothing per chunk costs vLLM
    labels = {"model_name": "m", "route": "/v1/chat/completions"}
    assert _sample(registry, "inferwatch_requests_total", outcome="ok", length_bucket="le512", **labels) == 1
    assert _sample(registry, "inferwatch_completion_tokens_total", **labels) == 5
    assert _sample(registry, "inferwatch_prompt_tokens_total", **labels) == PROMPT_TOKENS
    assert _sample(registry, "inferwatch_inter_token_latency_seconds_count", length_bucket="le512", **labels) == 4
    ttft = _sample(registry, "inferwatch_time_to_first_token_seconds_sum", length_bucket="le512", **labels)
    e2e = _sample(registry, "inferwatch_e2e_request_latency_seconds_sum", outcome="ok", length_bucket="le512",
                  **labels)
    assert 0 < ttft <= e2e


async def test_client_usage_request_is_honoured(setup: Any) -> None:
    """A client that asked for include_usage receives the usage chunk."""
    client, _, _ = setup
    response = await client.post("/v1/completions", json={
        "model": "m", "stream": True, "max_tokens": 3, "prompt": "x", "stream_options": {"include_usage": True}})
    events = [e for e in (await response.text()).split("\n\n") if e and e != "data: [DONE]"]
    assert json.loads(events[-1][6:])["usage"]["completion_tokens"] == 3
    assert all("usage" not in json.loads(e[6:]) for e in events[:-1])


async def test_non_streaming_counts_usage(setup: Any) -> None:
    """A non-streamed completion is returned unchanged and its usage counted."""
    client, registry, _ = setup
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 4})
    body = await response.json()
    assert body["usage"]["completion_tokens"] == 4
    assert _sample(registry, "inferwatch_completion_tokens_total", model_name="m", route="/v1/completions") == 4


async def test_incoming_traceparent_is_continued_and_forwarded(setup: Any, fake: FakeOpenAI) -> None:
    """A valid traceparent keeps its trace id, which is returned and forwarded upstream with a new parent."""
    client, _, _ = setup
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1},
                                 headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})
    assert response.headers["x-trace-id"] == trace_id
    forwarded = fake.requests[-1]["headers"]["traceparent"]
    assert forwarded.split("-")[1] == trace_id
    assert forwarded.split("-")[2] != "b7ad6b7169203331"


async def test_invalid_traceparent_starts_a_new_trace(setup: Any, fake: FakeOpenAI) -> None:
    """A malformed traceparent is ignored: the request is served under a new trace id."""
    client, _, _ = setup
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1},
                                 headers={"traceparent": "00-zz-not-valid"})
    assert response.status == 200
    new_id = response.headers["x-trace-id"]
    assert len(new_id) == 32
    assert fake.requests[-1]["headers"]["traceparent"].split("-")[1] == new_id


async def test_malformed_json_is_a_400_with_a_json_error(setup: Any, fake: FakeOpenAI) -> None:
    """A malformed body is refused with 400 and a JSON error, and never reaches the upstream."""
    client, registry, _ = setup
    response = await client.post("/v1/chat/completions", data=b"{oops", headers={"Content-Type": "application/json"})
    assert response.status == 400
    body = await response.json()
    assert "malformed JSON" in body["error"]["message"]
    assert response.headers["x-trace-id"] == body["error"]["trace_id"]
    assert fake.requests == []
    assert _sample(registry, "inferwatch_requests_total", model_name="unknown", route="/v1/chat/completions",
                   outcome="client_error", length_bucket="unknown") == 1


@pytest.mark.parametrize(
    ("model", "status", "outcome"),
    [("fail", 500, "upstream_error"), ("overloaded", 503, "overloaded"), ("oom", 500, "upstream_error")],
    ids=["a 500 is an upstream error", "a 503 is overload", "an OOM 500 is an upstream error"],
)
async def test_upstream_error_statuses_are_classified(setup: Any, model: str, status: int, outcome: str) -> None:
    """Upstream error statuses pass through with x-trace-id and are counted by outcome class."""
    client, registry, _ = setup
    response = await client.post("/v1/completions", json={"model": model, "prompt": "x"})
    assert response.status == status
    assert response.headers["x-trace-id"]
    assert _sample(registry, "inferwatch_requests_total", model_name="other", route="/v1/completions",
                   outcome=outcome, length_bucket="le512") == 1


async def test_stalled_upstream_is_a_timeout(setup: Any) -> None:
    """An upstream that never answers gives 504 within the read timeout, counted as timeout."""
    client, registry, _ = setup
    response = await client.post("/v1/completions", json={"model": "stall", "prompt": "x"})
    assert response.status == 504
    assert (await response.json())["error"]["type"] == "upstream_timeout"
    assert _sample(registry, "inferwatch_requests_total", model_name="other", route="/v1/completions",
                   outcome="timeout", length_bucket="le512") == 1


async def test_a_long_prompt_that_fails_before_its_usage_keeps_its_class(setup: Any) -> None:
    """A request that fails before vLLM's usage (here: times out) is classed by the sidecar's estimate of its prompt,
    not ``unknown``: a 32k prompt that times out in prefill, the typical 32k failure, counts in the 32k class."""
    client, registry, _ = setup
    prompt = "word " * 20_000  # 100,000 characters: about 25,000 tokens at four characters a token
    response = await client.post("/v1/completions", json={"model": "stall", "prompt": prompt})
    assert response.status == 504
    assert _sample(registry, "inferwatch_requests_total", model_name="other", route="/v1/completions",
                   outcome="timeout", length_bucket="16k-32k") == 1


async def test_broken_stream_is_an_upstream_error(setup: Any) -> None:
    """A stream the upstream cuts short ends with an error event and counts as upstream_error."""
    client, registry, _ = setup
    response = await client.post("/v1/completions", json={"model": "break", "prompt": "x", "stream": True,
                                                          "max_tokens": 10})
    text = await response.text()
    assert '"upstream_stream_broken"' in text
    assert _sample(registry, "inferwatch_requests_total", model_name="break", route="/v1/completions",
                   outcome="upstream_error", length_bucket="le512") == 1


async def test_upstream_down_is_a_502_naming_it(aiohttp_client: Clients) -> None:
    """With nothing listening upstream the proxy answers 502 with a JSON error naming the upstream."""
    settings = cfg.replace(cfg.defaults(), "serve", upstream="http://127.0.0.1:9", connect_timeout_s=1.0)
    registry = CollectorRegistry()
    client = await aiohttp_client(build_app(settings, registry))
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
    assert response.status == 502
    body = await response.json()
    assert body["error"]["upstream"] == "http://127.0.0.1:9"
    assert "unreachable" in body["error"]["message"]
    assert response.headers["x-trace-id"] == body["error"]["trace_id"]
    assert _sample(registry, "inferwatch_requests_total", model_name="other", route="/v1/completions",
                   outcome="upstream_error", length_bucket="le512") == 1
    ready = await client.get("/readyz")
    assert ready.status == 503


async def test_models_and_other_paths_pass_through(setup: Any) -> None:
    """GET /v1/models is proxied unchanged."""
    client, _, _ = setup
    response = await client.get("/v1/models")
    assert (await response.json())["data"][0]["id"] == "fake-model"
    assert response.headers["x-trace-id"]


async def test_metrics_negotiates_openmetrics_with_exemplars(setup: Any) -> None:
    """/metrics is Prometheus text by default and OpenMetrics with trace_id exemplars on request."""
    client, _, _ = setup
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
    trace_id = response.headers["x-trace-id"]
    plain = await client.get("/metrics")
    assert plain.headers["Content-Type"].startswith("text/plain")
    assert "# {" not in await plain.text()
    om = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert f'# {{trace_id="{trace_id}"}}' in await om.text()


async def test_client_disconnect_cancels_the_upstream(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> None:
    """A client that leaves mid-stream makes the sidecar drop the upstream request, counted as cancelled."""
    import aiohttp

    fake = FakeOpenAI(token_delay_s=0.05)
    upstream = await aiohttp_server(fake.app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"))
    registry = CollectorRegistry()
    app = build_app(settings, registry)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session, session.post(f"http://127.0.0.1:{port}/v1/completions",
                                json={"model": "m", "prompt": "x", "stream": True, "max_tokens": 200}) as r:
            await r.content.readline()
        for _ in range(100):
            if fake.cancelled:
                break
            await asyncio.sleep(0.05)
        assert fake.cancelled == 1
        assert app[INFLIGHT].snapshot() == []
        for _ in range(50):
            if _sample(registry, "inferwatch_requests_total", model_name="m", route="/v1/completions",
                       outcome="cancelled", length_bucket="le512"):
                break
            await asyncio.sleep(0.05)
        assert _sample(registry, "inferwatch_requests_total", model_name="m", route="/v1/completions",
                       outcome="cancelled", length_bucket="le512") == 1
    finally:
        await runner.cleanup()


async def _exact_setup(
    fake: FakeOpenAI, aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients
) -> tuple[TestClient, web.Application]:
    upstream = await aiohttp_server(fake.app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           exact_live_token_counts=True)
    app = build_app(settings, CollectorRegistry())
    return await aiohttp_client(app), app


async def test_exact_mode_counts_a_non_streamed_prompt_with_tokenize(
    fake: FakeOpenAI, aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients
) -> None:
    """With serve.exact_live_token_counts, a non-streamed request sits in the table with its /tokenize count."""
    client, app = await _exact_setup(fake, aiohttp_server, aiohttp_client)
    pending = asyncio.ensure_future(client.post("/v1/completions", json={"model": "slow", "prompt": "p"}))
    seen: list[int] = []
    for _ in range(40):
        seen = [entry.tokens for entry in app[INFLIGHT].snapshot()]
        if seen:
            break
        await asyncio.sleep(0.02)
    assert seen == [PROMPT_TOKENS]
    assert fake.tokenize_calls == 1
    response = await pending
    assert response.status == 200
    assert app[INFLIGHT].snapshot() == []


async def test_exact_mode_asks_for_usage_on_every_chunk_and_strips_it(
    fake: FakeOpenAI, aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients
) -> None:
    """With serve.exact_live_token_counts, streams ask for continuous usage; the client still sees none."""
    client, _ = await _exact_setup(fake, aiohttp_server, aiohttp_client)
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True,
                                                          "max_tokens": 4})
    events = [e for e in (await response.text()).split("\n\n") if e and e != "data: [DONE]"]
    assert fake.requests[-1]["body"]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert len(events) == 4
    assert all("usage" not in json.loads(e[6:]) for e in events)


async def test_estimated_mode_calls_nothing_extra_and_learns_the_prompt_size(setup: Any, fake: FakeOpenAI) -> None:
    """By default no /tokenize call is made; the live table holds an estimate that learns from usage.

    The fake counts every prompt as PROMPT_TOKENS tokens: after a few finished requests the
    estimate for a prompt of the same length converges towards that count.
    """
    client, _, app = setup
    prompt = "p" * 70  # the fake says 7 tokens: 0.1 token per character, the default guess is 0.25
    estimates = []
    for _ in range(30):
        pending = asyncio.ensure_future(client.post("/v1/completions", json={"model": "slow", "prompt": prompt}))
        seen: list[int] = []
        deadline = time.monotonic() + 10.0  # a busy machine (xdist workers) may take a while to send it
        while not seen and not pending.done() and time.monotonic() < deadline:
            seen = [entry.tokens for entry in app[INFLIGHT].snapshot()]
            await asyncio.sleep(0.005)
        assert seen, "the request never showed in the live table while it ran"
        estimates.append(seen[0])
        assert (await pending).status == 200
    assert fake.tokenize_calls == 0
    assert estimates[0] == round(70 * 0.25)
    assert abs(estimates[-1] - PROMPT_TOKENS) <= 1


async def test_a_stream_in_the_live_table_grows_with_its_chunks(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients
) -> None:
    """While a stream runs, its live size is the prompt estimate plus the content chunks streamed so far."""
    fake = FakeOpenAI(token_delay_s=0.02)
    upstream = await aiohttp_server(fake.app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"))
    app = build_app(settings, CollectorRegistry())
    client = await aiohttp_client(app)
    response = await client.post("/v1/completions", json={"model": "m", "prompt": "p" * 40, "stream": True,
                                                          "max_tokens": 30})
    sizes = []
    async for _line in response.content:
        sizes += [entry.tokens for entry in app[INFLIGHT].snapshot()]
    assert sizes[0] >= round(40 * 0.25)
    assert max(sizes) == round(40 * 0.25) + 30 or max(sizes) == round(40 * 0.25) + 29
    assert sizes == sorted(sizes)
    assert app[INFLIGHT].snapshot() == []


async def test_live_token_counts_can_be_turned_off(
    fake: FakeOpenAI, aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Clients
) -> None:
    """With serve.live_token_counts off, streams ask only for the final usage and nothing is tokenized."""
    upstream = await aiohttp_server(fake.app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           live_token_counts=False)
    client = await aiohttp_client(build_app(settings, CollectorRegistry()))
    await (await client.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True})).read()
    await (await client.post("/v1/completions", json={"model": "m", "prompt": "x"})).read()
    assert fake.requests[0]["body"]["stream_options"] == {"include_usage": True}
    assert len(fake.requests) == 2
    assert fake.tokenize_calls == 0


async def test_a_slow_client_gets_a_long_stream_whole(
    aiohttp_server: Callable[..., Awaitable[TestServer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that reads slowly: the relay waits for its socket to drain, and every event arrives in order."""
    import socket

    from serving import upstream_http

    fake = FakeOpenAI()
    upstream = await aiohttp_server(fake.app())
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"))
    app = build_app(settings, CollectorRegistry())
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # accepted sockets inherit it: the
    listener.bind(("127.0.0.1", 0))  # kernel holds little, so the sidecar's own writes back up
    port = listener.getsockname()[1]
    await web.SockSite(runner, listener).start()
    relays = 0
    relay = upstream_http.UpstreamConnection.relay

    async def counted(self: upstream_http.UpstreamConnection, sink: Callable[[bytes], bool]) -> bool:
        nonlocal relays
        relays += 1
        return await relay(self, sink)

    monkeypatch.setattr(upstream_http.UpstreamConnection, "relay", counted)
    tokens = 20_000  # about 2.5 MB of events
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
        body = json.dumps({"model": "m", "prompt": "x", "stream": True, "max_tokens": tokens}).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await asyncio.sleep(0.5)  # the client reads nothing for a while: the sidecar's writes back up
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        assert head.startswith(b"HTTP/1.1 200")
        assert b"chunked" in head.lower()
        events = []
        while True:  # undo the chunk framing, then split the events
            size = int((await asyncio.wait_for(reader.readline(), 10.0)).strip(), 16)
            if size == 0:
                break
            events.append(await reader.readexactly(size))
            assert await reader.readexactly(2) == b"\r\n"
        writer.close()
        texts = [json.loads(event[6:])["choices"][0]["text"] for event in b"".join(events).split(b"\n\n")
                 if event.startswith(b"data: {")]
        assert texts == [f" w{i}" for i in range(tokens)]
        assert b"".join(events).endswith(b"data: [DONE]\n\n")
        assert relays > 1, "the client's socket never filled: the test did not exercise the drain"
    finally:
        await runner.cleanup()

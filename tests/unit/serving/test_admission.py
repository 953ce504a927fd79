"""Overload and client faults: the in-flight limit, load shedding, slow clients, bad bodies, label caps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving import config as cfg
from serving.app import PROXY
from serving.proxy import KNOWN_ROUTES, MAX_MODEL_LABELS
from tests.fakes.faulty_upstream import FAULT_HEADER, FaultyUpstream, ThreadedServer
from tests.unit.serving.inprocess import requests_counted, send, sse_events, start_sidecar, wait_for


@pytest.fixture(name="paced", scope="module")
def _paced() -> Iterator[ThreadedServer]:
    """An upstream streaming a token every 20 ms (40 tokens: most of a second per stream)."""
    with ThreadedServer(FaultyUpstream(token_delay_s=0.02, record=False).app) as server:
        yield server


@pytest.fixture(name="fast", scope="module")
def _fast() -> Iterator[tuple[ThreadedServer, FaultyUpstream]]:
    fake = FaultyUpstream()
    with ThreadedServer(fake.app) as server:
        yield server, fake


async def test_past_max_inflight_new_requests_get_503_and_running_ones_finish(
    paced: ThreadedServer, tmp_path: Path
) -> None:
    """With serve.max_inflight=2, a third request is refused at once; the two running streams complete."""
    sidecar, runner = await start_sidecar(paced.url, tmp_path / "logs", max_inflight=2, request_timeout_s=0.0)
    try:
        running = [asyncio.ensure_future(send(sidecar, None, stream=True, max_tokens=40)) for _ in range(2)]
        assert await wait_for(lambda: sidecar.app[PROXY].active == 2)
        refused = await send(sidecar, None, stream=True)
        assert refused.status == 503
        assert refused.headers["Retry-After"] == "1"
        error = json.loads(refused.body)["error"]
        assert error["type"] == "sidecar_overloaded"
        assert error["trace_id"] == refused.headers["x-trace-id"]
        assert "serve.max_inflight" in error["message"]
        assert requests_counted(sidecar.registry, "overloaded") == 1
        for answer in await asyncio.gather(*running):
            events = sse_events(answer.body)
            assert answer.status == 200
            assert events[-1] == "[DONE]"
            assert len(events) == 41
        assert (await send(sidecar, None, stream=False)).status == 200
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_degraded_model_sheds_low_priority_requests(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path
) -> None:
    """Errors fire the embedded engine's degrade alert for the model; then its low-priority requests get 503.

    The circuit breaker runs on a 10 s window holding at least 10 requests, evaluated every second,
    with no ``for``, so the real rule fires within a few seconds of the errors. High-priority
    requests and other models pass.
    """
    server, _ = fast
    settings = cfg.replace(cfg.defaults(), "rules", breaker_window_s=10.0, breaker_for_s=0.0,
                           breaker_min_requests=10, evaluation_interval_s=1.0)
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs", settings=settings, shed_on_degrade=True,
                                          readiness_interval_s=1.0)
    try:
        for _ in range(5):
            assert (await send(sidecar, None, stream=False)).status == 200

        async def degraded() -> bool:
            await send(sidecar, "error_500_json", stream=False)
            async with sidecar.session.get(sidecar.url + "/admin/alerts") as response:
                alerts = (await response.json())["alerts"]
            return any(a["labels"].get("alertname") == "InferwatchCircuitBreakerDegrade"
                       and a["labels"].get("model_name") == "fake-model" and a["state"] == "firing" for a in alerts)

        for _ in range(40):
            if await degraded():
                break
            await asyncio.sleep(0.25)
        else:
            pytest.fail("the degrade alert never fired in the embedded engine")
        await asyncio.sleep(1.2)  # the shedding snapshot is refreshed at the end of each cycle
        shed = await send(sidecar, None, stream=True)
        assert shed.status == 503
        assert shed.headers["Retry-After"] == "1"
        assert json.loads(shed.body)["error"]["type"] == "load_shed"
        kept = await send(sidecar, None, stream=True, headers={"x-priority": "5"})
        assert kept.status == 200
        other = await send(sidecar, None, stream=False, model="other-model")
        assert other.status == 200
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_shedding_is_off_by_default(fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path) -> None:
    """Without serve.shed_on_degrade, a degraded model's low-priority requests still pass."""
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    try:
        sidecar.app[PROXY]._admission._degraded_models = lambda: frozenset({"fake-model"})
        assert (await send(sidecar, None, stream=False)).status == 200
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_slow_request_head_is_cut_off(fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path) -> None:
    """A client that never finishes its headers is disconnected after serve.client_header_timeout_s."""
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs", client_header_timeout_s=0.5)
    try:
        host, port = sidecar.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        await writer.drain()
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed by the sidecar, nothing answered
        assert asyncio.get_running_loop().time() - started < 2.0
        writer.close()
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_slow_request_body_gets_408(fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path) -> None:
    """A body that stops arriving is answered 408 with a JSON error after serve.client_body_timeout_s."""
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs", client_body_timeout_s=0.5)
    try:
        host, port = sidecar.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": ")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        assert head.startswith(b"HTTP/1.1 408")
        assert b"x-trace-id" in head.lower()
        writer.close()
        assert requests_counted(sidecar.registry, "client_error") == 1
    finally:
        await sidecar.session.close()
        await runner.cleanup()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_the_limit_is_a_413_json_error(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path, chunked: bool
) -> None:
    """A body over serve.max_body_bytes gets the sidecar's 413 with the JSON error and x-trace-id."""
    server, fake = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs", max_body_bytes=1000)
    try:
        body = json.dumps({"model": "fake-model", "prompt": "x" * 5000}).encode()

        async def chunks() -> object:
            for i in range(0, len(body), 500):
                yield body[i:i + 500]

        before = len(fake.requests)
        async with sidecar.session.post(sidecar.url + "/v1/completions", data=chunks() if chunked else body,
                                        headers={"Content-Type": "application/json"}) as response:
            assert response.status == 413
            error = (await response.json())["error"]
        assert error["type"] == "request_too_large"
        assert error["trace_id"] == response.headers["x-trace-id"]
        assert "serve.max_body_bytes" in error["message"]
        assert len(fake.requests) == before
    finally:
        await sidecar.session.close()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"model": "m", "prompt": ', "not valid JSON"),
        (b'{"model": "m", "prompt": "caf\xe9"}', "not valid UTF-8"),
        (b'{"model": "m", "prompt": "\\ud800 alone"}', "surrogate"),
        (b'{"model": "m", "prompt": ' + b"[" * 70 + b"]" * 70 + b"}", "nested deeper than 64"),
        (b'["not", "an", "object"]', "JSON object"),
    ],
    ids=["invalid JSON", "not UTF-8", "unpaired surrogate", "too deep", "not an object"],
)
async def test_bad_bodies_are_400_naming_the_problem(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path, body: bytes, named: str
) -> None:
    """Each bad body is refused with 400, a JSON error naming its problem, and never reaches the upstream."""
    server, fake = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    try:
        before = len(fake.requests)
        async with sidecar.session.post(sidecar.url + "/v1/completions", data=body,
                                        headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
            error = (await response.json())["error"]
        assert named in error["message"]
        assert error["trace_id"] == response.headers["x-trace-id"]
        assert len(fake.requests) == before
        assert requests_counted(sidecar.registry, "client_error") == 1
    finally:
        await sidecar.session.close()
        await runner.cleanup()


async def test_label_cardinality_stays_within_the_documented_caps(
    fast: tuple[ThreadedServer, FaultyUpstream], tmp_path: Path
) -> None:
    """2,000 distinct model names, routes and header values never create more series than the caps allow.

    Caps: at most MAX_MODEL_LABELS models the upstream accepted plus ``unknown`` and ``other``;
    routes are the known ones or ``other``; headers are never labels. Each of the three kinds of
    request keeps its route, outcome and length bucket fixed, so the caps allow each kind at most one
    counted series per model label; the run sends about 667 of each kind, so a broken cap shows.
    """
    server, _ = fast
    sidecar, runner = await start_sidecar(server.url, tmp_path / "logs")
    sent_models: set[str] = set()
    sent_routes: set[str] = set()
    sent_agents: set[str] = set()
    try:
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                kind = i % 3
                if kind == 0:
                    sent_models.add(f"model-{i}")
                    await send(sidecar, None, stream=False, model=f"model-{i}", max_tokens=1)
                elif kind == 1:
                    sent_routes.add(f"/v1/route-{i}")
                    async with sidecar.session.get(f"{sidecar.url}/v1/route-{i}") as response:
                        await response.read()
                else:
                    sent_agents.add(f"client-{i}")
                    await send(sidecar, None, stream=False, max_tokens=1,
                               headers={"x-priority": str(i), "user-agent": f"client-{i}", FAULT_HEADER: "nope"})

        await asyncio.gather(*(one(i) for i in range(2000)))
        async with sidecar.session.get(sidecar.url + "/metrics") as response:
            text = await response.text()
        label_values = {value for family in text_string_to_metric_families(text)
                        for sample in family.samples for value in sample.labels.values()}
        models, routes, counted = set(), set(), 0
        for family in sidecar.registry.collect():
            for sample in family.samples:
                if sample.name == "inferwatch_requests_total":
                    models.add(sample.labels["model_name"])
                    routes.add(sample.labels["route"])
                    counted += sample.value > 0
        accepted = models - {"unknown", "other", "fake-model"}
        assert accepted <= sent_models
        assert len(models - {"unknown", "other"}) == MAX_MODEL_LABELS  # the cap was reached, and held
        assert label_values.isdisjoint(sent_models - accepted)
        assert routes <= KNOWN_ROUTES | {"other"}
        assert label_values.isdisjoint(sent_routes)
        assert label_values.isdisjoint(sent_agents)
        assert counted <= 3 * (MAX_MODEL_LABELS + 2)
    finally:
        await sidecar.session.close()
        await runner.cleanup()

"""``/admin/requests``: requests finished by the real proxy, kept in the ring, explained when asked.

A fake OpenAI upstream answers; a UDP socket plays vLLM's stat-logger plugin (the wire format of
exporters.engine_stats_wire). Each request's own record, as the proxy finished it, is the truth the
explanation's parts must add up to.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from alert_rules.engine_config import EngineConfig
from exporters.catalog.gpu import GPU_CLOCK_EVENT_ACTIVE
from exporters.catalog.request import E2E_LATENCY_SECONDS
from exporters.engine_stats_wire import EngineRequestStats, EngineStepStats, encode
from exporters.records import RequestRecord
from log_pipeline.query import Archive
from serving import config as cfg
from serving.app import OBSERVERS, build_app
from serving.cli import main
from serving.commands.explain import slowest_table
from serving.explain import RequestRing, with_slowest_request
from serving.loadtest.client import RequestResult
from serving.rule_engine import RULE_RUNNER, RuleRunner
from serving.tools import demo
from tests.fakes.nvml import FakeNvml
from tests.fakes.openai_upstream import FakeOpenAI

TOKEN_DELAY_S = 0.05
TOKENS = 6


def _trace(i: int) -> str:
    return f"{i:032x}"


class Setup:
    def __init__(self, client: TestClient, finished: dict[str, RequestRecord], plugin_port: int) -> None:
        self.client = client
        self.app: web.Application | None = None
        self.finished = finished
        self.plugin = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.plugin_address = ("127.0.0.1", plugin_port)

    def send_engine(self, trace_id: str, queued_s: float, prefill_s: float, decode_s: float, preemptions: int,
                    step: EngineStepStats) -> None:
        stats = EngineRequestStats(f"cmpl-{trace_id}-0-1a2b3c4d", queued_s, prefill_s, decode_s,
                                   prefill_s + decode_s, queued_s + prefill_s + decode_s, preemptions, 0, 7, TOKENS,
                                   "length")
        for datagram in encode(step, [stats]):
            self.plugin.sendto(datagram, self.plugin_address)

    async def request(self, trace_id: str, *, stream: bool = True, model: str = "fake-model") -> None:
        response = await self.client.post(
            "/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": TOKENS, "stream": stream},
            headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
        await response.read()

    async def explain(self, trace_id: str) -> tuple[int, dict[str, Any]]:
        response = await self.client.get(f"/admin/requests/{trace_id}")
        return response.status, await response.json()

    async def explain_when_finished(self, trace_id: str) -> tuple[int, dict[str, Any]]:
        """The explanation, once the request's record is finished (at most 2 s)."""
        for _ in range(100):
            if trace_id in self.finished:
                break
            await asyncio.sleep(0.02)
        return await self.explain(trace_id)


async def _setup(aiohttp_server: Callable[..., Awaitable[TestServer]],
                 aiohttp_client: Callable[..., Awaitable[TestClient]], token_delay_s: float = TOKEN_DELAY_S,
                 rules_interval_s: float = 15.0, archive: str = "", gpu_interval_s: float = 5.0,
                 remote: str | None = None, **serve: Any) -> Setup:
    upstream = await aiohttp_server(FakeOpenAI(token_delay_s=token_delay_s, record=False).app())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = cfg.replace(cfg.defaults(), "serve", upstream=str(upstream.make_url("")).rstrip("/"),
                           engine_stats_listen=f"udp://127.0.0.1:{port}", engine_stats_wait_ms=2000.0, **serve)
    settings = cfg.replace(settings, "scrape", enabled=False)
    settings = cfg.replace(settings, "rules", evaluation_interval_s=rules_interval_s)
    settings = cfg.replace(settings, "gpu", interval_s=gpu_interval_s)
    settings = cfg.replace(settings, "logs", dir=archive, success_sample_ratio=1.0, frame_max_ms=20.0)
    app = build_app(settings)
    if remote is not None:  # every client seen from ``remote``, as if it were on another machine
        @web.middleware
        async def from_remote(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                              ) -> web.StreamResponse:
            return await handler(request.clone(remote=remote))

        app.middlewares.insert(0, from_remote)
    finished: dict[str, RequestRecord] = {}
    app[OBSERVERS].append(lambda record, _span: finished.__setitem__(record.trace_id, record))
    setup = Setup(await aiohttp_client(app), finished, port)
    setup.app = app
    return setup


@pytest.fixture(name="setup")
async def _fixture(aiohttp_server: Callable[..., Awaitable[TestServer]],
                   aiohttp_client: Callable[..., Awaitable[TestClient]]) -> AsyncIterator[Setup]:
    setup = await _setup(aiohttp_server, aiohttp_client)
    yield setup
    setup.plugin.close()


async def test_plain_request_is_none_and_its_parts_add_up_to_its_e2e(setup: Setup) -> None:
    """A lone stream without vLLM's numbers: cause none, and the parts add up to the e2e the proxy measured,
    the time to the first token unsplit."""
    trace_id = _trace(1)
    await setup.request(trace_id)
    status, explanation = await setup.explain(trace_id)
    assert status == 200
    record = setup.finished[trace_id]
    assert explanation["e2e_ms"] == pytest.approx(record.e2e_s * 1000, abs=0.051)  # type: ignore[operator]
    assert sum(p["ms"] for p in explanation["phases"]) == pytest.approx(explanation["e2e_ms"], abs=0.5)
    phases = {p["name"]: p for p in explanation["phases"]}
    assert phases["vllm_until_first_token"]["split"] is False
    assert phases["generation"]["ms"] >= (TOKENS - 1) * TOKEN_DELAY_S * 1000 * 0.9
    assert [c["cause"] for c in explanation["causes"]] == ["none"]
    assert explanation["engine_numbers"] is False


async def test_engine_phases_split_the_time_and_preemption_is_the_cause(setup: Setup) -> None:
    """With vLLM's numbers joined, the parts are the sidecar's, vLLM's front end and the engine's phases as
    the plugin sent them, adding up to the e2e; a preempted request's first cause is preempted with its count."""
    trace_id = _trace(2)
    step = EngineStepStats(0.97, 3, 2, 0, 0)
    setup.send_engine(_trace(99), 0.0, 0.0, 0.0, 0, step)  # the plugin is alive: the join will wait for ours
    decode_s = (TOKENS - 2) * TOKEN_DELAY_S
    await setup.request(trace_id)
    setup.send_engine(trace_id, 0.001, 0.002, decode_s, 2, step)
    status, explanation = await setup.explain_when_finished(trace_id)
    assert status == 200
    phases = {p["name"]: p["ms"] for p in explanation["phases"]}
    assert list(phases) == ["sidecar", "connect", "vllm_front_end", "engine_queue", "prefill", "decode",
                            "client_slow_read"]
    assert phases["decode"] == pytest.approx(decode_s * 1000, abs=0.051)
    assert sum(phases.values()) == pytest.approx(explanation["e2e_ms"], abs=0.5)
    record = setup.finished[trace_id]
    assert phases["sidecar"] + phases["connect"] == pytest.approx(record.upstream_sent_s * 1000, abs=0.1)  # type: ignore[operator]
    top = explanation["causes"][0]
    assert top["cause"] == "preempted"
    assert top["evidence"]["preemptions"] == 2
    assert explanation["context"]["source"] == "plugin_steps"
    assert explanation["context"]["kv_usage_max"] == 0.97


async def test_ring_forgets_the_oldest_and_says_so(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]]
) -> None:
    """With serve.explain_ring_size 2, the first of three requests is gone: 404 naming the ring."""
    setup = await _setup(aiohttp_server, aiohttp_client, explain_ring_size=2)
    for i in (1, 2, 3):
        await setup.request(_trace(i), stream=False)
    status, body = await setup.explain(_trace(1))
    assert status == 404
    assert "serve.explain_ring_size" in body["error"]["message"]
    assert len(body["error"]["trace_id"]) == 32
    assert [(await setup.explain(_trace(i)))[0] for i in (2, 3)] == [200, 200]
    setup.plugin.close()


async def test_slowest_lists_by_e2e_with_a_reason_each(setup: Setup) -> None:
    """?slowest=2 gives the two slowest requests, slowest first, each with its cause and reason."""
    await setup.request(_trace(1), model="slow")
    await setup.request(_trace(2), stream=False)
    await setup.request(_trace(3), model="fail")
    response = await setup.client.get("/admin/requests", params={"slowest": "2", "since": "5m"})
    body = await response.json()
    rows = body["requests"]
    expected = sorted(setup.finished.values(), key=lambda r: r.e2e_s or 0.0, reverse=True)[:2]
    assert [row["trace_id"] for row in rows] == [r.trace_id for r in expected]
    assert all(row["reason"] and row["cause"] for row in rows)
    failed = (await setup.explain(_trace(3)))[1]
    assert failed["causes"][0]["cause"] == "upstream_error"


async def test_slowest_from_a_boards_start_looks_back_to_it(setup: Setup) -> None:
    """from=EPOCH_MS (Grafana's ${__from}, the SLO board's slowest-requests table) looks back to that moment: the
    rows of the matching since; a start after the requests finds none."""
    await setup.request(_trace(1))
    await setup.request(_trace(2), stream=False)
    five_minutes_ago = round((time.time() - 300) * 1000)
    by_from = await (await setup.client.get("/admin/requests", params={"slowest": 5, "from": five_minutes_ago})).json()
    by_since = await (await setup.client.get("/admin/requests", params={"slowest": 5, "since": "5m"})).json()
    assert [r["trace_id"] for r in by_from["requests"]] == [r["trace_id"] for r in by_since["requests"]]
    assert len(by_from["requests"]) == 2
    assert by_from["since_s"] == pytest.approx(300, abs=5)
    later = round((time.time() + 60) * 1000)
    assert (await (await setup.client.get(f"/admin/requests?from={later}")).json())["requests"] == []


@pytest.mark.parametrize("query", ["slowest=x", "slowest=0", "since=yesterday", "from=yesterday", "from=1&since=5m"])
async def test_slowest_refuses_bad_parameters(setup: Setup, query: str) -> None:
    """A malformed count or duration is a 400 naming it, in the sidecar's error shape with a trace id."""
    response = await setup.client.get(f"/admin/requests?{query}")
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["message"]
    assert error["trace_id"] == response.headers["x-trace-id"]


def test_ring_keeps_the_latest_record_of_a_reused_trace_id() -> None:
    """A trace id seen twice finds its latest record; the older one leaving the ring does not unindex it."""
    ring = RequestRing(2)
    first, second = (RequestRecord(trace_id="a" * 32, span_id=s, route="r") for s in ("1", "2"))
    ring.add(first)
    ring.add(second)
    ring.add(RequestRecord(trace_id="b" * 32, span_id="3", route="r"))
    assert ring.get("a" * 32) is second
    assert len(ring) == 2


async def test_cli_finds_a_request_in_the_sidecar_and_names_where_it_looked_when_not(
    setup: Setup, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inferwatch explain` shows a request the sidecar has (exit 0) and, for one it has not, exits 1 naming
    the sidecar and the archive it searched."""
    await setup.request(_trace(5))
    base = str(setup.client.make_url("")).rstrip("/")
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(None, main, ["explain", _trace(5), "--sidecar", base, "--json"])
    assert found == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["trace_id"] == _trace(5)
    missing = await loop.run_in_executor(None, main, ["explain", _trace(6), "--sidecar", base, "--dir", str(tmp_path)])
    assert missing == 1
    said = capsys.readouterr().err
    assert base in said
    assert f"the archive {tmp_path} has no record of it" in said


async def test_a_client_that_stops_reading_is_client_slow_read(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]]
) -> None:
    """A client with a small receive buffer that reads nothing for PAUSE_S while a fast stream comes: the
    stream's wait on it is client_slow_read, the top cause, within the pause the client made."""
    setup = await _setup(aiohttp_server, aiohttp_client, token_delay_s=0.0)
    pause_s, trace_id = 1.0, _trace(7)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    url = setup.client.make_url("")
    await asyncio.get_running_loop().sock_connect(sock, (url.host, url.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    body = json.dumps({"model": "fake-model", "prompt": "hi", "max_tokens": 30000, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                 b"traceparent: 00-" + trace_id.encode() + b"-00f067aa0ba902b7-01\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    began = time.perf_counter()
    await asyncio.sleep(pause_s)
    paused_s = time.perf_counter() - began
    while await reader.read(65536):
        pass
    writer.close()
    status, explanation = await setup.explain_when_finished(trace_id)
    assert status == 200
    phases = {p["name"]: p["ms"] for p in explanation["phases"]}
    assert 0.5 * paused_s * 1000 <= phases["client_slow_read"] <= explanation["e2e_ms"]
    assert explanation["causes"][0]["cause"] == "client_slow_read"
    setup.plugin.close()


async def test_peers_are_the_buckets_p50_from_the_embedded_engines_store(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]]
) -> None:
    """Five requests of one model and length bucket: the explanation's e2e p50 lies in the histogram bucket that
    holds the median of the five e2e the proxy measured."""
    setup = await _setup(aiohttp_server, aiohttp_client, token_delay_s=0.01, rules_interval_s=1.0)
    assert setup.app is not None
    store = setup.app[RULE_RUNNER].store

    def stored_after(t_ms: int) -> bool:
        return bool(store.window(E2E_LATENCY_SECONDS.bucket, [], t_ms, 2**62))

    async def ingested_after(t_ms: int) -> None:
        for _ in range(100):
            if stored_after(t_ms):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the rule engine never ingested")

    await setup.request(_trace(19))  # the series appear with a first request; a sample of them before the five
    await ingested_after(int(time.time() * 1000) + 1)  # lets increase() count all five
    for i, tokens in enumerate((1, 5, 20, 60, 150)):  # 10 ms to 1.5 s: a p50 in another bucket than its p99
        response = await setup.client.post("/v1/completions", json={
            "model": "fake-model", "prompt": "hi", "max_tokens": tokens, "stream": True},
            headers={"traceparent": f"00-{_trace(20 + i)}-00f067aa0ba902b7-01"})
        await response.read()
    for _ in range(100):  # each request's observers ran (its histograms hold it)
        if all(_trace(20 + i) in setup.finished for i in range(5)):
            break
        await asyncio.sleep(0.02)
    await ingested_after(int(time.time() * 1000) + 1)
    e2e = sorted((setup.finished[_trace(20 + i)].e2e_s or 0.0) for i in range(5))
    median = e2e[2]
    bounds = (0.0, *(E2E_LATENCY_SECONDS.buckets or ()))
    low, high = next((a, b) for a, b in itertools.pairwise(bounds) if a < median <= b)
    status, explanation = await setup.explain(_trace(22))
    assert status == 200
    peer = explanation["peers"]["e2e"]
    assert low * 1000 <= peer["p50_ms"] <= high * 1000, (e2e, peer)
    assert peer["ratio"] == pytest.approx(explanation["e2e_ms"] / peer["p50_ms"], rel=0.01)
    setup.plugin.close()


async def test_cli_lists_the_slowest_from_the_archive_when_the_sidecar_is_gone(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]],
    tmp_path: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    """`explain --slowest 2 --dir` with no sidecar answering: the two slowest archived requests, slowest first,
    each with its cause."""
    setup = await _setup(aiohttp_server, aiohttp_client, archive=str(tmp_path))
    for i, tokens in enumerate((1, 6, 3)):
        response = await setup.client.post("/v1/completions", json={
            "model": "fake-model", "prompt": "hi", "max_tokens": tokens, "stream": True},
            headers={"traceparent": f"00-{_trace(30 + i)}-00f067aa0ba902b7-01"})
        await response.read()
    for _ in range(200):
        if len(list(Archive(tmp_path).records())) == 3:
            break
        await asyncio.sleep(0.02)
    gone = "http://127.0.0.1:9"  # the discard port: nothing answers
    loop = asyncio.get_running_loop()
    args = ["explain", "--slowest", "2", "--since", "5m", "--sidecar", gone, "--dir", str(tmp_path), "--json"]
    assert await loop.run_in_executor(None, main, args) == 0
    listed = json.loads(capsys.readouterr().out.splitlines()[-1])  # the sidecar's own log lines come first
    assert listed["source"] == "archive"
    assert [row["trace_id"] for row in listed["requests"]] == [_trace(31), _trace(32)]
    assert all(row["cause"] for row in listed["requests"])
    setup.plugin.close()


async def test_a_gpu_that_slows_its_clocks_is_gpu_throttled_with_nvmls_readings(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML (the fake that raises pynvml's own exceptions) says GPU 1 runs at 91 °C with its hardware thermal
    slowdown on while GPU 0 answers NotSupported for its clock events: the explanation's context holds the busiest
    GPU's readings and the reason, and names gpu_throttled; with the slowdown over, a later request does not."""
    fake = FakeNvml(2)
    fake.gpus[1].temperature, fake.gpus[1].util_gpu, fake.gpus[1].reasons = 91, 97, 0x40  # hw_thermal
    fake.gpus[0].unsupported.add("nvmlDeviceGetCurrentClocksEventReasons")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    setup = await _setup(aiohttp_server, aiohttp_client, rules_interval_s=1.0, gpu_interval_s=0.1)
    assert setup.app is not None
    store = setup.app[RULE_RUNNER].store

    async def stored(reason_active: float) -> None:
        for _ in range(200):
            rows = store.window(GPU_CLOCK_EVENT_ACTIVE.series, [], int(time.time() * 1000) - 1000, 2**62)
            if any(dict(labels).get("reason") == "hw_thermal" and values[-1] == reason_active
                   for labels, _t, values in rows):
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the GPU readings never reached the store")

    await stored(1.0)
    await setup.request(_trace(8))
    status, explanation = await setup.explain_when_finished(_trace(8))
    assert status == 200
    context = explanation["context"]
    assert context["gpu_temperature_max"] == 91
    assert context["gpu_utilization_max"] == 0.97
    assert context["gpu_memory_used_max_bytes"] == fake.gpus[1].used
    assert context["gpu_clock_events"] == ["hw_thermal"]
    throttled = next(c for c in explanation["causes"] if c["cause"] == "gpu_throttled")
    assert throttled["evidence"]["reasons"] == ["hw_thermal"]
    fake.gpus[1].reasons = 0
    await stored(0.0)
    await asyncio.sleep(1.1)  # past the context's padding (one evaluation interval)
    await setup.request(_trace(9))
    _, cooler = await setup.explain_when_finished(_trace(9))
    assert cooler["context"]["gpu_clock_events"] == []
    assert "gpu_throttled" not in {c["cause"] for c in cooler["causes"]}
    setup.plugin.close()


async def test_a_request_the_sidecar_refused_is_the_sidecars_with_the_refusal_the_client_got(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]]
) -> None:
    """A body over serve.max_body_bytes: all its time is the sidecar's, and the cause is the sidecar's refusal
    with the status and error type the client received, not an upstream error."""
    setup = await _setup(aiohttp_server, aiohttp_client, max_body_bytes=16)
    response = await setup.client.post("/v1/completions", json={"model": "fake-model", "prompt": "a long prompt"},
                                       headers={"traceparent": f"00-{_trace(10)}-00f067aa0ba902b7-01"})
    answered = await response.json()
    status, explanation = await setup.explain_when_finished(_trace(10))
    assert status == 200
    assert [(p["name"], p["share"]) for p in explanation["phases"]] == [("sidecar", 1.0)]
    (cause,) = explanation["causes"]
    assert cause["cause"] == "sidecar"
    assert cause["evidence"]["refused"] is True
    assert cause["evidence"]["http_status"] == response.status == 413
    assert cause["evidence"]["error_type"] == answered["error"]["type"]
    setup.plugin.close()


async def test_a_sidecar_elsewhere_explains_with_the_admin_token_file_and_refuses_without(
    aiohttp_server: Callable[..., Awaitable[TestServer]], aiohttp_client: Callable[..., Awaitable[TestClient]],
    tmp_path: Any, capsys: pytest.CaptureFixture[str],
) -> None:
    """Seen from a non-loopback address, a sidecar with serve.admin_token_file answers `inferwatch explain` with
    --admin-token-file (exit 0) and refuses it without (exit 1, naming its 401)."""
    token = tmp_path / "admin-token"
    token.write_text("admin-token-0123456789abcdef\n")
    setup = await _setup(aiohttp_server, aiohttp_client, remote="192.0.2.7", admin_token_file=str(token))
    await setup.request(_trace(11))
    await setup.explain_when_finished(_trace(11))
    base = str(setup.client.make_url("")).rstrip("/")
    loop = asyncio.get_running_loop()
    refused = await loop.run_in_executor(None, main, ["explain", _trace(11), "--sidecar", base])
    assert refused == 1
    assert "HTTP 401" in capsys.readouterr().err
    found = await loop.run_in_executor(None, main, ["explain", _trace(11), "--sidecar", base, "--admin-token-file",
                                                    str(token), "--json"])
    assert found == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["trace_id"] == _trace(11)
    setup.plugin.close()


async def test_an_unreachable_prometheus_leaves_the_sidecars_context_and_says_so(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """--prometheus at an address nobody listens on: the explanation is still printed (exit 0) with the sidecar's
    own context, and stderr names the Prometheus that could not be asked."""
    await setup.request(_trace(12))
    _, own = await setup.explain_when_finished(_trace(12))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{probe.getsockname()[1]}"
    base = str(setup.client.make_url("")).rstrip("/")
    found = await asyncio.get_running_loop().run_in_executor(
        None, main, ["explain", _trace(12), "--sidecar", base, "--prometheus", nobody, "--json"])
    assert found == 0
    said = capsys.readouterr()
    assert json.loads(said.out.splitlines()[-1])["context"]["source"] == own["context"]["source"]
    assert f"Prometheus at {nobody} could not be asked" in said.err


async def test_slowest_with_an_unreachable_prometheus_lists_the_sidecars_rows_and_says_so_once(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    """--slowest 2 --prometheus at an address nobody listens on: both rows still printed (exit 0), each with the
    context the sidecar listed it with (its plugin steps), and stderr names that Prometheus once, not per row."""
    step = EngineStepStats(0.5, 3, 1, 0, 0)
    for i in (16, 17):
        setup.send_engine(_trace(99), 0.0, 0.0, 0.0, 0, step)  # the plugin is alive: steps around each request
        await setup.request(_trace(i))
        setup.send_engine(_trace(i), 0.001, 0.002, 0.2, 0, step)
        await setup.explain_when_finished(_trace(i))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{probe.getsockname()[1]}"
    base = str(setup.client.make_url("")).rstrip("/")
    loop = asyncio.get_running_loop()
    args = ["explain", "--slowest", "2", "--since", "5m", "--sidecar", base, "--prometheus", nobody]
    assert await loop.run_in_executor(None, main, [*args, "--json"]) == 0
    said = capsys.readouterr()
    rows = json.loads(said.out.splitlines()[-1])["requests"]
    assert {row["trace_id"] for row in rows} == {_trace(16), _trace(17)}
    assert [row["context"]["source"] for row in rows] == ["plugin_steps"] * 2
    assert [row["context"]["running_max"] for row in rows] == [3, 3]
    assert said.err.count(f"Prometheus at {nobody} could not be asked") == 1
    assert await loop.run_in_executor(None, main, args) == 0
    table = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("TRACE_ID"))
    assert {line.split()[0] for line in table[header + 1:]} == {_trace(16), _trace(17)}
    assert all(line.split()[3:8] == ["3", "1", "0.50", "-", "plugin_steps"] for line in table[header + 1:])


def test_the_slowest_table_aligns_the_context_and_marks_what_is_unknown() -> None:
    """One row with Prometheus's context, one from the archive with none: the columns line up under the header, the
    numbers as given (KV to two places, a Prometheus increase as it came), '-' where nothing is known."""
    rows = [{"trace_id": "a" * 32, "e2e_ms": 2972.6, "cause": "queue_full_batch", "reason": "it queued",
             "context": {"source": "prometheus", "running_max": 2, "waiting_max": 4, "kv_usage_max": 0.938,
                         "preemptions_in_window": 2.5}},
             {"trace_id": "b" * 32, "e2e_ms": 12.0, "cause": "none", "reason": "nothing stands out",
              "context": {"source": "none", "running_max": None, "waiting_max": None, "kv_usage_max": None,
                          "preemptions_in_window": None}}]
    header, first, second = slowest_table(rows).splitlines()
    assert first.split()[:8] == ["a" * 32, "2,972.6", "queue_full_batch", "2", "4", "0.94", "2.5", "prometheus"]
    assert second.split()[:8] == ["b" * 32, "12.0", "none", "-", "-", "-", "-", "none"]
    for column in ("E2E_MS", "RUNNING", "WAITING", "KV", "PREEMPTED"):  # right-aligned under their header
        end = header.index(column) + len(column)
        assert first[end - 1] != " " != second[end - 1], column
        assert first[end] == second[end] == " ", column
    assert first.index("it queued") == second.index("nothing stands out") == header.index("REASON")


async def test_the_demo_ends_with_the_explanation_of_its_slowest_request(
    setup: Setup, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """make demo's ending, without the rest of the demo: of the load test's requests it names the slowest that
    succeeded and prints `inferwatch explain` of it from the sidecar's ring."""
    await setup.request(_trace(13))
    await setup.request(_trace(14))
    await setup.explain_when_finished(_trace(14))
    results = [RequestResult(0, status=200, e2e_s=0.5, trace_id=_trace(13)),
               RequestResult(1, status=200, e2e_s=0.9, trace_id=_trace(14)),
               RequestResult(2, status=502, error="HTTP 502", e2e_s=5.0, trace_id=_trace(15))]
    run = cast(Any, SimpleNamespace(results=results, cold_starts=[]))  # what _tell reads of a RunResult
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        prometheus = f"http://127.0.0.1:{probe.getsockname()[1]}"  # nobody: the demo's queries say they failed
    base = str(setup.client.make_url("")).rstrip("/")
    await asyncio.get_running_loop().run_in_executor(None, demo._tell, run, {}, tmp_path, prometheus, base,
                                                     tmp_path / "logs")
    said = capsys.readouterr().out
    assert f"slowest request: 900 ms, trace_id={_trace(14)}" in said
    assert f"trace {_trace(14)}  fake-model" in said  # the explanation's first line, from the sidecar's ring
    assert "(from the sidecar's ring)" in said
    assert "Why: " in said
    assert "not explained" not in said


def test_a_page_sent_by_the_embedded_engine_names_its_models_slowest_request() -> None:
    """The embedded engine's page (an alert with a context annotation) about model m gains the trace id of m's
    slowest request in the last 15 minutes and the command that explains it; an alert without context, and
    requests older than 15 minutes or of another model, are left out."""
    now = time.time()
    ring = RequestRing(10)
    for trace, model, start, e2e in ((_trace(20), "m", now - 60, 1.5), (_trace(21), "m", now - 30, 2.5),
                                     (_trace(22), "other", now - 20, 9.0), (_trace(23), "m", now - 2000, 30.0)):
        ring.add(RequestRecord(trace_id=trace, span_id="00f067aa0ba902b7", route="/v1/completions", model=model,
                               start_unix=start, e2e_s=e2e))
    rules = {"groups": [{"name": "g", "rules": [
        {"alert": "Page", "expr": "vector(1)", "labels": {"model_name": "m"},
         "annotations": {"context": "KV cache 97%"}},
        {"alert": "Ticket", "expr": "vector(1)", "annotations": {"summary": "s"}}]}]}
    sent: list[list[dict[str, Any]]] = []
    runner = RuleRunner(EngineConfig(alertmanager_url="http://127.0.0.1:9093"), rules,
                        post=lambda _url, body: sent.append(json.loads(body)), annotate=with_slowest_request(ring))
    runner.step(int(now * 1000))
    alerts = {alert["labels"]["alertname"]: alert["annotations"] for alert in sent[0]}
    assert alerts["Page"]["context"] == (f"KV cache 97%; slowest request in 15m: {_trace(21)} (2,500 ms; "
                                         f"inferwatch explain {_trace(21)})")
    assert alerts["Ticket"] == {"summary": "s"}

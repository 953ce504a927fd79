"""Tests of serving.engine_watch against an in-process aiohttp upstream (kept here: it is the exporters' async side)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from exporters.catalog import engine as ce
from exporters.catalog import gpu as cg
from exporters.engine_stats_wire import EngineStepStats
from serving.config import defaults, replace
from serving.engine_stats import EngineSteps
from serving.engine_watch import ENGINE_WATCH, EngineWatch, engine_watch_ctx, serving_energy
from tests.fakes.nvml import FakeNvml

DATA = Path(__file__).resolve().parents[2] / "data"
CURRENT = (DATA / "vllm_v1_engine_0.32.prom").read_text()


async def _serve_current(_request: web.Request) -> web.Response:
    return web.Response(text=CURRENT)


async def _upstream(aiohttp_server: Callable[..., Awaitable[Any]], handler: Any) -> str:
    app = web.Application()
    app.router.add_get("/metrics", handler)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}"


def _settings(upstream: str, **scrape: Any) -> Any:
    settings = replace(defaults(), "serve", upstream=upstream)
    settings = replace(settings, "gpu", enabled=False)
    return replace(settings, "scrape", **scrape) if scrape else settings


async def test_scrape_publishes_the_snapshot_and_raw_text(aiohttp_server: Any) -> None:
    """One scrape stores the raw text, the parsed snapshot and scrape_up 1."""
    upstream = await _upstream(aiohttp_server, _serve_current)
    watch = EngineWatch(_settings(upstream))
    await watch.scrape_once()
    await watch.stop()
    assert watch.latest_text == CURRENT
    assert watch.latest_snapshot.generation == "v1_engine"
    assert watch.state.up
    assert watch.state.batch_requests["tiny-llm"].count == 1


async def test_failed_scrapes_are_counted_by_reason_and_keep_the_last_snapshot(aiohttp_server: Any) -> None:
    """A 500 and a timeout count as http_status and timeout; the last good snapshot stays published."""
    calls = {"n": 0}

    async def handler(_request: web.Request) -> web.Response:
        calls["n"] += 1
        if calls["n"] == 2:
            return web.Response(status=500)
        if calls["n"] == 3:
            await asyncio.sleep(1.0)
        return web.Response(text=CURRENT)

    upstream = await _upstream(aiohttp_server, handler)
    watch = EngineWatch(_settings(upstream, timeout_s=0.2))
    for _ in range(3):
        await watch.scrape_once()
    await watch.stop()
    assert dict(watch.state.failures) == {"http_status": 1, "timeout": 1}
    assert not watch.state.up
    assert watch.latest_snapshot.generation == "v1_engine"


async def _serve_in_two_pieces(request: web.Request) -> web.StreamResponse:
    """The exposition in two writes 0.2 s apart, as a busy vLLM's answer can arrive."""
    response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
    await response.prepare(request)
    half = len(CURRENT) // 2
    await response.write(CURRENT[:half].encode())
    await asyncio.sleep(0.2)
    await response.write(CURRENT[half:].encode())
    await response.write_eof()
    return response


async def test_an_answer_that_arrives_in_pieces_is_read_to_its_end(aiohttp_server: Any) -> None:
    """The scrape parses the whole exposition, not the part that had come when it first looked (a CI run
    published a snapshot without vllm:cache_config_info, near the end of vLLM's text)."""
    watch = EngineWatch(_settings(await _upstream(aiohttp_server, _serve_in_two_pieces)))
    await watch.scrape_once()
    await watch.stop()
    assert watch.state.up
    assert watch.latest_text == CURRENT


async def test_an_answer_over_the_size_limit_counts_too_large_however_it_arrives(aiohttp_server: Any) -> None:
    """Past scrape.max_bytes, over several writes, the scrape fails as too_large and publishes nothing."""
    watch = EngineWatch(_settings(await _upstream(aiohttp_server, _serve_in_two_pieces),
                                  max_bytes=len(CURRENT) - 1))
    await watch.scrape_once()
    await watch.stop()
    assert dict(watch.state.failures) == {"too_large": 1}
    assert not watch.state.up


async def test_unreachable_upstream_counts_a_connect_failure() -> None:
    """Scraping a closed port counts a connect failure without raising."""
    watch = EngineWatch(_settings("http://127.0.0.1:9"))
    await watch.scrape_once()
    await watch.stop()
    assert dict(watch.state.failures) == {"connect": 1}


async def test_cleanup_ctx_registers_collectors_and_runs_with_a_fake_gpu(aiohttp_server: Any) -> None:
    """The cleanup_ctx stores the watch on the app and the registry renders engine and GPU families."""
    upstream = await _upstream(aiohttp_server, _serve_current)
    settings = replace(_settings(upstream), "gpu", enabled=True, xid_events=True, event_timeout_ms=10)
    registry = CollectorRegistry()
    app = web.Application()
    app.cleanup_ctx.append(engine_watch_ctx(settings, registry, nvml_module=FakeNvml(2)))
    server = await aiohttp_server(app)
    text = generate_latest(registry).decode()
    assert server.app[ENGINE_WATCH].gpu_available
    assert f'{ce.KV_BLOCKS_TOTAL.name}{{model_name="tiny-llm"}} 65.0' in text
    assert f"{cg.GPU_EXPORTER_UP.name} 1.0" in text
    assert text.count(f"{cg.GPU_UP.name}{{") == 2


async def test_no_nvml_disables_the_gpu_exporter_and_the_rest_runs(aiohttp_server: Any) -> None:
    """With NVML missing the watch logs, exports gpu_exporter_up 0 and still scrapes the engine."""
    import pynvml

    upstream = await _upstream(aiohttp_server, _serve_current)
    settings = replace(_settings(upstream), "gpu", enabled=True)
    registry = CollectorRegistry()
    app = web.Application()
    app.cleanup_ctx.append(
        engine_watch_ctx(settings, registry, nvml_module=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound))
    )
    await aiohttp_server(app)
    text = generate_latest(registry).decode()
    assert f"{cg.GPU_EXPORTER_UP.name} 0.0" in text
    assert f'{ce.SCRAPE_UP.name}{{upstream="{upstream}"}} 1.0' in text


def test_serving_energy_selects_by_uuid_or_index() -> None:
    """Serving GPUs are picked by UUID or index; empty selects all."""
    readings = ((0, "GPU-a", 10.0), (1, "GPU-b", 20.0), (2, "GPU-c", None))
    assert serving_energy(readings, []) == {"GPU-a": 10.0, "GPU-b": 20.0, "GPU-c": None}
    assert serving_energy(readings, ["1", "GPU-c"]) == {"GPU-b": 20.0, "GPU-c": None}
    assert serving_energy((), []) == {}


TOKENS_LINE = re.compile(r'^(vllm:generation_tokens_total\{engine="0",model_name="tiny-llm"\}) \S+$', re.MULTILINE)
ENERGY_RATE_W = 250.0
"""How fast the fake's energy counters run; their power reading (350 W) is deliberately different."""


class _TokenUpstream:
    """A vLLM /metrics whose generation-token counter the test sets."""

    def __init__(self) -> None:
        self.tokens = 5795.0

    async def handle(self, _request: web.Request) -> web.Response:
        """The captured exposition with the current token count."""
        return web.Response(text=TOKENS_LINE.sub(lambda m: f"{m.group(1)} {self.tokens}", CURRENT))


async def _energy_watch(aiohttp_server: Any, fake: FakeNvml, serving_gpus: list[str] | None = None,
                        ) -> tuple[EngineWatch, _TokenUpstream]:
    for gpu in fake.gpus:
        gpu.energy_rate_mw = ENERGY_RATE_W * 1000
    upstream = _TokenUpstream()
    settings = replace(_settings(await _upstream(aiohttp_server, upstream.handle)), "gpu", enabled=True,
                       serving_gpus=serving_gpus or [])
    watch = EngineWatch(settings, nvml_module=fake)
    assert watch.open_gpu()
    await watch.scrape_once()
    return watch, upstream


async def _window(watch: EngineWatch, upstream: _TokenUpstream, fake: FakeNvml, tokens: float,
                  seconds: float) -> dict[str, float]:
    upstream.tokens += tokens
    fake.advance(seconds)
    await watch.scrape_once()
    return dict(watch.state.tokens_per_joule)


@pytest.mark.parametrize(
    ("serving_gpus", "gpus_counted"), [([], 2), (["1"], 1)], ids=["all GPUs serve", "one GPU serves"],
)
async def test_tokens_per_joule_is_tokens_over_the_energy_counters_in_the_same_window(
    aiohttp_server: Any, serving_gpus: list[str], gpus_counted: int
) -> None:
    """600 tokens while the serving GPUs' energy counters run at 250 W for 4 s: 600 / (250 x 4 x GPUs)."""
    fake = FakeNvml(2)
    watch, upstream = await _energy_watch(aiohttp_server, fake, serving_gpus)
    assert watch.state.tokens_per_joule == ()  # one scrape is no window yet
    value = (await _window(watch, upstream, fake, 600, 4.0))["tiny-llm"]
    second = (await _window(watch, upstream, fake, 90, 0.5))["tiny-llm"]
    registry = CollectorRegistry()
    watch.register(registry)
    exported = registry.get_sample_value(cg.GPU_TOKENS_PER_JOULE.series, {"model_name": "tiny-llm"})
    await watch.stop()
    assert value == pytest.approx(600 / (ENERGY_RATE_W * 4.0 * gpus_counted))
    assert second == exported == pytest.approx(90 / (ENERGY_RATE_W * 0.5 * gpus_counted))


@pytest.mark.parametrize(
    ("serving_gpus", "expected"), [([], None), (["0"], 600 / (ENERGY_RATE_W * 4.0))],
    ids=["the GPU without it serves: absent", "only the other GPU serves: counted"],
)
async def test_a_gpu_without_an_energy_counter_leaves_tokens_per_joule_absent(
    aiohttp_server: Any, serving_gpus: list[str], expected: float | None
) -> None:
    """NVMLError_NotSupported on a serving GPU leaves the series absent, not 0 and not a partial sum."""
    fake = FakeNvml(2)
    fake.gpus[1].unsupported.add("nvmlDeviceGetTotalEnergyConsumption")
    watch, upstream = await _energy_watch(aiohttp_server, fake, serving_gpus)
    value = (await _window(watch, upstream, fake, 600, 4.0)).get("tiny-llm")
    registry = CollectorRegistry()
    watch.register(registry)
    exported = registry.get_sample_value(cg.GPU_TOKENS_PER_JOULE.series, {"model_name": "tiny-llm"})
    await watch.stop()
    assert value == exported == (pytest.approx(expected) if expected is not None else None)


async def test_a_driver_reload_skips_one_window_then_tokens_per_joule_resumes(aiohttp_server: Any) -> None:
    """The energy counter restarting from zero makes that window unknown (absent), the next one counts again."""
    fake = FakeNvml(1)
    watch, upstream = await _energy_watch(aiohttp_server, fake)
    upstream.tokens += 600
    fake.advance(2.0)
    fake.reload_driver()
    fake.advance(2.0)
    await watch.scrape_once()
    assert dict(watch.state.tokens_per_joule) == {}
    assert (await _window(watch, upstream, fake, 300, 3.0))["tiny-llm"] == pytest.approx(300 / (ENERGY_RATE_W * 3))
    await watch.stop()


@pytest.mark.parametrize(
    ("serving_gpus", "expected"), [([], None), (["0"], 600 / (ENERGY_RATE_W * 4.0))],
    ids=["the lost GPU serves: absent", "only the other GPU serves: counted"],
)
async def test_a_gpu_lost_mid_run_makes_tokens_per_joule_absent(
    aiohttp_server: Any, serving_gpus: list[str], expected: float | None
) -> None:
    """A serving GPU that falls off the bus between two scrapes has no energy reading: the series goes absent."""
    fake = FakeNvml(2)
    watch, upstream = await _energy_watch(aiohttp_server, fake, serving_gpus)
    fake.lose(1)
    value = (await _window(watch, upstream, fake, 600, 4.0)).get("tiny-llm")
    watch.poll_gpu()
    await watch.stop()
    assert value == (pytest.approx(expected) if expected is not None else None)
    assert watch.gpu is not None
    assert not watch.gpu.gpus[1].up


class _Flaky:
    """A vLLM /metrics the test makes slow (past the scrape timeout) or answer 503, one scrape at a time."""

    def __init__(self) -> None:
        self.mode = "ok"

    async def handle(self, _request: web.Request) -> web.Response:
        """The captured exposition, late or refused as told."""
        if self.mode == "slow":
            await asyncio.sleep(1.0)
        if self.mode == "down":
            return web.Response(status=503)
        return web.Response(text=CURRENT)


def _exported(watch: EngineWatch) -> tuple[set[str], dict[str, float]]:
    """The engine families with a sample on a fresh registry, and the scrape-health gauges' values."""
    registry = CollectorRegistry()
    watch.register(registry)
    samples = [s for family in registry.collect() for s in family.samples]
    engine = {n for spec in (*ce.ENGINE_SERIES, cg.GPU_TOKENS_PER_JOULE) for n in spec.sample_names()}
    health = {s.name: s.value for s in samples
              if s.name in (ce.SCRAPE_UP.series, ce.SCRAPE_CONSECUTIVE_FAILURES.series, ce.SCRAPE_STALE.series)}
    return {s.name for s in samples} & engine, health


async def test_one_slow_scrape_keeps_the_engine_series_the_nth_failure_in_a_row_drops_them(
    aiohttp_server: Any,
) -> None:
    """With stale_after_failures 3: a slow scrape of a busy engine, or two failures in a row, leave the engine
    series exported; the third failure in a row takes them out (stale 1); the next success brings them back."""
    upstream = _Flaky()
    watch = EngineWatch(_settings(await _upstream(aiohttp_server, upstream.handle), timeout_s=0.2,
                                  stale_after_failures=3))
    await watch.scrape_once()
    live, health = _exported(watch)
    assert ce.ENGINE_REQUESTS.series in live
    assert ce.KV_USAGE.series in live
    for mode in ("slow", "ok", "down", "slow", "ok"):  # never three failures in a row
        upstream.mode = mode
        await watch.scrape_once()
        assert _exported(watch)[0] == live, mode
    upstream.mode = "down"
    for in_a_row in (1, 2):
        await watch.scrape_once()
        assert _exported(watch)[0] == live, in_a_row
    await watch.scrape_once()
    gone, health = _exported(watch)
    assert gone == set()
    assert health == {ce.SCRAPE_UP.series: 0.0, ce.SCRAPE_CONSECUTIVE_FAILURES.series: 3.0,
                      ce.SCRAPE_STALE.series: 1.0}
    assert watch.live_text() is None
    upstream.mode = "ok"
    await watch.scrape_once()
    back, health = _exported(watch)
    await watch.stop()
    assert back == live
    assert health == {ce.SCRAPE_UP.series: 1.0, ce.SCRAPE_CONSECUTIVE_FAILURES.series: 0.0,
                      ce.SCRAPE_STALE.series: 0.0}
    assert watch.live_text() == CURRENT


async def test_lost_readiness_takes_the_engine_series_out_at_once(aiohttp_server: Any) -> None:
    """A readiness probe that finds the upstream not ready drops the engine series before any scrape fails."""
    lost = {"now": False}
    watch = EngineWatch(_settings(await _upstream(aiohttp_server, _serve_current)),
                        readiness_lost=lambda: lost["now"])
    await watch.scrape_once()
    live, _ = _exported(watch)
    lost["now"] = True
    gone, health = _exported(watch)
    lost["now"] = False
    back, _ = _exported(watch)
    await watch.stop()
    assert ce.ENGINE_REQUESTS.series in live
    assert gone == set()
    assert health[ce.SCRAPE_UP.series] == 1.0
    assert health[ce.SCRAPE_STALE.series] == 1.0
    assert back == live


async def test_the_rule_engine_sees_the_engine_series_end_while_they_are_stale(aiohttp_server: Any) -> None:
    """The embedded store ingests the sidecar's exposition and vLLM's text: once stale, an alert on the frozen
    KV usage stops firing and vLLM's own series read as absent, as Prometheus would see them."""
    from alert_rules.engine_config import EngineConfig
    from exporters.catalog import vllm as cv
    from serving.rule_engine import RuleRunner

    upstream = _Flaky()
    watch = EngineWatch(_settings(await _upstream(aiohttp_server, upstream.handle), stale_after_failures=1))
    await watch.scrape_once()
    registry = CollectorRegistry()
    watch.register(registry)
    rules = {"groups": [{"name": "engine", "interval": "1s", "rules": [
        {"alert": "Busy", "expr": f"{ce.ENGINE_REQUESTS.series} > 0"}]}]}
    runner = RuleRunner(EngineConfig(), rules, registry, watch.live_text, interval_s=1.0)
    t0 = 1_700_000_000_000
    runner.step(t0)
    assert runner.firing.get("Busy")
    assert runner.store.instant(cv.NUM_REQUESTS_RUNNING.series, [], t0, 300_000)
    upstream.mode = "down"
    await watch.scrape_once()
    await watch.stop()
    runner.step(t0 + 1_000)
    assert not runner.firing.get("Busy")
    assert runner.store.instant(ce.ENGINE_REQUESTS.series, [], t0 + 1_000, 300_000) == []
    assert runner.store.instant(cv.NUM_REQUESTS_RUNNING.series, [], t0 + 1_000, 300_000) == []


async def test_serve_drops_the_engine_series_while_vllm_answers_not_ready(aiohttp_server: Any, tmp_path: Path) -> None:
    """Wired in the app: while /health answers 503 the scrape succeeds but the engine series are out (stale 1,
    scrape_up 1); once /health answers 200 they are back."""
    from serving.app import build_app
    from tests.fakes.openai_upstream import FakeOpenAI
    from tests.unit.serving.inprocess import wait_for

    fake = FakeOpenAI(unhealthy_for=10**9, metrics_text=CURRENT)
    upstream = f"http://127.0.0.1:{(await aiohttp_server(fake.app())).port}"
    settings = replace(replace(_settings(upstream, interval_s=0.1), "serve", readiness_interval_s=0.1),
                       "logs", dir=str(tmp_path))
    registry = CollectorRegistry()
    runner = web.AppRunner(build_app(settings, registry))
    await runner.setup()
    try:
        def value(spec: Any) -> float | None:
            return registry.get_sample_value(spec.series, {"upstream": upstream})

        running = {"model_name": "tiny-llm", "state": "running"}
        assert value(ce.SCRAPE_UP) == 1.0
        assert value(ce.SCRAPE_STALE) == 1.0
        assert registry.get_sample_value(ce.ENGINE_REQUESTS.series, running) is None
        fake.unhealthy_for = 0
        assert await wait_for(lambda: value(ce.SCRAPE_STALE) == 0.0)
        assert registry.get_sample_value(ce.ENGINE_REQUESTS.series, running) == 2.0
    finally:
        await runner.cleanup()


async def test_a_readiness_probe_that_times_out_does_not_count_as_readiness_lost(aiohttp_server: Any) -> None:
    """Readiness.lost follows answers (503 lost, 200 back) and refused connections; a slow probe changes nothing."""
    from serving.endpoints import Readiness

    mode = {"now": "ok"}

    async def health(_request: web.Request) -> web.Response:
        if mode["now"] == "slow":
            await asyncio.sleep(1.0)
        return web.Response(status=503 if mode["now"] == "down" else 200)

    app = web.Application()
    app.router.add_get("/health", health)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        readiness = Readiness(f"http://127.0.0.1:{server.port}", "/health", lambda: session, timeout_s=0.2)
        seen = []
        for now in ("ok", "slow", "down", "slow", "ok"):
            mode["now"] = now
            await readiness.probe()
            seen.append((now, readiness.last_ok, readiness.lost))
        refused = Readiness("http://127.0.0.1:9", "/health", lambda: session, timeout_s=0.2)
        await refused.probe()
    assert seen == [("ok", True, False), ("slow", False, False), ("down", False, True), ("slow", False, True),
                    ("ok", True, False)]
    assert refused.lost


async def test_a_readyz_call_that_finds_vllm_not_ready_shows_on_metrics_at_once(aiohttp_client: Any,
                                                                                 aiohttp_server: Any,
                                                                                 tmp_path: Path) -> None:
    """/readyz probes afresh: when it finds vLLM not ready, /metrics says so in the same breath (ready gauge 0
    beside stale 1), not at the next periodic probe a minute later."""
    from exporters.catalog import request as cr
    from serving.app import build_app
    from tests.fakes.openai_upstream import FakeOpenAI

    fake = FakeOpenAI(metrics_text=CURRENT)
    upstream = f"http://127.0.0.1:{(await aiohttp_server(fake.app())).port}"
    settings = replace(replace(_settings(upstream), "serve", readiness_interval_s=60.0), "logs", dir=str(tmp_path))
    registry = CollectorRegistry()
    client = await aiohttp_client(build_app(settings, registry))
    labels = {"upstream": upstream}
    assert (registry.get_sample_value(cr.UPSTREAM_READY.series, labels),
            registry.get_sample_value(ce.SCRAPE_STALE.series, labels)) == (1.0, 0.0)
    fake.unhealthy_for = fake.health_checks + 1
    assert (await client.get("/readyz")).status == 503
    assert (registry.get_sample_value(cr.UPSTREAM_READY.series, labels),
            registry.get_sample_value(ce.SCRAPE_STALE.series, labels)) == (0.0, 1.0)


async def test_the_batch_comes_from_the_plugins_scheduler_states_while_it_is_heard(aiohttp_server: Any) -> None:
    """With the plugin's states since the last scrape, each is one observation of the running batch; with none
    (the plugin silent), the scrape's vllm:num_requests_running is."""
    steps = EngineSteps()
    watch = EngineWatch(_settings(await _upstream(aiohttp_server, _serve_current)), engine_steps=steps.since)
    for running in (3, 9, 12):
        steps.add(EngineStepStats(0.5, running, 0, 0, 0))
    await watch.scrape_once()
    first = watch.state.batch_requests["tiny-llm"]
    await watch.scrape_once()  # no state since: the scrape's gauge
    await watch.stop()
    second = watch.state.batch_requests["tiny-llm"]
    assert (first.count, first.sum) == (3, 24)
    gauge = watch.latest_snapshot.series[0].running
    assert (second.count, second.sum) == (4, 24 + gauge)

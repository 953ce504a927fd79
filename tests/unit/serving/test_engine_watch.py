"""Tests of serving.engine_watch against an in-process aiohttp upstream (kept here: it is the exporters' async side)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from exporters.catalog import engine as ce
from exporters.catalog import gpu as cg
from serving.config import defaults, replace
from serving.engine_watch import ENGINE_WATCH, EngineWatch, engine_watch_ctx, serving_watts
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


def test_serving_watts_selects_by_uuid_or_index() -> None:
    """Serving GPUs are picked by UUID or index; empty selects all that are up."""
    from exporters.nvml import NvmlReader

    fake = FakeNvml(3)
    reader = NvmlReader(fake)
    reader.open()
    snap = reader.read()
    assert serving_watts(snap, []) == 1050.0
    assert serving_watts(snap, ["1", fake.gpus[2].uuid]) == 700.0
    assert serving_watts(None, []) is None

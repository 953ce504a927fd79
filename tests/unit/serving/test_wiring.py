"""The sidecar's composition: request records reach the log archive, upstream OOM errors reach process health."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from log_pipeline.query import Archive
from serving import config as cfg
from serving.app import build_app
from tests.fakes.openai_upstream import FakeOpenAI


async def _run(app: web.Application, calls: Callable[[str], Awaitable[None]]) -> None:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        await calls(f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


async def test_errors_are_archived_and_found_by_trace_id(
    tmp_path: Path, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    """Every error's record is archived on shutdown and found by its trace id; sampled-out successes are not."""
    import aiohttp

    upstream = await aiohttp_server(FakeOpenAI().app())
    settings = cfg.build_settings({
        "serve": {"upstream": str(upstream.make_url("")).rstrip("/")},
        "logs": {"dir": str(tmp_path / "logs"), "success_sample_ratio": 0.0},
        "gpu": {"enabled": False},
    })
    registry = CollectorRegistry()
    trace_ids: dict[str, str] = {}

    async def calls(base: str) -> None:
        async with aiohttp.ClientSession() as session:
            for model in ("fail", "ok-model"):
                async with session.post(f"{base}/v1/completions", json={"model": model, "prompt": "p"}) as r:
                    trace_ids[model] = r.headers["x-trace-id"]

    await _run(build_app(settings, registry), calls)
    archive = Archive(tmp_path / "logs")
    found = list(archive.find(trace_ids["fail"]))
    assert len(found) == 1
    assert found[0]["outcome"] == "upstream_error"
    assert found[0]["http_status"] == 500
    assert list(archive.find(trace_ids["ok-model"])) == []


async def test_upstream_oom_is_counted(tmp_path: Path, aiohttp_server: Callable[..., Awaitable[TestServer]]) -> None:
    """An upstream 500 whose body reports out-of-memory increments the OOM counter."""
    import aiohttp

    upstream = await aiohttp_server(FakeOpenAI().app())
    settings = cfg.build_settings({
        "serve": {"upstream": str(upstream.make_url("")).rstrip("/")}, "gpu": {"enabled": False},
    })
    registry = CollectorRegistry()

    async def calls(base: str) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(f"{base}/v1/completions", json={"model": "oom", "prompt": "p"}) as r:
                    assert r.status == 500
            async with session.get(f"{base}/metrics") as r:
                text = await r.text()
        oom_lines = [line for line in text.splitlines()
                     if line.startswith('inferwatch_upstream_process_oom_events_total{source="response_body"}')]
        assert oom_lines, "the OOM counter must be exposed"
        assert float(oom_lines[0].split()[-1]) == 3

    await _run(build_app(settings, registry), calls)

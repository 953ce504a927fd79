"""Tests of serving.engine_detect: serve.engine configured or recognized, logged once, exported, and the scrape
read as the engine's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from exporters.catalog.engines import Engine
from serving.app import READINESS, build_app
from serving.config import defaults, replace
from serving.engine_detect import EngineDetector, EngineInfoCollector
from serving.engine_watch import EngineWatch

DATA = Path(__file__).resolve().parents[2] / "data"
SGLANG = (DATA / "sglang_0.5.23.prom").read_text()


async def _upstream(aiohttp_server: Any, routes: dict[str, tuple[int, str]]) -> str:
    app = web.Application()
    for path, (status, text) in routes.items():
        async def answer(_request: web.Request, status: int = status, text: str = text) -> web.Response:
            return web.Response(status=status, text=text)

        app.router.add_get(path, answer)
    server = await aiohttp_server(app)
    return f"http://127.0.0.1:{server.port}"


async def test_auto_recognizes_sglang_from_its_families_and_logs_it_once(aiohttp_server: Any) -> None:
    """auto asks /metrics, sees sglang: families, logs upstream_engine once and exports the info series."""
    upstream = await _upstream(aiohttp_server, {"/metrics": (200, SGLANG)})
    detector = EngineDetector("auto", upstream)
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            assert await detector.probe(session) == Engine.SGLANG
            await detector.probe(session)
    assert [e["engine"] for e in logs if e["event"] == "upstream_engine"] == ["sglang"]
    registry = CollectorRegistry()
    registry.register(EngineInfoCollector(detector))
    assert 'configured="auto",detected_by="metrics",engine="sglang"' in generate_latest(registry).decode()


async def test_an_upstream_that_answers_nothing_useful_stays_unknown(aiohttp_server: Any) -> None:
    """A 404 everywhere names no engine: unknown, and the info series says so."""
    upstream = await _upstream(aiohttp_server, {})
    detector = EngineDetector("auto", upstream)
    async with aiohttp.ClientSession() as session:
        assert await detector.probe(session) is None
    registry = CollectorRegistry()
    registry.register(EngineInfoCollector(detector))
    assert 'detected_by="none",engine="unknown"' in generate_latest(registry).decode()


def test_a_configured_engine_is_taken_as_given() -> None:
    """serve.engine = llamacpp needs no probe: detected_by config."""
    detector = EngineDetector("llamacpp", "http://127.0.0.1:1")
    assert (detector.engine, detector.detected_by) == (Engine.LLAMACPP, "config")


async def test_the_engine_watch_reads_the_scrape_as_the_engines_and_skips_ollama(aiohttp_server: Any) -> None:
    """The scrape of an SGLang upstream feeds the engine view; in front of Ollama nothing is scraped."""
    upstream = await _upstream(aiohttp_server, {"/metrics": (200, SGLANG)})
    settings = replace(replace(defaults(), "serve", upstream=upstream), "gpu", enabled=False)
    detector = EngineDetector("auto", upstream)
    watch = EngineWatch(settings, engine=lambda: detector.engine, on_exposition=detector.note_exposition)
    await watch.scrape_once()
    assert detector.detected_by == "metrics"
    assert watch.latest_snapshot.generation == "sglang"
    ollama = EngineWatch(settings, engine=lambda: Engine.OLLAMA)
    await ollama.scrape_once()
    await watch.stop()
    await ollama.stop()
    assert ollama.latest_text is None
    assert not dict(ollama.state.failures)


def test_ollamas_readiness_is_its_root_unless_a_path_was_configured() -> None:
    """Ollama has no /health: its root answers readiness; a configured serve.readiness_path is kept."""
    upstream = "http://127.0.0.1:11434"
    for configured, expected in (("/health", upstream + "/"), ("/api/version", upstream + "/api/version")):
        settings = replace(defaults(), "serve", upstream=upstream, engine="ollama", readiness_path=configured)
        app = build_app(settings, CollectorRegistry())
        assert app[READINESS].url == expected

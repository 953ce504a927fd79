"""Which engine is behind the sidecar (``serve.engine``; ``auto``: recognized from the upstream's answers).

``auto`` asks the upstream ``GET /metrics`` and ``GET /`` (exporters.engine_parse.engine_of_answers) at start and
again every ``scrape.interval_s`` until it answers one way or the other; a scrape of ``/metrics`` that names an
engine decides too (:meth:`EngineDetector.note_exposition`). The engine is logged once (``upstream_engine``) and
exported as ``inferwatch_upstream_engine``. Once it is Ollama: readiness is probed on its root endpoint (unless
``serve.readiness_path`` was set) and its models are polled (serving/ollama_watch.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from exporters.catalog import engines as ce
from exporters.catalog.engines import AUTO, Engine
from exporters.engine_parse import engine_of_answers, engine_of_exposition
from serving.bounded_read import read_at_most

log = structlog.get_logger(__name__)

PROBE_BYTES = 64 * 1024
"""What is read of each probe's answer: the first families of /metrics name the engine."""
DEFAULT_READINESS_PATH = "/health"


class EngineDetector:
    """The engine behind the sidecar: configured, or recognized; ``engine`` is None while unknown."""

    def __init__(self, configured: str, upstream: str, on_known: Callable[[Engine], None] | None = None) -> None:
        self.configured = configured
        self.upstream = upstream.rstrip("/")
        self.engine: Engine | None = None if configured == AUTO else Engine(configured)
        self.detected_by = "none" if self.engine is None else "config"
        self._on_known = on_known
        if self.engine is not None:
            self._known()

    def _decide(self, engine: Engine | None, how: str) -> None:
        if self.engine is None and engine is not None:
            self.engine, self.detected_by = engine, how
            self._known()

    def _known(self) -> None:
        log.info("upstream_engine", engine=str(self.engine), configured=self.configured, detected_by=self.detected_by,
                 upstream=self.upstream)
        if self._on_known is not None and self.engine is not None:
            self._on_known(self.engine)

    def note_exposition(self, text: str) -> None:
        """A scrape of ``/metrics``: its families name the engine while ``auto`` has not decided."""
        if self.engine is None:
            self._decide(engine_of_exposition(text), "metrics")

    async def probe(self, session: aiohttp.ClientSession, timeout_s: float = 2.0) -> Engine | None:
        """Ask the upstream's ``/metrics`` and ``/`` once (while the engine is unknown); the engine or None."""
        if self.engine is not None:
            return self.engine
        answers: list[tuple[int | None, str]] = []
        for path in ("/metrics", "/"):
            try:
                async with session.get(self.upstream + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as got:
                    body = await read_at_most(got.content, PROBE_BYTES)
                    answers.append((got.status, body.decode("utf-8", errors="replace")))
            except (aiohttp.ClientError, TimeoutError):
                answers.append((None, ""))
        self._decide(*engine_of_answers(*answers[0], *answers[1]))
        return self.engine


class EngineInfoCollector(Collector):
    """``inferwatch_upstream_engine``: the engine, how it is known, and ``serve.engine``."""

    def __init__(self, detector: EngineDetector) -> None:
        self._detector = detector

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One family, one series."""
        d, spec = self._detector, ce.UPSTREAM_ENGINE
        family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
        family.add_metric([d.upstream, str(d.engine) if d.engine else "unknown", d.configured, d.detected_by], 1.0)
        yield family


ENGINE_DETECTOR = web.AppKey("engine_detector", EngineDetector)


def engine_detect_ctx(
    detector: EngineDetector, registry: CollectorRegistry, session: Callable[[], aiohttp.ClientSession],
    retry_s: float,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp ``cleanup_ctx``: registers the info metric; while ``auto`` is undecided, probes every ``retry_s``."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        registry.register(EngineInfoCollector(detector))
        app[ENGINE_DETECTOR] = detector

        async def keep_probing() -> None:
            while await detector.probe(session()) is None:  # noqa: ASYNC110 - no event tells the upstream's engine: probe until known
                await asyncio.sleep(retry_s)

        task = None
        if detector.engine is None:
            await detector.probe(session())
            if detector.engine is None:
                task = asyncio.create_task(keep_probing())
        yield
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return ctx

"""Background watch of the upstream engine: /metrics scrapes, NVML polling, XID events, process health.

Plug into the app with one line::

    app.cleanup_ctx.append(engine_watch_ctx(settings, registry, inflight=app[INFLIGHT],
                                            readiness=lambda: app[READINESS].last_ok,
                                            readiness_lost=lambda: app[READINESS].lost))

The context stores the :class:`EngineWatch` under ``app[ENGINE_WATCH]`` (latest raw scrape in
``.latest_text``, parsed in ``.latest_snapshot``; ``.live_text()`` is the raw scrape while the engine
series are exported; ``.process.note_upstream_error_body(text)`` for the proxy).

The engine series (``exporters.catalog.engine.ENGINE_SERIES``: everything derived from the
upstream's /metrics) go stale, that is leave the exposition, once ``scrape.stale_after_failures``
scrapes in a row have failed or a readiness probe found the upstream not ready, and come back with
the next successful scrape of a ready upstream. The scrape-health series say which.

apscheduler runs the scrape on the event loop (aiohttp, with a timeout) and the NVML and
psutil polls in worker threads, so nothing blocks the loop; the XID event thread is a daemon thread
that stops within ``gpu.event_timeout_ms`` of shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from exporters import derive
from exporters.catalog import engine as ce
from exporters.catalog.engines import Engine
from exporters.collectors import (
    EngineCollector,
    EngineState,
    GpuCollector,
    ProcessCollector,
    SampledHistogram,
    register_collectors,
)
from exporters.engine_parse import parse_engine_exposition
from exporters.engine_stats_wire import EngineStepStats
from exporters.errors import NvmlUnavailable
from exporters.inflight import InFlightTokens
from exporters.nvml import GpuSnapshot, NvmlReader, XidWatcher, load_pynvml
from exporters.process_health import ProcessHealth, ProcessSnapshot
from exporters.vllm_parse import EMPTY, EngineSnapshot
from serving.background import PeriodicJobs
from serving.bounded_read import read_at_most
from serving.config import Settings

log = structlog.get_logger(__name__)


def serving_energy(
    readings: tuple[tuple[int, str, float | None], ...], selectors: list[str]
) -> dict[str, float | None]:
    """UUID -> energy counter (joules) of the GPUs that serve the upstream (by UUID or index; all when empty)."""
    return {
        uuid or str(index): joules for index, uuid, joules in readings
        if not selectors or uuid in selectors or str(index) in selectors
    }


class EngineWatch:
    """Holds the latest engine, GPU and process snapshots and the jobs that refresh them."""

    def __init__(
        self,
        settings: Settings,
        inflight: InFlightTokens | None = None,
        *,
        nvml_module: Any = None,
        readiness: Callable[[], bool | None] | None = None,
        readiness_lost: Callable[[], bool] | None = None,
        session_getter: Callable[[], aiohttp.ClientSession] | None = None,
        engine_step: Callable[[], EngineStepStats | None] | None = None,
        engine: Callable[[], str | None] | None = None,
        on_exposition: Callable[[str], None] | None = None,
        engine_steps: Callable[[float], list[EngineStepStats]] | None = None,
    ) -> None:
        """``engine``: the engine behind the upstream (serving/engine_detect.py; None while unknown), which picks
        how /metrics is read (Ollama has none: no scrape); ``on_exposition`` hears each scraped text.
        ``readiness``: the last readiness probe's outcome (None before one); ``readiness_lost``: whether the
        last probe with an outcome found the upstream not ready (``Readiness.lost``), which takes the engine
        series out at once."""
        self.settings = settings
        self.inflight = inflight
        self.engine_step = engine_step
        self._engine = engine or (lambda: None)
        self._on_exposition = on_exposition
        self.upstream = settings.serve.upstream.rstrip("/")
        self.url = self.upstream + settings.scrape.path
        self.latest_text: str | None = None
        self.latest_snapshot: EngineSnapshot = EMPTY
        self.state = EngineState(self.upstream)
        self.gpu: GpuSnapshot | None = None
        self.gpu_available = False
        self.process = ProcessHealth(settings.upstream_process.pid, settings.upstream_process.name_pattern)
        self.process_snapshot: ProcessSnapshot | None = None
        self._nvml_module = nvml_module
        self._readiness = readiness
        self._readiness_lost = readiness_lost
        self._session_getter = session_getter
        self._own_session: aiohttp.ClientSession | None = None
        self._reader: NvmlReader | None = None
        self._xid_stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._failures: dict[str, int] = {}
        self._consecutive_failures = 0
        self._parse_errors = 0
        self._batch = SampledHistogram(ce.ENGINE_BATCH_REQUESTS.buckets or (1,))
        self._engine_steps = engine_steps
        """The plugin's scheduler states since a time (serve.engine_stats_listen): the exact running batch."""
        self._batch_since = time.time()
        self._previous: tuple[dict[str, float], dict[str, float | None]] | None = None
        self._jobs: PeriodicJobs | None = None

    # ---- registration --------------------------------------------------------------------------
    def register(self, registry: CollectorRegistry) -> None:
        """Register the engine, GPU and process collectors on the sidecar's registry."""
        collectors: list[Any] = []
        if self.settings.scrape.enabled:
            collectors.append(EngineCollector(self.published_state, self.inflight, self.engine_step))
        if self.settings.gpu.enabled:
            collectors.append(GpuCollector(lambda: self.gpu, lambda: self.gpu_available))
        # The OOM and restart counters exist even when no process is watched: OOMs are also read
        # from upstream error bodies, and alerts need the series at zero before the first event.
        collectors.append(ProcessCollector(
            lambda: self.process_snapshot or self.process.counters(), lambda: self.gpu,
            watching=self.process.enabled,
        ))
        register_collectors(registry, *collectors)

    # ---- scrape --------------------------------------------------------------------------------
    def _session(self) -> aiohttp.ClientSession:
        if self._session_getter is not None:
            return self._session_getter()
        if self._own_session is None or self._own_session.closed:
            self._own_session = aiohttp.ClientSession()
        return self._own_session

    async def scrape_once(self) -> None:
        """Fetch, parse and publish the upstream's /metrics once; failures are counted, never raised."""
        if self._engine() == Engine.OLLAMA:
            return  # no /metrics: serving/ollama_watch.py polls its models instead
        started = time.perf_counter()
        cfg = self.settings.scrape
        reason: str | None = None
        text: str | None = None
        try:
            timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
            async with self._session().get(self.url, timeout=timeout) as response:
                if response.status != 200:
                    reason = "http_status"
                else:
                    body = await read_at_most(response.content, cfg.max_bytes)
                    if len(body) > cfg.max_bytes:
                        reason = "too_large"
                    else:
                        text = body.decode("utf-8", errors="replace")
        except TimeoutError:
            reason = "timeout"
        except aiohttp.ClientConnectionError:
            reason = "connect"
        except aiohttp.ClientError:
            reason = "error"
        if text is not None:
            duration = time.perf_counter() - started
            self._publish(text, duration, await self._serving_energy())
        else:
            self._fail(reason or "error", time.perf_counter() - started)

    def _fail(self, reason: str, duration: float) -> None:
        self._failures[reason] = self._failures.get(reason, 0) + 1
        self._consecutive_failures += 1
        log.debug("upstream_scrape_failed", url=self.url, reason=reason, in_a_row=self._consecutive_failures)
        self.state = EngineState(
            self.upstream, self.latest_snapshot, False, duration, tuple(sorted(self._failures.items())),
            self._parse_errors, self.state.last_success_timestamp, self.state.tokens_per_joule,
            self._batch.histograms(), self._consecutive_failures,
        )

    def _stale(self, state: EngineState) -> bool:
        """Whether the engine series are left out now: too many failed scrapes in a row, or readiness lost."""
        if state.consecutive_failures >= self.settings.scrape.stale_after_failures:
            return True
        return self._readiness_lost is not None and self._readiness_lost()

    def published_state(self) -> EngineState:
        """The state the collector exports: the latest one, marked stale when the engine series must go."""
        state = self.state
        return dataclasses.replace(state, stale=True) if self._stale(state) else state

    def live_text(self) -> str | None:
        """The latest raw scrape while the engine series are exported, else None (for the rule engine's store)."""
        return None if self._stale(self.state) else self.latest_text

    async def _serving_energy(self) -> dict[str, float | None]:
        """The serving GPUs' energy counters, read right after the scrape so both deltas share a window."""
        reader = self._reader
        if reader is None:
            return {}
        try:
            readings = await asyncio.get_running_loop().run_in_executor(None, reader.read_energy)
        except Exception:
            log.exception("gpu_energy_read_crashed")
            return {}
        return serving_energy(readings, list(self.settings.gpu.serving_gpus))

    def _publish(self, text: str, duration: float, energy: dict[str, float | None]) -> None:
        if self._on_exposition is not None:
            self._on_exposition(text)
        snapshot = parse_engine_exposition(text, self._engine())
        self._parse_errors += snapshot.parse_errors
        views = derive.model_views(snapshot)
        self._observe_batch(views)
        tpj = self._tokens_per_joule(views, energy)
        self.latest_text, self.latest_snapshot = text, snapshot
        self._consecutive_failures = 0
        self.state = EngineState(
            self.upstream, snapshot, True, duration, tuple(sorted(self._failures.items())), self._parse_errors,
            time.time(), tpj, self._batch.histograms(),
        )

    def _observe_batch(self, views: list[derive.ModelView]) -> None:
        """The running batch since the last scrape: every scheduler state the plugin sent (each change of the
        running count, and every 0.1 s while vLLM steps), when it is heard and vLLM serves one model; else the
        gauge this scrape read."""
        now = time.time()
        steps = self._engine_steps(self._batch_since) if self._engine_steps is not None else []
        self._batch_since = now
        for view in views:
            if steps and len(views) == 1:
                for step in steps:
                    self._batch.observe(view.model, step.running)
            elif view.running is not None:
                self._batch.observe(view.model, view.running)

    def _tokens_per_joule(
        self, views: list[derive.ModelView], energy: dict[str, float | None]
    ) -> tuple[tuple[str, float], ...]:
        """Each model's token increase over the serving GPUs' energy used since the last successful scrape."""
        tokens = {v.model: v.generation_tokens for v in views if v.generation_tokens is not None}
        previous, self._previous = self._previous, (tokens, energy)
        if previous is None:
            return ()
        before, energy_before = previous
        joules = derive.energy_used(energy_before, energy)
        out = []
        for model, count in sorted(tokens.items()):
            value = derive.tokens_per_joule(before.get(model), count, joules)
            if value is not None:
                out.append((model, value))
        return tuple(out)

    # ---- GPU -----------------------------------------------------------------------------------
    def open_gpu(self) -> bool:
        """Initialise NVML; on failure log one line and leave the GPU exporter disabled."""
        try:
            reader = NvmlReader(self._nvml_module or load_pynvml())
            reader.open()
        except NvmlUnavailable as err:
            log.warning("gpu_exporter_disabled", reason=str(err))
            return False
        self._reader, self.gpu_available = reader, True
        self.gpu = reader.read()
        return True

    def poll_gpu(self) -> None:
        """One NVML collection (call from a worker thread)."""
        if self._reader is not None:
            self.gpu = self._reader.read()

    def start_xid_thread(self) -> None:
        """Start the daemon thread that counts XID events."""
        if self._reader is None or not self.settings.gpu.xid_events:
            return
        watcher = XidWatcher(self._reader, self.settings.gpu.event_timeout_ms)
        self._xid_thread = threading.Thread(
            target=watcher.run, args=(self._xid_stop,), name="inferwatch-xid", daemon=True
        )
        self._xid_thread.start()

    # ---- process -------------------------------------------------------------------------------
    def poll_process(self) -> None:
        """One process-health reading (call from a worker thread)."""
        if self._readiness is not None:
            ready = self._readiness()
            if ready is not None:
                self.process.note_readiness(ready)
        self.process_snapshot = self.process.poll()

    # ---- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every job; the first scrape and readings happen before this returns."""
        loop = asyncio.get_running_loop()
        jobs = PeriodicJobs()
        if self.settings.scrape.enabled:
            jobs.every(self.settings.scrape.interval_s, self._safe_scrape, name="engine_scrape")
        if self.settings.gpu.enabled and await loop.run_in_executor(None, self.open_gpu):
            self.start_xid_thread()
            jobs.every(self.settings.gpu.interval_s, partial(self._in_thread, self.poll_gpu), name="gpu_poll")
        if self.process.enabled:
            jobs.every(self.settings.upstream_process.interval_s, partial(self._in_thread, self.poll_process),
                       name="process_poll")
            await self._in_thread(self.poll_process)
        jobs.start()
        self._jobs = jobs
        if self.settings.scrape.enabled:
            await self._safe_scrape()

    async def _safe_scrape(self) -> None:
        try:
            await self.scrape_once()
        except Exception:
            log.exception("upstream_scrape_crashed", url=self.url)

    async def _in_thread(self, job: Callable[[], None]) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, job)
        except Exception:
            log.exception("background_poll_crashed", job=getattr(job, "__name__", "job"))

    async def stop(self) -> None:
        """Stop the jobs, the XID thread, NVML and the own client session."""
        if self._jobs is not None:
            self._jobs.stop()
            self._jobs = None
        self._xid_stop.set()
        if self._xid_thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._xid_thread.join, 5.0)
        if self._reader is not None:
            self._reader.close()
        if self._own_session is not None:
            await self._own_session.close()


ENGINE_WATCH = web.AppKey("engine_watch", EngineWatch)


def engine_watch_ctx(
    settings: Settings,
    registry: CollectorRegistry,
    session_getter: Callable[[], aiohttp.ClientSession] | None = None,
    inflight: InFlightTokens | None = None,
    *,
    readiness: Callable[[], bool | None] | None = None,
    readiness_lost: Callable[[], bool] | None = None,
    nvml_module: Any = None,
    engine_step: Callable[[], EngineStepStats | None] | None = None,
    engine: Callable[[], str | None] | None = None,
    on_exposition: Callable[[str], None] | None = None,
    engine_steps: Callable[[float], list[EngineStepStats]] | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp ``cleanup_ctx`` factory: builds, registers, starts and finally stops an EngineWatch."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        watch = EngineWatch(
            settings, inflight, nvml_module=nvml_module, readiness=readiness, readiness_lost=readiness_lost,
            session_getter=session_getter, engine_step=engine_step, engine=engine, on_exposition=on_exposition,
            engine_steps=engine_steps,
        )
        watch.register(registry)
        app[ENGINE_WATCH] = watch
        await watch.start()
        yield
        with contextlib.suppress(Exception):
            await watch.stop()

    return ctx

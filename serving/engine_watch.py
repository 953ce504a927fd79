"""Background watch of the upstream engine: /metrics scrapes, NVML polling, XID events, process health.

Plug into the app with one line::

    app.cleanup_ctx.append(engine_watch_ctx(settings, registry, inflight=app[INFLIGHT],
                                            readiness=lambda: app[READINESS].last_ok,
                                            readiness_lost=lambda: app[READINESS].lost))

The context stores the :class:`EngineWatch` under ``app[ENGINE_WATCH]`` (latest raw scrape in
``.latest_text``, parsed in ``.latest_snapshot``; ``.live_text()`` is the raw scrape while the engine
series are exported; ``.process.note_upstream_error_body(text)`` for the proxy).

The scrape itself, and the rule by which the engine series (``exporters.catalog.engine.ENGINE_SERIES``:
everything derived from the upstream's /metrics) go stale, are serving/upstream_scrape.py's, shared with the
extra upstreams' scrapes (serving/extra_upstreams.py). The scrape-health series say which.

apscheduler runs the scrape on the event loop (aiohttp, with a timeout) and the NVML and
psutil polls in worker threads, so nothing blocks the loop; the XID event thread is a daemon thread
that stops within ``gpu.event_timeout_ms`` of shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry

from exporters.collectors import GpuCollector, ProcessCollector, register_collectors
from exporters.engine_stats_wire import EngineStepStats
from exporters.errors import NvmlUnavailable
from exporters.inflight import InFlightTokens
from exporters.nvml import GpuSnapshot, NvmlReader, XidWatcher, load_pynvml
from exporters.process_health import ProcessHealth, ProcessSnapshot
from serving.background import PeriodicJobs
from serving.config import Settings
from serving.upstream_scrape import UpstreamScrape

log = structlog.get_logger(__name__)


def serving_energy(
    readings: tuple[tuple[int, str, float | None], ...], selectors: list[str]
) -> dict[str, float | None]:
    """UUID -> energy counter (joules) of the GPUs that serve the upstream (by UUID or index; all when empty)."""
    return {
        uuid or str(index): joules for index, uuid, joules in readings
        if not selectors or uuid in selectors or str(index) in selectors
    }


class EngineWatch(UpstreamScrape):
    """The main upstream's scrape (serving/upstream_scrape.py) with the GPU and process snapshots and the jobs that
    refresh them all."""

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
        """``engine``, ``on_exposition``, ``readiness_lost`` and ``engine_steps``: as :class:`UpstreamScrape`
        takes them (``engine_steps``: the plugin's scheduler states, serve.engine_stats_listen);
        ``readiness``: the last readiness probe's outcome (None before one)."""
        super().__init__(settings.serve.upstream, settings.scrape, readiness_lost=readiness_lost,
                         session_getter=session_getter, engine=engine, on_exposition=on_exposition,
                         engine_steps=engine_steps)
        self.settings = settings
        self.inflight = inflight
        self.engine_step = engine_step
        self.gpu: GpuSnapshot | None = None
        self.gpu_available = False
        self.process = ProcessHealth(settings.upstream_process.pid, settings.upstream_process.name_pattern)
        self.process_snapshot: ProcessSnapshot | None = None
        self._nvml_module = nvml_module
        self._readiness = readiness
        self._reader: NvmlReader | None = None
        self._xid_stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._jobs: PeriodicJobs | None = None

    # ---- registration --------------------------------------------------------------------------
    def register(self, registry: CollectorRegistry) -> None:
        """Register the engine, GPU and process collectors on the sidecar's registry."""
        collectors: list[Any] = []
        if self.settings.scrape.enabled:
            collectors.append(self.collector(self.inflight, self.engine_step))
        if self.settings.gpu.enabled:
            collectors.append(GpuCollector(lambda: self.gpu, lambda: self.gpu_available))
        # The OOM and restart counters exist even when no process is watched: OOMs are also read
        # from upstream error bodies, and alerts need the series at zero before the first event.
        collectors.append(ProcessCollector(
            lambda: self.process_snapshot or self.process.counters(), lambda: self.gpu,
            watching=self.process.enabled,
        ))
        register_collectors(registry, *collectors)

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
            jobs.every(self.settings.scrape.interval_s, self.safe_scrape, name="engine_scrape")
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
            await self.safe_scrape()

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
        await self.close()


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

"""vLLM's per-request engine numbers, received from the stat-logger plugin and joined to each request.

With ``serve.engine_stats_listen`` set, the sidecar sends ``X-Request-Id: <trace id>`` to vLLM
(vLLM builds its request id from it), listens for the plugin's UDP datagrams
(:mod:`exporters.engine_stats_wire`) and hands each finished request's queue, prefill and decode
times, preemptions and cached prompt tokens to the request they belong to, found by the trace id
inside vLLM's request id.

The datagram usually arrives before the proxy has seen the end of the answer (vLLM records a step
right after queueing its output). When it has not, :meth:`EngineStatsJoin.finish` holds back the
request's observers (metrics, log record, span end) until it does, or for at most
``serve.engine_stats_wait_ms``, with a timer on the loop: the client's answer is never delayed, and
nothing waits while the plugin is silent (no datagram for :data:`PLUGIN_SILENT_AFTER_S`).

While the plugin is heard, its latest scheduler state (KV usage, requests running and waiting) is on
``/metrics`` and feeds the KV in-flight blocks and fragmentation; while it is silent (not installed,
``INFERWATCH_ENGINE_STATS`` pointing elsewhere, vLLM down) ``inferwatch_engine_stats_plugin_up`` is 0,
those families are left out rather than shown at 0, and the log says so once.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.catalog import request as cat
from exporters.engine_stats_wire import EngineRequestStats, EngineStepStats, decode
from exporters.gpu_seconds import BatchTimeline
from exporters.records import Outcome, RequestRecord

log = structlog.get_logger(__name__)

PLUGIN_SILENT_AFTER_S = 30.0
"""With no datagram for this long the plugin counts as absent: no request waits for it, and its scheduler
state is no longer current. It sends one at least every 0.1 s while vLLM steps, and repeats the latest
every 10 s while vLLM idles (vLLM's stats log interval)."""
SILENCE_CHECK_S = 5.0
"""How often the listener checks whether the plugin went silent (for the log line that says so)."""
MAX_UNCLAIMED = 4096
"""Engine records kept for requests the proxy has not finished yet (oldest dropped first)."""
STEPS_KEPT = 6000
"""Scheduler steps kept for ``inferwatch explain``'s context: ten minutes at the plugin's pace (one each 0.1 s)."""


class EngineSteps:
    """The stat-logger plugin's recent scheduler steps, with the time each arrived (Unix seconds)."""

    def __init__(self, kept: int = STEPS_KEPT) -> None:
        self._steps: deque[tuple[float, EngineStepStats]] = deque(maxlen=kept)

    def add(self, step: EngineStepStats) -> None:
        """Note a step that just arrived."""
        self._steps.append((time.time(), step))

    def since(self, start_unix: float) -> list[EngineStepStats]:
        """The steps that arrived after ``start_unix``, oldest first."""
        return [step for t, step in self._steps if t > start_unix]

    def between(self, start_unix: float, end_unix: float) -> list[EngineStepStats] | None:
        """The steps in ``[start, end]`` and the one before (the state at the start); None when no kept step
        came before ``end`` (the steps may begin after ``start``: a sidecar that started meanwhile)."""
        steps = list(self._steps)
        if not steps or steps[0][0] > end_unix:
            return None
        inside = [step for t, step in steps if start_unix <= t <= end_unix]
        before = [step for t, step in steps if t < start_unix][-1:]
        return before + inside


class PluginStateCollector(Collector):
    """Whether the plugin is heard and, only while it is, the scheduler state and drop count it last sent."""

    def __init__(self, current: Callable[[], EngineStepStats | None], heard: Callable[[], bool]) -> None:
        self._current = current
        self._heard = heard

    def collect(self) -> Iterator[Metric]:
        """Build the families (no I/O)."""
        up = GaugeMetricFamily(cat.ENGINE_STATS_PLUGIN_UP.name, cat.ENGINE_STATS_PLUGIN_UP.help)
        up.add_metric([], 1.0 if self._heard() else 0.0)
        yield up
        step = self._current()
        if step is None:
            return
        dropped = GaugeMetricFamily(cat.ENGINE_STATS_PLUGIN_DROPPED.name, cat.ENGINE_STATS_PLUGIN_DROPPED.help)
        dropped.add_metric([], step.dropped)
        usage = GaugeMetricFamily(cat.ENGINE_PLUGIN_KV_CACHE_USAGE.name, cat.ENGINE_PLUGIN_KV_CACHE_USAGE.help)
        usage.add_metric([], step.kv_cache_usage)
        spec = cat.ENGINE_PLUGIN_REQUESTS
        requests = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        for state, value in (("running", step.running), ("waiting", step.waiting), ("deferred", step.deferred)):
            requests.add_metric([state], value)
        yield from (dropped, usage, requests)


class EngineStatsMetrics:
    """Datagrams and records received, joins made and missed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        spec = cat.ENGINE_STATS_RECORDS
        records = Counter(spec.name, spec.help, spec.labels, registry=registry)
        self.records = {kind: records.labels(kind) for kind in ("request", "step", "invalid")}
        spec = cat.ENGINE_STATS_JOINS
        joins = Counter(spec.name, spec.help, spec.labels, registry=registry)
        self.joins = {result: joins.labels(result) for result in ("joined", "missed")}


class EngineStatsJoin(asyncio.DatagramProtocol):
    """Receives the plugin's datagrams and joins their request records to the proxy's requests."""

    def __init__(self, registry: CollectorRegistry, wait_s: float) -> None:
        self.metrics = EngineStatsMetrics(registry)
        registry.register(PluginStateCollector(self.current_step, self.plugin_heard))
        self.wait_s = wait_s
        self.last_heard = float("-inf")
        self._said_silent = False
        self.latest_step: EngineStepStats | None = None
        self.steps = EngineSteps()
        """The recent steps, for the context of explanations."""
        self.timeline = BatchTimeline()
        """The running count over time: each request's share of its batch, and the engine's busy time."""
        self._unclaimed: OrderedDict[str, EngineRequestStats] = OrderedDict()
        self._waiting: dict[str, tuple[RequestRecord, Callable[[], None], asyncio.TimerHandle]] = {}

    def plugin_heard(self) -> bool:
        """Whether a datagram came within :data:`PLUGIN_SILENT_AFTER_S`."""
        return time.monotonic() - self.last_heard < PLUGIN_SILENT_AFTER_S

    def current_step(self) -> EngineStepStats | None:
        """The scheduler state after vLLM's latest step, while the plugin is heard; None while it is silent."""
        return self.latest_step if self.plugin_heard() else None

    def check_silence(self) -> None:
        """Log once when the plugin is (or went) silent: the KV in-flight figures are estimates from then on."""
        if not self.plugin_heard() and not self._said_silent:
            self._said_silent = True
            log.warning("engine_stats_plugin_silent", silent_for_s=PLUGIN_SILENT_AFTER_S,
                        hint="is inferwatch[vllm-plugin] installed in vLLM's environment, with "
                             "INFERWATCH_ENGINE_STATS naming this listener? KV in-flight blocks and fragmentation "
                             "are the sidecar's estimate until it is heard")

    # ---- the plugin's side

    def datagram_received(self, data: bytes, addr: Any) -> None:
        """Parse a datagram; claim each finished request for a waiting request or keep it for one."""
        try:
            step, requests = decode(data)
        except ValueError as err:
            self.metrics.records["invalid"].inc()
            log.warning("engine_stats_datagram_invalid", problem=str(err), sender=str(addr))
            return
        if self._said_silent:
            self._said_silent = False
            log.info("engine_stats_plugin_heard", sender=str(addr))
        self.last_heard = time.monotonic()
        if step is not None:
            self.metrics.records["step"].inc()
            self.latest_step = step
            self.steps.add(step)
            self.timeline.add(time.time(), step.running)
        for stats in requests:
            self.metrics.records["request"].inc()
            trace_id = stats.trace_id
            if trace_id is None:
                continue  # a request that did not come through a sidecar
            waiting = self._waiting.pop(trace_id, None)
            if waiting is not None:
                record, finish, timer = waiting
                timer.cancel()
                self._join(record, stats)
                finish()
                continue
            self._unclaimed[trace_id] = stats
            if len(self._unclaimed) > MAX_UNCLAIMED:
                self._unclaimed.popitem(last=False)

    # ---- the proxy's side

    def _join(self, record: RequestRecord, stats: EngineRequestStats | None) -> None:
        record.engine = stats
        self.metrics.joins["joined" if stats is not None else "missed"].inc()

    def finish(self, record: RequestRecord, finish: Callable[[], None]) -> None:
        """Attach the request's engine numbers and call ``finish``; wait for them first when they may come."""
        stats = self._unclaimed.pop(record.trace_id, None)
        if stats is not None:
            self._join(record, stats)
            finish()
            return
        reached_engine = (record.outcome is Outcome.OK and record.route in cat.GENERATION_ROUTES
                          and record.http_status == 200)
        plugin_alive = time.monotonic() - self.last_heard < PLUGIN_SILENT_AFTER_S
        if not reached_engine or not plugin_alive or record.trace_id in self._waiting:
            if reached_engine:
                self._join(record, None)
            finish()
            return
        timer = asyncio.get_running_loop().call_later(self.wait_s, self._give_up, record.trace_id)
        self._waiting[record.trace_id] = (record, finish, timer)

    def _give_up(self, trace_id: str) -> None:
        waiting = self._waiting.pop(trace_id, None)
        if waiting is not None:
            record, finish, _ = waiting
            self._join(record, None)
            finish()

    def flush(self) -> None:
        """Finish every request still waiting (at shutdown)."""
        for trace_id in list(self._waiting):
            self._waiting[trace_id][2].cancel()
            self._give_up(trace_id)


ENGINE_STATS = web.AppKey("engine_stats", EngineStatsJoin)


def listen_address(value: str) -> tuple[str, int]:
    """``udp://HOST:PORT`` or ``HOST:PORT`` -> (host, port)."""
    host, _, port = value.removeprefix("udp://").rpartition(":")
    return host.strip("[]"), int(port)


async def _check_silence(join: EngineStatsJoin) -> None:
    await asyncio.sleep(PLUGIN_SILENT_AFTER_S)  # the plugin's first datagram may take this long (an idle vLLM)
    while True:
        join.check_silence()
        await asyncio.sleep(SILENCE_CHECK_S)


def engine_stats_ctx(join: EngineStatsJoin, listen: str) -> Callable[[web.Application], AsyncIterator[None]]:
    """Cleanup context: bind the UDP listener for the app's lifetime, and say when the plugin is not heard (after
    :data:`PLUGIN_SILENT_AFTER_S`); at shutdown finish what waits."""

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        host, port = listen_address(listen)
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: join, local_addr=(host, port)
        )
        log.info("engine_stats_listening", address=f"udp://{host}:{port}")
        watch = asyncio.create_task(_check_silence(join))
        try:
            yield
        finally:
            watch.cancel()
            transport.close()
            join.flush()

    return ctx

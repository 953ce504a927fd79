"""Collectors that turn the latest published snapshots into fresh metric families at each scrape.

A background job publishes an immutable :class:`EngineState`, :class:`~exporters.nvml.GpuSnapshot`
or :class:`~exporters.process_health.ProcessSnapshot`; the collectors read whatever is current
through a getter and build families from it. ``collect()`` does no I/O and never raises.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters import derive
from exporters.catalog import engine as ce
from exporters.catalog import gpu as cg
from exporters.catalog import process as cp
from exporters.catalog.spec import MetricSpec
from exporters.engine_stats_wire import EngineStepStats
from exporters.inflight import InFlightTokens
from exporters.nvml import GpuSnapshot
from exporters.process_health import ProcessSnapshot, gpu_memory_of
from exporters.vllm_parse import EMPTY, EngineSnapshot, Histogram


def _gauge(spec: MetricSpec, labels: Sequence[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels if labels is None else labels))


def _counter(spec: MetricSpec) -> CounterMetricFamily:
    return CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))


class SampledHistogram:
    """A thread-safe cumulative histogram fed one observation at a time (e.g. once per scrape)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self._lock = threading.Lock()
        self._counts: dict[str, list[float]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, key: str, value: float) -> None:
        """Add one observation for ``key`` (a model name)."""
        with self._lock:
            counts = self._counts.setdefault(key, [0.0] * (len(self.bounds) + 1))
            counts[bisect.bisect_left(self.bounds, value)] += 1
            self._sums[key] = self._sums.get(key, 0.0) + value

    def histograms(self) -> dict[str, Histogram]:
        """Cumulative view per key."""
        with self._lock:
            out = {}
            for key, counts in self._counts.items():
                running, buckets = 0.0, []
                for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
                    running += count
                    buckets.append((bound, running))
                out[key] = Histogram(tuple(buckets), self._sums[key], running)
            return out


@dataclass(frozen=True, slots=True)
class EngineState:
    """What the scrape job publishes after each scrape of the upstream."""

    upstream: str
    snapshot: EngineSnapshot = EMPTY
    up: bool = False
    duration_seconds: float | None = None
    failures: tuple[tuple[str, int], ...] = ()
    parse_errors_total: int = 0
    last_success_timestamp: float | None = None
    tokens_per_joule: tuple[tuple[str, float], ...] = ()
    batch_requests: dict[str, Histogram] = field(default_factory=dict)
    consecutive_failures: int = 0
    stale: bool = False
    """The engine series are left out of the exposition (``ce.SCRAPE_STALE``): the upstream has failed too many
    scrapes in a row or lost readiness, and its last snapshot must not pass for a live engine."""


def _histogram_family(spec: MetricSpec, label_value: str, hist: Histogram, family: HistogramMetricFamily) -> None:
    buckets = [("+Inf" if b == float("inf") else repr(float(b)), c) for b, c in hist.buckets]
    if not buckets or buckets[-1][0] != "+Inf":
        buckets.append(("+Inf", hist.count))
    family.add_metric([label_value], buckets, hist.sum)


class EngineCollector(Collector):
    """The scrape-health families (always) and the engine and KV-cache families derived from the upstream's
    /metrics (``ce.ENGINE_SERIES``; none while ``EngineState.stale``)."""

    def __init__(
        self, state: Callable[[], EngineState], inflight: InFlightTokens | None = None,
        engine_step: Callable[[], EngineStepStats | None] | None = None,
    ) -> None:
        self._state = state
        self._inflight = inflight
        self._engine_step = engine_step
        """The scheduler state after vLLM's latest step (the stat-logger plugin), while the plugin is heard."""

    def collect(self) -> Iterator[Metric]:
        """Build the families from the latest state."""
        state = self._state()
        yield from self._scrape_health(state)
        if state.stale:  # absent, not frozen: Prometheus and the rule engine see the series end
            return
        views = derive.model_views(state.snapshot)
        yield from self._engine(state, views)
        yield from self._kv(views)
        yield from self._swap(views)
        yield from self._fragmentation(views, state.up, state.snapshot.generation)

    def _scrape_health(self, state: EngineState) -> Iterator[Metric]:
        up = _gauge(ce.SCRAPE_UP)
        up.add_metric([state.upstream], 1.0 if state.up else 0.0)
        yield up
        if state.duration_seconds is not None:
            duration = _gauge(ce.SCRAPE_DURATION)
            duration.add_metric([state.upstream], state.duration_seconds)
            yield duration
        failures = _counter(ce.SCRAPE_FAILURES)
        for reason, count in state.failures:
            failures.add_metric([state.upstream, reason], count)
        yield failures
        errors = _counter(ce.SCRAPE_PARSE_ERRORS)
        errors.add_metric([state.upstream], state.parse_errors_total)
        yield errors
        unknown = _gauge(ce.SCRAPE_UNKNOWN_FAMILIES)
        unknown.add_metric([state.upstream], len(state.snapshot.unknown_families))
        yield unknown
        if state.last_success_timestamp is not None:
            last = _gauge(ce.SCRAPE_LAST_SUCCESS)
            last.add_metric([state.upstream], state.last_success_timestamp)
            yield last
        consecutive, stale = _gauge(ce.SCRAPE_CONSECUTIVE_FAILURES), _gauge(ce.SCRAPE_STALE)
        consecutive.add_metric([state.upstream], state.consecutive_failures)
        stale.add_metric([state.upstream], 1.0 if state.stale else 0.0)
        yield from (consecutive, stale)

    def _engine(self, state: EngineState, views: list[derive.ModelView]) -> Iterator[Metric]:
        snap = state.snapshot
        info, requests = _gauge(ce.ENGINE_INFO), _gauge(ce.ENGINE_REQUESTS)
        preempt, prefill, decode = _counter(ce.ENGINE_PREEMPTIONS), _counter(ce.ENGINE_PREFILL_SECONDS), \
            _counter(ce.ENGINE_DECODE_SECONDS)
        p_share, d_share, hit = _gauge(ce.ENGINE_PREFILL_SHARE), _gauge(ce.ENGINE_DECODE_SHARE), \
            _gauge(ce.ENGINE_PREFIX_CACHE_HIT_RATIO)
        gen_tokens = _counter(ce.ENGINE_GENERATION_TOKENS)
        steps = HistogramMetricFamily(ce.ENGINE_STEP_TOKENS.name, ce.ENGINE_STEP_TOKENS.help, labels=["model_name"])
        batch = HistogramMetricFamily(
            ce.ENGINE_BATCH_REQUESTS.name, ce.ENGINE_BATCH_REQUESTS.help, labels=["model_name"]
        )
        for v in views:
            m = [v.model]
            info.add_metric([v.model, snap.generation or "unknown", str(v.engines)], 1.0)
            for st, value in (("running", v.running), ("waiting", v.waiting), ("swapped", v.swapped)):
                if value is not None:
                    requests.add_metric([v.model, st], value)
            for fam, value in ((preempt, v.preemptions), (prefill, v.prefill_seconds), (decode, v.decode_seconds),
                               (p_share, v.prefill_share), (d_share, v.decode_share), (hit, v.prefix_hit_ratio),
                               (gen_tokens, v.generation_tokens)):
                if value is not None:
                    fam.add_metric(m, value)
            if v.step_tokens is not None:
                _histogram_family(ce.ENGINE_STEP_TOKENS, v.model, v.step_tokens, steps)
        for model, hist in sorted(state.batch_requests.items()):
            _histogram_family(ce.ENGINE_BATCH_REQUESTS, model, hist, batch)
        yield from (info, requests, preempt, prefill, decode, p_share, d_share, hit, gen_tokens, steps, batch)
        waiting, rejections = _gauge(ce.ENGINE_WAITING_BY_REASON), _counter(ce.ENGINE_ADMISSION_REJECTIONS)
        for v in views:
            for reason, value in (v.waiting_by_reason or {}).items():
                waiting.add_metric([v.model, reason], value)
            for reason, value in (v.admission_rejections_by_reason or {}).items():
                rejections.add_metric([v.model, reason], value)
        yield from (waiting, rejections)
        tpj = _gauge(cg.GPU_TOKENS_PER_JOULE)
        for model, value in state.tokens_per_joule:
            tpj.add_metric([model], value)
        yield tpj

    def _kv(self, views: list[derive.ModelView]) -> Iterator[Metric]:
        specs = (
            (ce.KV_USAGE, "kv_usage"), (ce.KV_BLOCKS_TOTAL, "blocks_total"), (ce.KV_BLOCKS_USED, "blocks_used"),
            (ce.KV_BLOCK_SIZE, "block_size"), (ce.KV_CAPACITY_TOKENS, "capacity_tokens"),
        )
        for spec, attr in specs:
            fam = _gauge(spec)
            for v in views:
                value = getattr(v, attr)
                if value is not None:
                    fam.add_metric([v.model], float(value))
            yield fam

    def _swap(self, views: list[derive.ModelView]) -> Iterator[Metric]:
        moved, seconds = _counter(ce.KV_SWAP_BYTES), _counter(ce.KV_SWAP_SECONDS)
        usage, failures = _gauge(ce.KV_SWAP_CPU_USAGE), _counter(ce.KV_SWAP_ALLOCATION_FAILURES)
        for v in views:
            for fam, direction, value in (
                (moved, "store", v.offload_store_bytes), (moved, "load", v.offload_load_bytes),
                (seconds, "store", v.offload_store_seconds), (seconds, "load", v.offload_load_seconds),
            ):
                if value is not None:
                    fam.add_metric([v.model, direction], value)
            if v.offload_cpu_usage is not None:
                usage.add_metric([v.model], v.offload_cpu_usage)
            if v.offload_allocation_failures is not None:
                failures.add_metric([v.model], v.offload_allocation_failures)
        yield from (moved, seconds, usage, failures)

    def _fragmentation(
        self, views: list[derive.ModelView], fresh: bool, generation: str | None
    ) -> Iterator[Metric]:
        """With the stat-logger plugin heard (one served model, one engine), the blocks are vLLM's own, after its
        latest step, and its running count picks the running requests whose tokens are counted. Without it,
        an estimate. ``fresh``: the latest scrape of the upstream succeeded. After a failed one its running
        counts are stale (a 0 from before a burst would hide every request in flight), so none is used: the
        requests that fit in the blocks vLLM has (a static figure, from the last scrape that gave it) are
        counted."""
        tokens, blocks, ratio = _gauge(ce.KV_INFLIGHT_TOKENS), _gauge(ce.KV_INFLIGHT_BLOCKS), \
            _gauge(ce.KV_FRAGMENTATION)
        sizes = {v.model: v.block_size for v in views if v.block_size}
        running = {v.model: v.running for v in views} if fresh else {}
        usable = {
            v.model: derive.usable_blocks(v.blocks_total, generation, v.engines)
            for v in views if v.blocks_total is not None
        }
        measured = self._measured_used_blocks(views)
        running.update({model: step_running for model, (_, step_running) in measured.items()})
        entries = self._inflight.snapshot() if self._inflight is not None else []
        default = next(iter(sizes.values())) if len(set(sizes.values())) == 1 else None
        for model in sorted({e.model for e in entries} | measured.keys()):
            size = sizes.get(model, default)
            held = derive.running_entries(
                [e for e in entries if e.model == model], running.get(model), size, usable.get(model)
            )
            used = measured[model][0] if model in measured else None
            frag = next(iter(derive.fragmentation(held, size, used)), None)
            if used is not None:
                blocks.add_metric([model], used)
                if self._inflight is not None:
                    tokens.add_metric([model], frag.tokens if frag is not None else 0)
            elif frag is not None:
                blocks.add_metric([model], frag.blocks)
                tokens.add_metric([model], frag.tokens)
            if frag is not None and frag.ratio is not None:
                ratio.add_metric([model], frag.ratio)
        yield from (tokens, blocks, ratio)

    def _measured_used_blocks(self, views: list[derive.ModelView]) -> dict[str, tuple[float, int]]:
        """``{model: (blocks in use, requests running)}`` after vLLM's latest step, while the plugin is heard
        (one served model, one engine: what the plugin reports)."""
        step = self._engine_step() if self._engine_step is not None else None
        view = views[0] if len(views) == 1 else None
        if step is None or view is None or view.engines != 1 or view.blocks_total is None:
            return {}
        return {view.model: (step.kv_cache_usage * derive.usable_blocks(view.blocks_total, "v1_engine"),
                             step.running)}


class GpuCollector(Collector):
    """The NVML GPU families from the latest :class:`GpuSnapshot` (only ``gpu_exporter_up`` without one)."""

    def __init__(self, snapshot: Callable[[], GpuSnapshot | None], available: Callable[[], bool]) -> None:
        self._snapshot = snapshot
        self._available = available

    def collect(self) -> Iterator[Metric]:
        """Build the GPU families."""
        up = _gauge(cg.GPU_EXPORTER_UP)
        up.add_metric([], 1.0 if self._available() else 0.0)
        yield up
        snap = self._snapshot()
        if snap is None:
            return
        count = _gauge(cg.GPU_COUNT)
        count.add_metric([], snap.count)
        yield count
        duration = _gauge(cg.GPU_EXPORTER_COLLECT_DURATION)
        duration.add_metric([], snap.duration_seconds)
        yield duration
        yield from self._per_gpu(snap)
        yield from self._exporter_counters(snap)

    def _per_gpu(self, snap: GpuSnapshot) -> Iterator[Metric]:
        fams = {spec.name: (_counter(spec) if spec.type.value == "counter" else _gauge(spec)) for spec in (
            cg.GPU_INFO, cg.GPU_UP, cg.GPU_MEMORY_USED, cg.GPU_MEMORY_TOTAL, cg.GPU_MEMORY_FREE,
            cg.GPU_MEMORY_RESERVED, cg.GPU_UTILIZATION, cg.GPU_MEMORY_COPY_UTILIZATION, cg.GPU_POWER,
            cg.GPU_POWER_LIMIT, cg.GPU_ENERGY, cg.GPU_TEMPERATURE, cg.GPU_SM_CLOCK, cg.GPU_MEMORY_CLOCK,
            cg.GPU_CLOCK_EVENT_ACTIVE, cg.GPU_ECC_ERRORS, cg.GPU_REMAPPED_ROWS, cg.GPU_ROW_REMAP_PENDING,
            cg.GPU_PROCESSES, cg.GPU_PROCESS_MEMORY,
        )}
        simple = (
            (cg.GPU_MEMORY_USED, "memory_used"), (cg.GPU_MEMORY_TOTAL, "memory_total"),
            (cg.GPU_MEMORY_FREE, "memory_free"), (cg.GPU_MEMORY_RESERVED, "memory_reserved"),
            (cg.GPU_UTILIZATION, "utilization"), (cg.GPU_MEMORY_COPY_UTILIZATION, "memory_copy_utilization"),
            (cg.GPU_POWER, "power_watts"), (cg.GPU_POWER_LIMIT, "power_limit_watts"),
            (cg.GPU_ENERGY, "energy_joules"), (cg.GPU_TEMPERATURE, "temperature_celsius"),
            (cg.GPU_SM_CLOCK, "sm_clock_hertz"), (cg.GPU_MEMORY_CLOCK, "memory_clock_hertz"),
        )
        for g in snap.gpus:
            ids = [str(g.index), g.uuid]
            fams[cg.GPU_UP.name].add_metric(ids, 1.0 if g.up else 0.0)
            fams[cg.GPU_INFO.name].add_metric(
                [*ids, g.name, g.pci_bus_id, snap.driver_version, snap.cuda_driver_version,
                 str(g.memory_total) if g.memory_total is not None else ""], 1.0,
            )
            if not g.up:
                continue
            for spec, attr in simple:
                value = getattr(g, attr)
                if value is not None:
                    fams[spec.name].add_metric(ids, float(value))
            for reason, active in g.clock_events:
                fams[cg.GPU_CLOCK_EVENT_ACTIVE.name].add_metric([*ids, reason], 1.0 if active else 0.0)
            for kind, value in g.ecc_errors:
                fams[cg.GPU_ECC_ERRORS.name].add_metric([*ids, kind], value)
            for kind, value in g.remapped_rows:
                fams[cg.GPU_REMAPPED_ROWS.name].add_metric([*ids, kind], value)
            if g.row_remap_pending is not None:
                fams[cg.GPU_ROW_REMAP_PENDING.name].add_metric(ids, 1.0 if g.row_remap_pending else 0.0)
            fams[cg.GPU_PROCESSES.name].add_metric(ids, len(g.processes))
            for pid, used in g.processes:
                if used is not None:
                    fams[cg.GPU_PROCESS_MEMORY.name].add_metric([*ids, str(pid)], used)
        yield from fams.values()

    def _exporter_counters(self, snap: GpuSnapshot) -> Iterator[Metric]:
        xid, last = _counter(cg.GPU_XID_ERRORS), _gauge(cg.GPU_XID_LAST)
        for x in snap.xids:
            xid.add_metric([str(x.index), x.uuid, str(x.xid)], x.count)
            last.add_metric([str(x.index), x.uuid, str(x.xid)], x.last_timestamp)
        unsupported, errors = _counter(cg.GPU_EXPORTER_UNSUPPORTED), _counter(cg.GPU_EXPORTER_ERRORS)
        for index, uuid, call, count in snap.unsupported:
            unsupported.add_metric([str(index), uuid, call], count)
        for index, uuid, call, cls, count in snap.errors:
            errors.add_metric([str(index), uuid, call, cls], count)
        yield from (xid, last, unsupported, errors)


class ProcessCollector(Collector):
    """The upstream-process families from the latest :class:`ProcessSnapshot` and GPU snapshot."""

    def __init__(
        self, snapshot: Callable[[], ProcessSnapshot | None], gpu: Callable[[], GpuSnapshot | None],
        *, watching: bool = True,
    ) -> None:
        self._snapshot = snapshot
        self._gpu = gpu
        self._watching = watching  # False: no pid/pattern configured, only the OOM and restart counters

    def collect(self) -> Iterator[Metric]:
        """Build the process families."""
        snap = self._snapshot()
        if snap is None:
            return
        if self._watching:
            yield from self._process_families(snap)
        restarts, oom = _counter(cp.PROCESS_RESTARTS), _counter(cp.PROCESS_OOM_EVENTS)
        for reason, n in snap.restarts:
            restarts.add_metric([reason], n)
        for source, n in snap.oom_events:
            oom.add_metric([source], n)
        yield from (restarts, oom)

    def _process_families(self, snap: ProcessSnapshot) -> Iterator[Metric]:
        up, count = _gauge(cp.PROCESS_UP), _gauge(cp.PROCESS_COUNT)
        up.add_metric([], 1.0 if snap.found else 0.0)
        count.add_metric([], len(snap.pids))
        yield from (up, count)
        if snap.rss_bytes is not None:
            rss = _gauge(cp.PROCESS_RESIDENT_MEMORY)
            rss.add_metric([], snap.rss_bytes)
            yield rss
        gpu = self._gpu()
        if gpu is not None and snap.pids:
            used = gpu_memory_of(snap.pids, [p for g in gpu.gpus for p in g.processes])
            if used is not None:
                fam = _gauge(cp.PROCESS_GPU_MEMORY)
                fam.add_metric([], used)
                yield fam


def register_collectors(registry: CollectorRegistry, *collectors: Collector) -> None:
    """Register collectors on the sidecar's registry (never the global one)."""
    for collector in collectors:
        registry.register(collector)

"""``inferwatch explain`` on the sidecar's side: the ring of recent requests and ``/admin/requests``.

Every finished request goes into a bounded ring (``serve.explain_ring_size``, default 10,000) as the
record the proxy already built: a deque append and a dict store, nothing copied or computed (the
cost and the memory per entry are measured by ``benchmarks/explain_ring.py``). An explanation is
computed only when asked (:mod:`exporters.explain`), with the engine's state around the request
from what the sidecar already holds: the stat-logger plugin's recent scheduler steps (running,
waiting, KV usage, every 0.1 s), else the embedded rule engine's store of scraped series; vLLM's
preemption counter, the sidecar's requests in flight and the GPUs' NVML readings (utilisation, memory,
temperature, clock events) from that store; the cold starts the readiness probes saw.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from aiohttp import web

from alert_rules.context import ANNOTATION as CONTEXT_ANNOTATION
from alert_rules.engine import RuleFileError, parse_duration_ms
from alert_rules.notify import Notification
from alert_rules.promql.evaluate import Evaluator
from alert_rules.spec import selector
from alert_rules.store import SeriesStore
from exporters.catalog import gpu as gpu_specs
from exporters.catalog import request as request_specs
from exporters.catalog import vllm as vllm_specs
from exporters.catalog.spec import MetricSpec
from exporters.cold_start import ColdStartTracker
from exporters.explain import (
    SLOWEST_MAX,
    Alongside,
    ColdStartSpan,
    EngineContext,
    explain,
    facts_from_record,
    slowest_row,
)
from exporters.records import RequestRecord
from serving.endpoints import error_response
from serving.engine_stats import EngineSteps

PEER_WINDOW = "1h"
PEER_HISTOGRAMS: dict[str, MetricSpec] = {
    "e2e": request_specs.E2E_LATENCY_SECONDS, "engine_queue": request_specs.ENGINE_QUEUE_SECONDS,
    "prefill": request_specs.ENGINE_PREFILL_SECONDS, "decode": request_specs.ENGINE_DECODE_SECONDS,
}
"""The sidecar's histograms a request's parts are compared with (same model and length bucket, last hour)."""


class RequestRing:
    """The last ``size`` finished requests, oldest first, found by trace id.

    :meth:`add` runs on the request path (an observer): it keeps a reference to the record.
    """

    __slots__ = ("_index", "_records", "_size")

    def __init__(self, size: int) -> None:
        self._size = size
        self._records: deque[RequestRecord] = deque()
        self._index: dict[str, RequestRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def add(self, record: RequestRecord) -> None:
        """Keep ``record``; past the size, forget the oldest."""
        records = self._records
        if len(records) == self._size:
            oldest = records.popleft()
            if self._index.get(oldest.trace_id) is oldest:
                del self._index[oldest.trace_id]
        records.append(record)
        self._index[record.trace_id] = record

    def get(self, trace_id: str) -> RequestRecord | None:
        """The latest request of ``trace_id`` still in the ring."""
        return self._index.get(trace_id)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(list(self._records))

    def alongside(self, record: RequestRecord) -> Alongside:
        """The other requests in the ring that were in flight at some moment of ``record``'s, and their lengths."""
        start, end = record.start_unix, record.start_unix + (record.e2e_s or 0.0)
        others = [r for r in self if r is not record and r.start_unix < end and start < r.start_unix + (r.e2e_s or 0.0)]
        prompts = [r.prompt_tokens or 0 for r in others]
        return Alongside(len(others), sum(prompts), max(prompts, default=0),
                         sum(r.completion_tokens or 0 for r in others))

    def slowest(self, n: int, since_unix: float, model: str | None = None) -> list[RequestRecord]:
        """The ``n`` slowest requests that started at or after ``since_unix`` (of ``model`` when given)."""
        chosen = [r for r in self if r.start_unix >= since_unix and (model is None or r.model == model)]
        chosen.sort(key=lambda r: r.e2e_s or 0.0, reverse=True)
        return chosen[:n]


def _store_max(store: SeriesStore, name: str, start_ms: int, end_ms: int, **where: str) -> float | None:
    """The largest sum over series (those with the labels ``where``) at one time of ``name`` in ``[start, end]``;
    None when none was stored."""
    totals: dict[int, float] = {}
    for labels, times, values in store.window(name, [], start_ms, end_ms):
        if where and any(dict(labels).get(key) != value for key, value in where.items()):
            continue
        for t, v in zip(times, values, strict=True):
            totals[t] = totals.get(t, 0.0) + v
    return max(totals.values()) if totals else None


def _store_peak(store: SeriesStore, name: str, start_ms: int, end_ms: int) -> float | None:
    """The largest sample of any series of ``name`` in ``[start, end]`` (the busiest GPU); None when none was."""
    values = [v for _labels, _times, vs in store.window(name, [], start_ms, end_ms) for v in vs]
    return max(values) if values else None


def _store_clock_events(store: SeriesStore, start_ms: int, end_ms: int) -> tuple[str, ...]:
    """The clock-event reasons active on any GPU in ``[start, end]``."""
    reasons = {dict(labels).get("reason", "") for labels, _times, values in
               store.window(gpu_specs.GPU_CLOCK_EVENT_ACTIVE.series, [], start_ms, end_ms) if max(values) >= 1}
    return tuple(sorted(reasons - {""}))


def _store_increase(store: SeriesStore, name: str, start_ms: int, end_ms: int) -> float | None:
    rows = store.increases(name, [], start_ms, end_ms, counter=True)
    return sum(row[5] for row in rows) if rows else None


class ContextSources:
    """Where the engine's state around a request is read from (each may be missing)."""

    def __init__(
        self, *, steps: EngineSteps | None, store: Callable[[], SeriesStore | None], cold_starts: ColdStartTracker,
        max_num_seqs: int, scrape_interval_s: float, readiness_interval_s: float = 0.0,
    ) -> None:
        self._readiness_interval_s = readiness_interval_s
        self.steps = steps
        self.store = store
        self._cold_starts = cold_starts
        self._max_num_seqs = max_num_seqs or None
        self._pad_s = scrape_interval_s

    def _cold_start_spans(self) -> tuple[ColdStartSpan, ...]:
        tracker = self._cold_starts
        lost = self._readiness_interval_s
        spans = [ColdStartSpan(c.cause, c.began_unix, c.began_unix + c.first_token_after_s, c.began_unix - lost)
                 for c in tracker.recent]
        going_on = tracker.in_progress()
        if going_on is not None:
            spans.append(ColdStartSpan(going_on["cause"], going_on["began_unix"], None,
                                       going_on["began_unix"] - lost))
        return tuple(spans)

    def context(self, start_unix: float, end_unix: float) -> EngineContext:
        """The engine's state while a request ran from ``start_unix`` to ``end_unix``."""
        cold = self._cold_start_spans()
        store = self.store()
        preemptions = in_flight = None
        gpu: dict[str, Any] = {}
        notes = []
        if store is not None:
            pad_ms = int(self._pad_s * 1000)
            start_ms, end_ms = int(start_unix * 1000) - pad_ms, int(end_unix * 1000) + pad_ms
            try:  # the rule engine's thread may be writing: a read that trips on it leaves these unknown
                preemptions = _store_increase(store, vllm_specs.NUM_PREEMPTIONS.series, start_ms, end_ms)
                in_flight = _store_max(store, request_specs.REQUESTS_IN_FLIGHT.series, start_ms, end_ms)
                gpu = {"gpu_utilization_max": _store_peak(store, gpu_specs.GPU_UTILIZATION.series, start_ms, end_ms),
                       "gpu_memory_used_max_bytes": _store_peak(store, gpu_specs.GPU_MEMORY_USED.series, start_ms,
                                                                end_ms),
                       "gpu_temperature_max": _store_peak(store, gpu_specs.GPU_TEMPERATURE.series, start_ms, end_ms),
                       "gpu_clock_events": _store_clock_events(store, start_ms, end_ms)}
            except (IndexError, ValueError, RuntimeError):
                notes.append("the store was busy")
        steps = self.steps.between(start_unix, end_unix) if self.steps is not None else None
        limit: dict[str, Any] = {"max_num_seqs": self._max_num_seqs,
                                 "max_num_seqs_source": "rules.max_num_seqs" if self._max_num_seqs else None}
        if steps:
            if steps[-1].max_num_seqs:  # vLLM's own setting, from a plugin that sends it
                limit = {"max_num_seqs": steps[-1].max_num_seqs, "max_num_seqs_source": "vllm"}
            return EngineContext(
                "plugin_steps", running_max=max(s.running for s in steps), waiting_max=max(s.waiting for s in steps),
                waiting_deferred_max=max(s.deferred for s in steps),
                kv_usage_max=max(s.kv_cache_usage for s in steps), preemptions_in_window=preemptions,
                in_flight_max=in_flight, cold_starts=cold, note="; ".join(notes), **limit, **gpu)
        if store is None:
            return EngineContext("none", cold_starts=cold, **limit,
                                 note="no plugin steps and no rule engine store cover the request")
        try:
            running = _store_max(store, vllm_specs.NUM_REQUESTS_RUNNING.series, start_ms, end_ms)
            waiting = _store_max(store, vllm_specs.NUM_REQUESTS_WAITING.series, start_ms, end_ms)
            deferred = _store_max(store, vllm_specs.NUM_REQUESTS_WAITING_BY_REASON.series, start_ms, end_ms,
                                  reason="deferred")
            kv = _store_max(store, vllm_specs.KV_CACHE_USAGE_PERC.series, start_ms, end_ms)
        except (IndexError, ValueError, RuntimeError):
            running = waiting = deferred = kv = None
            notes.append("the store was busy")
        notes.append(f"scraped every {self._pad_s:g} s: the nearest samples, not the request's own moments")
        return EngineContext(
            "sidecar_store", running_max=None if running is None else int(running),
            waiting_max=None if waiting is None else int(waiting),
            waiting_deferred_max=None if deferred is None else int(deferred), kv_usage_max=kv,
            preemptions_in_window=preemptions,
            in_flight_max=in_flight, **limit, cold_starts=cold, note="; ".join(notes), **gpu)


def peers_p50_ms(store: SeriesStore | None, model: str, length_bucket: str, at_unix: float) -> dict[str, float]:
    """The p50 (ms) of each of :data:`PEER_HISTOGRAMS` over the hour before ``at_unix`` for the same model and
    length bucket, from the embedded engine's store; a part without data is left out."""
    if store is None:
        return {}
    evaluator = Evaluator(store)
    same = (("model_name", "=", model), ("length_bucket", "=", length_bucket))
    found = {}
    for part, spec in PEER_HISTOGRAMS.items():
        expr = f"histogram_quantile(0.5, sum by (le) (increase({selector(spec.bucket, *same)}[{PEER_WINDOW}])))"
        try:
            result = evaluator.query(expr, int(at_unix * 1000))
        except Exception:  # noqa: S112 - the store busy under the engine's thread: no comparison, and no failure
            continue
        values = [value for _labels, value in result] if isinstance(result, list) else []
        if values and values[0] == values[0]:  # NaN: no request in the window
            found[part] = values[0] * 1000.0
    return found


def explain_record(record: RequestRecord, sources: ContextSources, ring: RequestRing | None = None) -> dict[str, Any]:
    """The explanation of a request in ``ring``, with the requests in flight alongside it and the comparison with
    its bucket's p50 (four queries of the store); without ``ring``, neither: the causes use them not (a
    ``--slowest`` row)."""
    facts = facts_from_record(record)
    context = sources.context(facts.start_unix, facts.end_unix)
    if ring is None:
        return explain(facts, context, source="ring")
    p50 = peers_p50_ms(sources.store(), facts.model, facts.length_bucket, time.time())
    return explain(facts, dataclasses.replace(context, alongside=ring.alongside(record)), source="ring",
                   peers_p50_ms=p50)


WORST_WINDOW_S = 900.0
"""How far back a page's ``context`` looks for the slowest request (the runbooks' ``--since 15m``)."""


def with_slowest_request(ring: RequestRing) -> Callable[[Notification], Notification]:
    """An annotator for the embedded engine's alerts: a page's ``context`` annotation gains the slowest request of
    its model (any model when it names none) in the last :data:`WORST_WINDOW_S`, and the command that explains it."""

    def annotate(item: Notification) -> Notification:
        if CONTEXT_ANNOTATION not in item.annotations:
            return item
        found = ring.slowest(1, time.time() - WORST_WINDOW_S, item.labels.get("model_name"))
        if not found:
            return item
        worst = found[0]
        note = (f"; slowest request in {WORST_WINDOW_S / 60:.0f}m: {worst.trace_id} ({(worst.e2e_s or 0.0) * 1000:,.0f}"
                f" ms; inferwatch explain {worst.trace_id})")
        annotations = {**item.annotations, CONTEXT_ANNOTATION: item.annotations[CONTEXT_ANNOTATION] + note}
        return dataclasses.replace(item, annotations=annotations)

    return annotate


_NO_STORE = {"Cache-Control": "no-store"}


def _since_seconds(query: Mapping[str, str], now_unix: float) -> float:
    """How far back ``?slowest`` looks: ``since`` (a duration, 15m by default), or ``from`` (epoch milliseconds,
    what Grafana's ``${__from}`` gives a board's slowest-requests table: its time range's start)."""
    if "from" not in query:
        return parse_duration_ms(query.get("since", "15m"), "since") / 1000.0
    if "since" in query:
        raise ValueError("give since (a duration) or from (epoch milliseconds), not both")
    try:
        from_s = int(query["from"]) / 1000.0
    except ValueError:
        raise ValueError(f"from={query['from']!r} is not epoch milliseconds (a whole number)") from None
    return max(0.0, now_unix - from_s)


def add_explain_routes(admin: web.Application, ring: RequestRing, sources: ContextSources) -> None:
    """``GET /admin/requests/{trace_id}`` and ``GET /admin/requests?slowest=N&since=D[&model=M]`` (or
    ``from=EPOCH_MS`` instead of ``since``) on the admin sub-application (its access rule applies)."""

    async def one(request: web.Request) -> web.Response:
        trace_id = request.match_info["trace_id"].lower()
        record = ring.get(trace_id)
        if record is None:
            message = f"trace {trace_id} is not among the sidecar's last {len(ring)} requests (serve.explain_ring_size)"
            return error_response(request, 404, message)
        return web.json_response(explain_record(record, sources, ring), headers=_NO_STORE)

    async def slowest(request: web.Request) -> web.Response:
        query = request.query
        try:
            n = int(query.get("slowest", "10"))
        except ValueError:
            return error_response(request, 400, f"slowest={query.get('slowest')!r} is not a whole number")
        if not 1 <= n <= SLOWEST_MAX:
            return error_response(request, 400, f"slowest must be between 1 and {SLOWEST_MAX}")
        now = time.time()
        try:
            since_s = _since_seconds(query, now)
        except (RuleFileError, ValueError) as err:
            return error_response(request, 400, str(err))
        found = ring.slowest(n, now - since_s, query.get("model"))
        # a row needs the causes, not the comparison with the peers
        rows = [slowest_row(explain_record(record, sources)) for record in found]
        return web.json_response({"ring_size": len(ring), "since_s": since_s, "requests": rows},
                                 headers=_NO_STORE)

    admin.router.add_get("/requests", slowest)
    admin.router.add_get("/requests/{trace_id}", one)

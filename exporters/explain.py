"""Why one request took the time it took: its time split into parts that add up to its e2e, and ranked causes.

Pure computation, done only when someone asks (``inferwatch explain``, ``GET /admin/requests/...``):
the facts of one finished request (:class:`RequestFacts`, from the sidecar's ring of recent requests
or from an archived log record) and the state of the engine around it (:class:`EngineContext`) go
in; a JSON-ready explanation of schema :data:`SCHEMA` comes out (documented in the README, "Explain a
request"). The parts:

- ``sidecar``: the sidecar's own time before the request went out (admission, the body, its checks);
- ``connect``: opening a new connection to vLLM (0 on a reused one);
- ``vllm_front_end``: vLLM's API server before its engine's queue (tokenizing, the chat template) and
  the hops between vLLM and the sidecar: what is left of the e2e once the rest is counted;
- ``engine_queue``, ``prefill``, ``decode``: vLLM's own phases, from its stat-logger plugin;
- ``client_slow_read``: the time the stream waited on a client that did not take its bytes, counted
  after vLLM had finished (while vLLM still generates, it does not slow the request).

Without vLLM's numbers (no plugin) the time from the request going out to the first token is one
part, ``vllm_until_first_token``, marked ``split: false``; the rest of a stream is ``generation``.
"""

from __future__ import annotations

import dataclasses
import heapq
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exporters.records import Outcome, RequestRecord

SCHEMA = "inferwatch.explain/1"

SHARE_SIGNIFICANT = 0.2
"""A part is a cause when it holds at least this share of the e2e (and its floor below)."""
QUEUE_FLOOR_MS = 50.0
PREFILL_FLOOR_MS = 50.0
SIDECAR_FLOOR_MS = 50.0
CLIENT_FLOOR_MS = 50.0
CACHED_SHARE_HIT = 0.5
"""A prefill with at least this share of its prompt from the prefix cache is no ``long_prefill``."""
KV_FULL = 0.9
"""KV usage at or above this while a request queued: it waited for KV blocks (``queue_kv_capacity``)."""
DECODE_SHARE_CONTENDED = 0.5
BUSY_BATCH = 4
"""Running requests from which a decode holding most of the e2e counts as contended (half of max_num_seqs when
that is fewer, at least 2)."""
STALL_MIN_MS = 1000.0
STALL_RATIO = 10.0
"""A gap between tokens of at least STALL_MIN_MS and STALL_RATIO times the request's median gap is a stall."""
STALLS_KEPT = 16
"""How many of a stream's largest gaps its facts keep, with where each fell (``stalls``): the preemptions of one
request each show as one of them."""

GPU_THROTTLING = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
"""The clock-event reasons that slow a GPU below what its work asks (not idle, application clocks, sync boost or
display clocks): any of them active while a request ran is ``gpu_throttled``."""

CAUSES = (
    "upstream_error", "cold_start", "upstream_restart", "preempted", "queue_full_batch", "queue_kv_capacity",
    "long_prefill", "decode_contention", "stall", "gpu_throttled", "client_slow_read", "sidecar", "none",
)
"""The documented vocabulary (README, "Explain a request")."""
_CATEGORICAL = ("upstream_error", "cold_start", "upstream_restart")
"""Causes ranked before the others, whatever time they account for."""


@dataclass(frozen=True, slots=True)
class EnginePhases:
    """The engine's own account of one request (milliseconds; tokens)."""

    queue_ms: float
    prefill_ms: float
    decode_ms: float
    preemptions: int
    cached_tokens: int
    load_ms: float = 0.0
    """Ollama's model load for the request (its load_duration; 0 elsewhere)."""
    source: str = "vllm"
    """Whose numbers: ``vllm`` (the stat-logger plugin), or ``ollama`` / ``llamacpp`` (their answers, which
    have no queue time)."""


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What is known of one finished request, in milliseconds; None where it was not measured."""

    trace_id: str
    model: str
    route: str
    stream: bool
    outcome: str
    http_status: int
    start_unix: float
    e2e_ms: float
    length_bucket: str = "unknown"
    ttft_ms: float | None = None
    sent_ms: float | None = None
    connect_ms: float = 0.0
    client_wait_ms: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    largest_gap_ms: float | None = None
    median_gap_ms: float | None = None
    mean_gap_ms: float | None = None
    error_type: str | None = None
    error_message: str | None = None
    engine: EnginePhases | None = None
    refused: bool = False
    """The sidecar answered it itself (its admission, limits or checks): it never reached vLLM."""
    content_chunks: int | None = None
    """The content chunks of a stream the sidecar read (one token each, as vLLM streams them); None otherwise."""
    stalls: tuple[tuple[float, int], ...] = ()
    """A stream's largest gaps between content chunks, largest first (at most :data:`STALLS_KEPT`): each its ms and
    the content chunks that had arrived before it."""

    @property
    def end_unix(self) -> float:
        """When the request ended (Unix seconds)."""
        return self.start_unix + self.e2e_ms / 1000.0


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _stalls(gaps: Sequence[float]) -> tuple[tuple[float, int], ...]:
    """The :data:`STALLS_KEPT` largest of ``gaps`` (seconds), largest first (the earlier of equal ones first), as
    ``(ms, content chunks before it)``: gap ``i`` follows chunk ``i``, so ``i + 1`` chunks came before it."""
    largest = heapq.nsmallest(STALLS_KEPT, range(len(gaps)), key=lambda i: (-gaps[i], i))
    return tuple((gaps[i] * 1000.0, i + 1) for i in largest)


def facts_from_record(record: RequestRecord) -> RequestFacts:
    """The facts of a request the proxy finished (the ring's entries)."""
    gaps = record.inter_token_s
    chunks = (len(gaps) + 1 if gaps else int(record.ttft_s is not None)) if record.stream else None
    return RequestFacts(
        trace_id=record.trace_id, model=record.model, route=record.route, stream=record.stream,
        outcome=record.outcome.value, http_status=record.http_status, start_unix=record.start_unix,
        e2e_ms=(record.e2e_s or 0.0) * 1000.0, length_bucket=record.length_bucket, ttft_ms=_ms(record.ttft_s),
        sent_ms=_ms(record.upstream_sent_s),
        connect_ms=record.connect_s * 1000.0, client_wait_ms=record.client_wait_s * 1000.0,
        prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens,
        largest_gap_ms=max(gaps) * 1000.0 if gaps else None,
        median_gap_ms=statistics.median(gaps) * 1000.0 if gaps else None,
        mean_gap_ms=_ms(record.mean_itl_s), error_type=record.error_type, error_message=record.error_message,
        engine=_engine_phases(record), refused=record.refused, content_chunks=chunks, stalls=_stalls(gaps),
    )


def _engine_phases(record: RequestRecord) -> EnginePhases | None:
    """vLLM's plugin numbers, else the ones an Ollama or llama.cpp answer carried, else None."""
    engine, answer = record.engine, record.answer_phases
    if engine is not None:
        return EnginePhases(engine.queued_s * 1000.0, engine.prefill_s * 1000.0, engine.decode_s * 1000.0,
                            engine.preemptions, engine.cached_tokens)
    if answer is not None:
        return EnginePhases(0.0, answer.prefill_s * 1000.0, answer.decode_s * 1000.0, 0, answer.cached_tokens or 0,
                            (answer.load_s or 0.0) * 1000.0, answer.engine)
    return None


def facts_from_log_event(event: Mapping[str, Any], start_unix: float) -> RequestFacts:
    """The facts of an archived request log record (log schema 1); ``start_unix`` is its end (``ts``) less its e2e.

    Records written before ``sent_ms``, ``connect_ms``, ``client_wait_ms`` and ``largest_gap_ms`` were logged
    have no sidecar/connect split and no largest gap. A record has no median gap: its mean stands in (the stall
    itself raises it, so a stall is named less readily than from the ring)."""
    engine = None
    if event.get("engine_queue_ms") is not None:
        engine = EnginePhases(float(event["engine_queue_ms"]), float(event.get("engine_prefill_ms") or 0.0),
                              float(event.get("engine_decode_ms") or 0.0), int(event.get("engine_preemptions") or 0),
                              int(event.get("engine_cached_tokens") or 0))
    elif event.get("engine_source") is not None and event.get("engine_prefill_ms") is not None:
        engine = EnginePhases(0.0, float(event["engine_prefill_ms"]), float(event.get("engine_decode_ms") or 0.0), 0,
                              int(event.get("engine_cached_tokens") or 0), float(event.get("engine_load_ms") or 0.0),
                              str(event["engine_source"]))
    return RequestFacts(
        trace_id=str(event.get("trace_id", "")), model=str(event.get("model", "unknown")),
        route=str(event.get("route", "")), stream=bool(event.get("stream")), outcome=str(event.get("outcome", "")),
        http_status=int(event.get("http_status") or 0), start_unix=start_unix,
        length_bucket=str(event.get("length_bucket", "unknown")),
        e2e_ms=float(event.get("e2e_ms") or 0.0), ttft_ms=event.get("ttft_ms"),
        prompt_tokens=event.get("prompt_tokens"), completion_tokens=event.get("completion_tokens"),
        mean_gap_ms=event.get("itl_ms"), error_type=event.get("error_type"),
        error_message=event.get("error_message"), engine=engine, sent_ms=event.get("sent_ms"),
        connect_ms=float(event.get("connect_ms") or 0.0), client_wait_ms=float(event.get("client_wait_ms") or 0.0),
        largest_gap_ms=event.get("largest_gap_ms"), median_gap_ms=event.get("itl_ms"),
        refused=bool(event.get("refused")),
    )


def facts_to_json(facts: RequestFacts) -> dict[str, Any]:
    """The facts as JSON (the explanation's ``facts``), read back by :func:`facts_from_json`."""
    return dataclasses.asdict(facts)


def facts_from_json(data: Mapping[str, Any]) -> RequestFacts:
    """The facts an explanation was computed from (its ``facts``), to explain it again in another context.

    Raises:
        ValueError: ``data`` is not such an object.
    """
    try:
        engine = data.get("engine")
        stalls = tuple((float(ms), int(before)) for ms, before in data.get("stalls") or ())
        return RequestFacts(**{**data, "engine": None if engine is None else EnginePhases(**engine),
                               "stalls": stalls})
    except (TypeError, AttributeError, ValueError) as err:
        raise ValueError(f"not the facts of an explanation: {err}") from err


@dataclass(frozen=True, slots=True)
class ColdStartSpan:
    """A cold start of the upstream (Unix seconds): from readiness lost (or not ready when the sidecar started)
    to the first token after it came back (None: going on)."""

    cause: str
    began_unix: float
    ended_unix: float | None
    lost_after_unix: float | None = None
    """The probe before ``began_unix`` found vLLM ready no earlier than this (one readiness interval before): it
    went down at some moment in ``(lost_after_unix, began_unix]``."""


@dataclass(frozen=True, slots=True)
class Alongside:
    """The sidecar's other requests in flight at some moment of this one (from its ring): how many, how long."""

    requests: int
    prompt_tokens: int
    prompt_tokens_max: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class EngineContext:
    """The engine around a request, from the sidecar's own history; None where that history has nothing."""

    source: str
    """Where the engine's numbers came from: ``plugin_steps``, ``sidecar_store`` or ``none``."""
    running_max: int | None = None
    waiting_max: int | None = None
    waiting_deferred_max: int | None = None
    """Of the waiting, the most held back by a transient constraint (LoRA budget, a KV transfer): vLLM's
    ``deferred`` reason; the rest waited for room in the batch or the KV cache (``capacity``)."""
    kv_usage_max: float | None = None
    preemptions_in_window: float | None = None
    """vLLM's ``vllm:num_preemptions_total`` growth around the request (every request's)."""
    max_num_seqs: int | None = None
    max_num_seqs_source: str | None = None
    """``vllm`` (its own setting, sent by the stat-logger plugin) or ``rules.max_num_seqs`` (the sidecar's)."""
    in_flight_max: float | None = None
    cold_starts: tuple[ColdStartSpan, ...] = ()
    """The upstream's cold starts the sidecar remembers (its last few, and one going on)."""
    gpu_utilization_max: float | None = None
    """The busiest GPU's utilisation (0-1) while the request ran, where NVML is read; the same below."""
    gpu_memory_used_max_bytes: float | None = None
    gpu_temperature_max: float | None = None
    gpu_clock_events: tuple[str, ...] = ()
    """The clock-event reasons (``inferwatch_gpu_clock_event_active``'s ``reason``) active on any GPU meanwhile."""
    alongside: Alongside | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready (the explanation's ``context``)."""
        return {
            "source": self.source, "running_max": self.running_max, "waiting_max": self.waiting_max,
            "waiting_deferred_max": self.waiting_deferred_max,
            "kv_usage_max": _round(self.kv_usage_max, 3), "preemptions_in_window": self.preemptions_in_window,
            "max_num_seqs": self.max_num_seqs, "max_num_seqs_source": self.max_num_seqs_source,
            "in_flight_max": self.in_flight_max,
            "gpu_utilization_max": _round(self.gpu_utilization_max, 3),
            "gpu_memory_used_max_bytes": self.gpu_memory_used_max_bytes,
            "gpu_temperature_max": self.gpu_temperature_max, "gpu_clock_events": list(self.gpu_clock_events),
            "alongside": None if self.alongside is None else dataclasses.asdict(self.alongside),
            "cold_starts": [{"cause": c.cause, "began_unix": c.began_unix, "ended_unix": c.ended_unix,
                             "lost_after_unix": c.lost_after_unix} for c in self.cold_starts],
            "note": self.note,
        }


def cold_starts_from_json(context: Mapping[str, Any]) -> tuple[ColdStartSpan, ...]:
    """The cold starts an explanation's ``context`` names (to carry them over to another context)."""
    return tuple(ColdStartSpan(str(c["cause"]), float(c["began_unix"]),
                               None if c.get("ended_unix") is None else float(c["ended_unix"]),
                               None if c.get("lost_after_unix") is None else float(c["lost_after_unix"]))
                 for c in context.get("cold_starts") or ())


NO_CONTEXT = EngineContext("none", note="no sidecar history for this request")


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _phases(facts: RequestFacts) -> list[dict[str, Any]]:
    """The parts of the e2e, in the order they happen; their ``ms`` add up to ``facts.e2e_ms``."""
    e2e = facts.e2e_ms
    parts: list[tuple[str, float, bool]] = []  # name, ms, split
    sent = facts.sent_ms
    if facts.refused:  # the sidecar's own answer: all of it is the sidecar's time
        parts.append(("sidecar", e2e, True))
    elif sent is None and facts.ttft_ms is None:  # never reached the upstream's answer, or an archived failure
        parts.append(("sidecar_and_upstream", e2e, False))
    else:
        after = 0.0
        if sent is not None:
            parts += [("sidecar", max(0.0, sent - facts.connect_ms), True), ("connect", facts.connect_ms, True)]
            after = sent
        engine = facts.engine
        if engine is not None:
            engine_ms = engine.queue_ms + engine.load_ms + engine.prefill_ms + engine.decode_ms
            tail = max(0.0, e2e - after - engine_ms)
            client = min(facts.client_wait_ms, tail)
            upstream = "vllm" if engine.source == "vllm" else "upstream"
            front = f"{upstream}_front_end" if sent is not None else f"sidecar_and_{upstream}_front_end"
            parts.append((front, tail - client, sent is not None))
            if engine.source == "vllm":  # only vLLM's plugin measures the queue
                parts.append(("engine_queue", engine.queue_ms, True))
            if engine.source == "ollama":
                parts.append(("model_load", engine.load_ms, True))
            parts += [("prefill", engine.prefill_ms, True), ("decode", engine.decode_ms, True),
                      ("client_slow_read", client, True)]
        elif facts.ttft_ms is not None:
            first = max(0.0, facts.ttft_ms - after)
            rest = max(0.0, e2e - after - first)
            client = min(facts.client_wait_ms, rest)
            name = "vllm_until_first_token" if sent is not None else "until_first_token"
            parts += [(name, first, False), ("generation", rest - client, True), ("client_slow_read", client, True)]
        else:  # sent, then no answer (a failure after the request went out)
            parts.append(("upstream", max(0.0, e2e - after), False))
    total = sum(ms for _, ms, _ in parts) or 1.0
    return [{"name": name, "ms": round(ms, 1), "share": round(ms / total, 3), "split": split}
            for name, ms, split in parts]


def _cause(name: str, ms: float, text: str, **evidence: Any) -> dict[str, Any]:
    return {"cause": name, "ms": round(ms, 1), "text": text, "evidence": evidence}


def _recomputed(facts: RequestFacts, preemptions: int) -> dict[str, Any]:
    """At most how many tokens vLLM recomputed for a request it preempted ``preemptions`` times (evidence of
    ``preempted``; README, "Explain a request").

    vLLM's engine V1 preempts by recomputation: it frees the request's KV blocks and, when it schedules the request
    again, prefills its prompt and every token it had generated so far, less what its prefix cache still holds
    (which no number per request tells). For a stream whose preemptions are its ``preemptions`` largest gaps, each
    recomputed at most the prompt and the tokens before that gap: the completion tokens less one per content chunk
    after it (exactly the chunks before it when each chunk holds one token, as vLLM streams them; more when vLLM
    merged tokens into a chunk). Without that timeline (a non-streamed request, an archived record, more
    preemptions than the gaps kept), each recomputed at most the prompt and all but the last output token."""
    prompt, completion, chunks, stalls = facts.prompt_tokens, facts.completion_tokens, facts.content_chunks, \
        facts.stalls[:preemptions]
    if prompt is None or completion is None:
        return {"recomputed_tokens_at_most": None, "recomputed_tokens_basis": None}
    if facts.stream and chunks and len(stalls) == preemptions:
        before = [max(0, completion - (chunks - chunks_before)) for _ms, chunks_before in stalls]
        return {"recomputed_tokens_at_most": preemptions * prompt + sum(before), "recomputed_tokens_basis": "stalls",
                "stalls_ms": [round(ms, 1) for ms, _before in stalls], "tokens_before_stalls": before}
    return {"recomputed_tokens_at_most": preemptions * (prompt + max(0, completion - 1)),
            "recomputed_tokens_basis": "output_length"}


def _significant(ms: float, e2e: float, floor: float) -> bool:
    return ms >= floor and e2e > 0 and ms / e2e >= SHARE_SIGNIFICANT


def _causes(facts: RequestFacts, phases: dict[str, float], context: EngineContext) -> list[dict[str, Any]]:
    e2e, engine, found = facts.e2e_ms, facts.engine, []
    if facts.refused:
        found.append(_cause("sidecar", e2e, f"the sidecar refused it itself: {facts.error_type} (HTTP "
                            f"{facts.http_status}): {facts.error_message or ''}".rstrip(": "), refused=True,
                            http_status=facts.http_status, error_type=facts.error_type,
                            error_message=(facts.error_message or "")[:200]))
    elif facts.outcome in (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT, Outcome.OVERLOADED):
        found.append(_cause("upstream_error", e2e, f"it failed: {facts.error_type or facts.outcome} "
                            f"(HTTP {facts.http_status})", http_status=facts.http_status,
                            error_type=facts.error_type, error_message=(facts.error_message or "")[:200]))
    failed = facts.outcome in (Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT)
    for cold in context.cold_starts:
        evidence = {"cold_start_cause": cold.cause, "began_unix": cold.began_unix, "ended_unix": cold.ended_unix}
        if cold.began_unix <= facts.start_unix and (cold.ended_unix is None or facts.start_unix <= cold.ended_unix):
            waited = ((cold.ended_unix or facts.end_unix) - facts.start_unix) * 1000.0
            found.append(_cause("cold_start", min(e2e, waited), "it came while vLLM was starting up "
                                f"({cold.cause.replace('_', ' ')})", **evidence))
        elif facts.start_unix < cold.began_unix <= facts.end_unix:
            found.append(_cause("upstream_restart", (facts.end_unix - cold.began_unix) * 1000.0,
                                "vLLM went down while it ran (readiness lost)", **evidence))
        elif failed and cold.lost_after_unix is not None and facts.start_unix < cold.began_unix and \
                cold.lost_after_unix <= facts.end_unix < cold.began_unix:
            # it failed just before a probe found vLLM gone, in the interval in which vLLM went down
            found.append(_cause("upstream_restart", e2e, "vLLM went down while it ran (readiness lost right after "
                                "it failed)", **evidence, lost_after_unix=cold.lost_after_unix))
    if engine is not None and _significant(engine.load_ms, e2e, QUEUE_FLOOR_MS):
        found.append(_cause("cold_start", engine.load_ms, f"{engine.source} loaded the model for it first "
                            f"({engine.load_ms:,.0f} ms of load_duration)", load_ms=round(engine.load_ms, 1)))
    if engine is not None and engine.preemptions > 0:
        recomputed = _recomputed(facts, engine.preemptions)
        at_most = recomputed["recomputed_tokens_at_most"]
        found.append(_cause("preempted", engine.decode_ms + engine.prefill_ms,
                            f"vLLM preempted it {engine.preemptions} time(s) (its KV blocks freed, then recomputed"
                            + ("" if at_most is None else f": at most {at_most:,} tokens") + ")",
                            preemptions=engine.preemptions, **recomputed,
                            preemptions_in_window=context.preemptions_in_window,
                            kv_usage_max=_round(context.kv_usage_max, 3)))
    queue_ms = engine.queue_ms if engine is not None else (
        phases.get("vllm_until_first_token", 0.0) if (context.waiting_max or 0) > 0 else 0.0)
    if _significant(queue_ms, e2e, QUEUE_FLOOR_MS):
        evidence = {"queue_ms": round(queue_ms, 1), "running_max": context.running_max,
                    "waiting_max": context.waiting_max, "waiting_deferred_max": context.waiting_deferred_max,
                    "kv_usage_max": _round(context.kv_usage_max, 3),
                    "max_num_seqs": context.max_num_seqs, "queue_split": engine is not None}
        if context.kv_usage_max is not None and context.kv_usage_max >= KV_FULL:
            found.append(_cause("queue_kv_capacity", queue_ms, f"it queued {queue_ms:,.0f} ms waiting for KV blocks "
                                f"(KV usage up to {context.kv_usage_max:.2f})", **evidence))
        else:
            batch = f"{context.running_max} running" if context.running_max is not None else "a running batch"
            limit = f" of max_num_seqs {context.max_num_seqs}" if context.max_num_seqs else ""
            found.append(_cause("queue_full_batch", queue_ms,
                                f"it queued {queue_ms:,.0f} ms behind a full batch ({batch}{limit})", **evidence))
    if engine is not None and _significant(engine.prefill_ms, e2e, PREFILL_FLOOR_MS):
        prompt = facts.prompt_tokens or 0
        if engine.cached_tokens < CACHED_SHARE_HIT * prompt or not prompt:
            found.append(_cause("long_prefill", engine.prefill_ms, f"its prefill of {prompt} prompt tokens took "
                                f"{engine.prefill_ms:,.0f} ms ({engine.cached_tokens} from the prefix cache)",
                                prefill_ms=round(engine.prefill_ms, 1), prompt_tokens=prompt,
                                cached_tokens=engine.cached_tokens))
    decode_ms = phases.get("decode", phases.get("generation", 0.0))
    busy = min(BUSY_BATCH, max(2, context.max_num_seqs // 2)) if context.max_num_seqs else BUSY_BATCH
    if e2e > 0 and decode_ms / e2e >= DECODE_SHARE_CONTENDED and (context.running_max or 0) >= busy:
        found.append(_cause("decode_contention", decode_ms, f"its decode shared the engine with up to "
                            f"{context.running_max} running requests (mean gap {facts.mean_gap_ms or 0:.1f} ms)",
                            decode_ms=round(decode_ms, 1), mean_gap_ms=_round(facts.mean_gap_ms),
                            running_max=context.running_max))
    largest, median = facts.largest_gap_ms, facts.median_gap_ms
    # a gap is measured where the sidecar reads vLLM, which it stops doing while a client does not take its
    # bytes: at most what is left of the largest gap once all that waiting is taken out is vLLM's stall
    stalled = None if largest is None else largest - facts.client_wait_ms
    if stalled is not None and median is not None and stalled >= STALL_MIN_MS and stalled >= STALL_RATIO * median:
        found.append(_cause("stall", stalled, f"its stream stalled {stalled:,.0f} ms between two tokens "
                            f"({stalled / max(median, 0.001):.0f}x its median gap)",
                            largest_gap_ms=_round(largest), median_gap_ms=round(median, 1),
                            client_wait_ms=round(facts.client_wait_ms, 1)))
    throttled = [reason for reason in context.gpu_clock_events if reason in GPU_THROTTLING]
    if throttled:
        gpu_ms = engine.prefill_ms + engine.decode_ms if engine is not None else phases.get(
            "generation", 0.0) + phases.get("vllm_until_first_token", 0.0)
        temperature = f", up to {context.gpu_temperature_max:g} °C" if context.gpu_temperature_max is not None else ""
        found.append(_cause("gpu_throttled", gpu_ms, f"the GPU slowed its clocks while it ran ({', '.join(throttled)}"
                            f"{temperature})", reasons=throttled, temperature_max=context.gpu_temperature_max,
                            utilization_max=_round(context.gpu_utilization_max, 3)))
    client = phases.get("client_slow_read", 0.0)
    if _significant(client, e2e, CLIENT_FLOOR_MS):
        found.append(_cause("client_slow_read", client, f"the client read slowly: the stream waited {client:,.0f} ms "
                            "for it", client_wait_ms=round(facts.client_wait_ms, 1)))
    sidecar = phases.get("sidecar", 0.0)
    if not facts.refused and _significant(sidecar, e2e, SIDECAR_FLOOR_MS):
        found.append(_cause("sidecar", sidecar, f"the sidecar took {sidecar:,.0f} ms before sending it",
                            sidecar_ms=round(sidecar, 1)))
    found.sort(key=lambda cause: (cause["cause"] not in _CATEGORICAL, -cause["ms"]))
    if not found:
        found.append(_cause("none", 0.0, "nothing stands out: no part holds an unusual share, no preemption, "
                            "no error", e2e_ms=round(e2e, 1)))
    return found


PEER_PARTS = ("e2e", "engine_queue", "prefill", "decode")
"""What is compared with the same model's and length bucket's p50 (``peers``)."""


def _peers(by_name: Mapping[str, float], e2e_ms: float, p50_ms: Mapping[str, float]) -> dict[str, Any]:
    mine = {**by_name, "e2e": e2e_ms}
    return {part: {"ms": round(mine[part], 1), "p50_ms": round(p50_ms[part], 1),
                   "ratio": round(mine[part] / p50_ms[part], 2) if p50_ms[part] > 0 else None}
            for part in PEER_PARTS if part in p50_ms and part in mine}


def explain(facts: RequestFacts, context: EngineContext = NO_CONTEXT, *, source: str = "ring",
            peers_p50_ms: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The explanation of one request (schema :data:`SCHEMA`); ``source`` says where its facts came from,
    ``peers_p50_ms`` the p50 of the same model's and length bucket's requests for each of :data:`PEER_PARTS`."""
    phases = _phases(facts)
    by_name = {phase["name"]: phase["ms"] for phase in phases}
    causes = _causes(facts, by_name, context)
    engine = facts.engine
    return {
        "schema": SCHEMA, "source": source, "trace_id": facts.trace_id, "model": facts.model, "route": facts.route,
        "stream": facts.stream, "outcome": facts.outcome, "http_status": facts.http_status,
        "length_bucket": facts.length_bucket,
        "start_unix": round(facts.start_unix, 3), "e2e_ms": round(facts.e2e_ms, 1), "ttft_ms": _round(facts.ttft_ms),
        "prompt_tokens": facts.prompt_tokens, "completion_tokens": facts.completion_tokens,
        "cached_tokens": None if engine is None else engine.cached_tokens,
        "preemptions": None if engine is None else engine.preemptions,
        "engine_numbers": engine is not None,
        "largest_gap_ms": _round(facts.largest_gap_ms), "mean_gap_ms": _round(facts.mean_gap_ms),
        "phases": phases, "context": context.to_json(), "peers": _peers(by_name, facts.e2e_ms, peers_p50_ms or {}),
        "causes": causes, "reason": causes[0]["text"], "facts": facts_to_json(facts),
    }


SLOWEST_MAX = 1000
"""The most requests one ``--slowest`` list holds (``inferwatch explain`` and ``/admin/requests``)."""
ROW_FIELDS = ("trace_id", "model", "start_unix", "e2e_ms", "ttft_ms", "outcome", "preemptions", "reason")
ROW_CONTEXT_FIELDS = ("source", "running_max", "waiting_max", "kv_usage_max", "preemptions_in_window")


def slowest_row(explanation: Mapping[str, Any]) -> dict[str, Any]:
    """One request of a ``--slowest`` list: a few fields of its explanation, its first cause and the engine's
    state around it (running, waiting, KV usage, vLLM's preemptions meanwhile, and where that came from)."""
    context = explanation["context"]
    return {key: explanation[key] for key in ROW_FIELDS} | {
        "cause": explanation["causes"][0]["cause"], "context": {key: context[key] for key in ROW_CONTEXT_FIELDS}}

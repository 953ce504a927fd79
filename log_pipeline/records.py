"""`RequestRecord` → the versioned log event of one request (log schema version 1).

The event is lean on purpose: one random id pair (``trace_id``, ``span_id``), times in
milliseconds rounded to 0.1 ms, and no prompt, completion or header text. With
``capture_prompt_hash`` it carries the prompt's SHA-256 and length instead of the text.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from exporters.records import AnswerPhases, Outcome, RequestRecord

SCHEMA_VERSION = 1
EVENT_NAME = "request"

FIELDS: tuple[str, ...] = (
    "ts", "level", "event", "trace_id", "span_id", "model", "route", "outcome", "http_status",
    "prompt_tokens", "completion_tokens", "ttft_ms", "itl_ms", "e2e_ms", "queue_ms", "finish_reason",
    "length_bucket", "upstream", "lane", "role", "stream", "slow", "schema_version",
)
"""Keys every request event has, in order; failures add ``error_type`` and ``error_message``, and a
request joined to vLLM's stat-logger plugin ``engine_queue_ms``, ``engine_prefill_ms``,
``engine_decode_ms``, ``engine_preemptions`` and ``engine_cached_tokens`` (an answer of Ollama or llama.cpp
that carried its own numbers: ``engine_source``, ``engine_prefill_ms``, ``engine_decode_ms`` and, where given,
``engine_load_ms``, ``engine_total_ms``, ``engine_cached_tokens``); the release-day keys ``client``,
``requested_model``, ``wrong_model``, ``tokenizer_fingerprint`` and ``text_class`` appear when known; the
upstream choice's ``prompt_tokens_estimate``, ``lane_fallback``, ``priority_class`` and ``shadow_*`` likewise;
``inferwatch explain``'s split where measured: ``sent_ms`` and ``connect_ms`` (a request that went out),
``client_wait_ms`` (a stream that waited on its client), ``largest_gap_ms`` (a stream), ``refused`` (the
sidecar's own answer)."""

_LEVELS = {
    Outcome.OK: "info",
    Outcome.CLIENT_ERROR: "warning",
    Outcome.CANCELLED: "warning",
}
_MAX_ERROR_CHARS = 512


@functools.lru_cache(maxsize=4)
def _second_text(seconds: int) -> str:
    """A whole second in ISO 8601 UTC: requests ending in the same second share it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def format_ts(unix_s: float) -> str:
    """ISO 8601 UTC with milliseconds, e.g. ``2026-08-07T12:34:56.789Z``."""
    ms = round(unix_s * 1000)
    seconds, millis = divmod(ms, 1000)
    return f"{_second_text(seconds)}.{millis:03d}Z"


def milliseconds(seconds: float | None) -> float | None:
    """Seconds as milliseconds rounded to 0.1 ms, as the event carries them."""
    return None if seconds is None else round(seconds * 1000.0, 1)


def level_of(outcome: Outcome) -> str:
    """``info`` for ok, ``warning`` for client errors and cancellations, ``error`` otherwise."""
    return _LEVELS.get(outcome, "error")


def is_slow(record: RequestRecord, sla_s: float | None) -> bool:
    """The event's ``slow``: ``sla_s`` is set and the request took longer."""
    return sla_s is not None and record.e2e_s is not None and record.e2e_s > sla_s


def _add_cutover_fields(event: dict[str, Any], record: RequestRecord) -> None:
    """The release-day keys, each only when known: who sent the request and what it asked for, why it was a
    wrong-model request, a text class other than plain, the upstream's tokenizer fingerprint."""
    for key in ("client", "requested_model", "wrong_model", "tokenizer_fingerprint"):
        value = getattr(record, key)
        if value is not None:
            event[key] = value
    if record.text_class != "plain":
        event["text_class"] = record.text_class


_SHADOW_FIELDS = ("shadow_status", "shadow_outcome", "shadow_prompt_tokens", "shadow_completion_tokens",
                  "shadow_distance")


def _add_upstream_choice_fields(event: dict[str, Any], record: RequestRecord) -> None:
    """What serving/upstream_choice.py decided, each only when it applies: the prompt estimate that chose the
    lane, a lane fallback, the priority class, the shadow's answer against the client's."""
    if record.prompt_tokens_estimate is not None:
        event["prompt_tokens_estimate"] = record.prompt_tokens_estimate
    if record.lane_fallback is not None:
        event["lane_fallback"] = record.lane_fallback
    if record.priority_class is not None:
        event["priority_class"] = record.priority_class
    if record.shadow_result is None:
        return
    event["shadow_result"] = record.shadow_result
    for key in _SHADOW_FIELDS:
        value = getattr(record, key)
        if value is not None:
            event[key] = value
    event["shadow_ttft_ms"] = milliseconds(record.shadow_ttft_s)
    event["shadow_e2e_ms"] = milliseconds(record.shadow_e2e_s)


def _add_answer_phases(event: dict[str, Any], phases: AnswerPhases) -> None:
    """``engine_source`` and the engine's own phases from its answer; load and total (Ollama) and cached tokens
    (llama.cpp) only where the engine gives them."""
    event["engine_source"] = phases.engine
    event["engine_prefill_ms"] = milliseconds(phases.prefill_s)
    event["engine_decode_ms"] = milliseconds(phases.decode_s)
    if phases.load_s is not None:
        event["engine_load_ms"] = milliseconds(phases.load_s)
    if phases.total_s is not None:
        event["engine_total_ms"] = milliseconds(phases.total_s)
    if phases.cached_tokens is not None:
        event["engine_cached_tokens"] = phases.cached_tokens


def _add_explain_split(event: dict[str, Any], record: RequestRecord) -> None:
    """What ``inferwatch explain`` splits an archived request's time with: when it went out to the upstream
    (``sent_ms``, the sidecar's own time and the connection before it), ``connect_ms``, the stream's wait on a
    slow client (``client_wait_ms``) and its largest gap between tokens; ``refused`` when the sidecar answered it
    itself."""
    if record.upstream_sent_s is not None:
        event["sent_ms"] = milliseconds(record.upstream_sent_s)
        event["connect_ms"] = milliseconds(record.connect_s)
    if record.client_wait_s:
        event["client_wait_ms"] = milliseconds(record.client_wait_s)
    if record.inter_token_s:
        event["largest_gap_ms"] = milliseconds(max(record.inter_token_s))
    if record.refused:
        event["refused"] = True


def event_from_record(
    record: RequestRecord, *, sla_s: float | None, capture_prompt_hash: bool = False
) -> dict[str, Any]:
    """The log event of a finished request.

    ``ts`` is the end of the request (start + e2e); ``queue_ms`` is the wait until the upstream
    answered with a status line (``accept_s``); ``itl_ms`` the mean gap between chunks. ``slow`` is
    true when ``sla_s`` is set and the request took longer. ``error_type``/``error_message``
    appear on failures only (the message is cut to 512 characters). The prompt's hash and length
    appear only with ``capture_prompt_hash``.
    """
    outcome = record.outcome if type(record.outcome) is Outcome else Outcome(record.outcome)
    e2e_s = record.e2e_s
    end = record.start_unix + (e2e_s or 0.0) if record.start_unix else time.time()
    event: dict[str, Any] = {
        "ts": format_ts(end),
        "level": level_of(outcome),
        "event": EVENT_NAME,
        "trace_id": record.trace_id,
        "span_id": record.span_id,
        "model": record.model,
        "route": record.route,
        "outcome": outcome.value,
        "http_status": record.http_status,
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "ttft_ms": milliseconds(record.ttft_s),
        "itl_ms": milliseconds(record.mean_itl_s),
        "e2e_ms": milliseconds(e2e_s),
        "queue_ms": milliseconds(record.accept_s),
        "finish_reason": record.finish_reason,
        "length_bucket": record.length_bucket,
        "upstream": record.upstream,
        "lane": record.lane,
        "role": record.role,
        "stream": record.stream,
        "slow": is_slow(record, sla_s),
        "schema_version": SCHEMA_VERSION,
    }
    _add_explain_split(event, record)
    if outcome is not Outcome.OK or record.error_type or record.error_message:
        event["error_type"] = record.error_type
        message = record.error_message
        event["error_message"] = message[:_MAX_ERROR_CHARS] if message else message
    engine = record.engine
    if engine is not None:  # vLLM's own numbers, joined from the stat-logger plugin
        event["engine_queue_ms"] = milliseconds(engine.queued_s)
        event["engine_prefill_ms"] = milliseconds(engine.prefill_s)
        event["engine_decode_ms"] = milliseconds(engine.decode_s)
        event["engine_preemptions"] = engine.preemptions
        event["engine_cached_tokens"] = engine.cached_tokens
    elif record.answer_phases is not None:  # Ollama's or llama.cpp's own numbers, from its answer
        _add_answer_phases(event, record.answer_phases)
    _add_cutover_fields(event, record)
    _add_upstream_choice_fields(event, record)
    if capture_prompt_hash and record.prompt_hash is not None:
        event["prompt_sha256"] = record.prompt_hash
        event["prompt_chars"] = record.prompt_chars
    return event

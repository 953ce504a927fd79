"""Incremental reader of an OpenAI-style SSE stream: forwards events as they complete and measures them.

Pure: fed raw network chunks with their arrival time, it returns the bytes to forward now.
It finds the first content chunk, the gaps between content chunks, ``usage`` and
``finish_reason``, and removes what the sidecar added to the upstream request: the final
usage-only chunk (``stream_options.include_usage``) and the per-chunk ``usage`` field
(``continuous_usage_stats``) when the client did not ask for them.

It also judges the stream: a ``data:`` line that is not JSON, or an event larger than
``max_event_bytes``, sets :attr:`StreamStats.problem`; from then on nothing more is forwarded
(the proxy ends the stream with its own error event). Error events get the request's trace id.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import orjson

from exporters.engine_phases import from_llamacpp
from exporters.records import AnswerPhases
from serving.errors import upstream_error_type

_SEPARATORS = (b"\n\n", b"\r\n\r\n")
_RUNNING = b'"finish_reason":null'
_RUNNING_SPACED = b'"finish_reason": null'
_IN_STRING_ESCAPES = re.compile(rb'["\\\r\n]')
"""What a text between a template's two parts must not hold: it could end the JSON string (or the line)."""
_TEXT_KEYS = (b'"content":', b'"text":')
_TEMPLATE_TRIES = 4


@dataclass(slots=True)
class StreamStats:
    """What was seen in a stream so far."""

    content_ns: list[int] = field(default_factory=list)
    """When each content chunk arrived (``perf_counter_ns``; chunks that came in one read share a time). One
    append per chunk is all the hot path does: the gaps are worked out once, when the stream is done."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    response_model: str | None = None
    error: str | None = None
    error_type: str | None = None
    """The ``error.type`` of the upstream's error event (:func:`serving.errors.upstream_error_type`), with ``error``."""
    undecodable_events: int = 0
    done: bool = False
    phases: AnswerPhases | None = None
    """The engine's own numbers the stream carried (llama.cpp's ``timings``, Ollama's final message)."""
    problem: str | None = None
    """Why the stream cannot be forwarded further: ``upstream_malformed_event`` or ``upstream_event_too_large``."""

    @property
    def content_events(self) -> int:
        """Content chunks so far (one token each, as vLLM streams them)."""
        return len(self.content_ns)

    @property
    def first_content_ns(self) -> int | None:
        """When the first content chunk arrived, or None before it."""
        return self.content_ns[0] if self.content_ns else None

    @property
    def last_content_ns(self) -> int | None:
        """When the latest content chunk arrived, or None before the first."""
        content_ns = self.content_ns
        return content_ns[-1] if content_ns else None

    @property
    def gaps_s(self) -> list[float]:
        """Seconds between consecutive content chunks (0 for chunks that came in one read)."""
        return [(later - earlier) / 1e9 for earlier, later in pairwise(self.content_ns)]

    def ttft_s(self, start_ns: int) -> float | None:
        """Seconds from ``start_ns`` to the first content chunk, or None when none came."""
        return (self.content_ns[0] - start_ns) / 1e9 if self.content_ns else None


class StreamReader:
    """What the SSE and NDJSON readers share: the stream's measures and the bytes of an unfinished event or line
    held back until its end. The relay (serving/stream_relay.py) asks any reader the same three things."""

    # Slots: a paced stream's chunk finds the reader cold in the caches; its fields in the object itself
    # are one memory read fewer than in a separate values array.
    __slots__ = ("_buffer", "stats")

    def __init__(self) -> None:
        self.stats = StreamStats()
        self._buffer = b""

    def flush(self) -> bytes:
        """Return whatever incomplete event or line is left at the end of the stream, unchanged."""
        rest, self._buffer = self._buffer, b""
        return rest

    @property
    def broken(self) -> bool:
        """The stream cannot be forwarded further: :attr:`StreamStats.problem` says why."""
        return self.stats.problem is not None

    @property
    def pending(self) -> int:
        """Bytes of an unterminated event or line held back, waiting for its end."""
        return len(self._buffer)


class SseReader(StreamReader):
    """Splits a byte stream into SSE events, measures them and decides what to forward."""

    __slots__ = ("_max_event_bytes", "_on_usage", "_strip_usage_chunk", "_strip_usage_field",
                 "_template", "_template_tries", "_trace_id")

    def __init__(
        self,
        *,
        strip_usage_chunk: bool,
        strip_usage_field: bool,
        on_usage: Callable[[int | None, int | None], None] | None = None,
        max_event_bytes: int | None = None,
        trace_id: str | None = None,
    ) -> None:
        super().__init__()
        self._strip_usage_chunk = strip_usage_chunk
        self._strip_usage_field = strip_usage_field
        self._on_usage = on_usage
        self._max_event_bytes = max_event_bytes
        self._trace_id = trace_id
        self._template: tuple[bytes, bytes] | None = None
        """The bytes before and after the text of the stream's first plain content event (see :func:`_template_of`)."""
        self._template_tries = _TEMPLATE_TRIES
        """Plain events left to learn a template from (a tool-call stream, with no text string, never gives one)."""

    def feed(self, data: bytes, now_ns: int) -> bytes:
        """Take a network chunk that arrived at ``now_ns``; return the complete events to forward."""
        stats = self.stats
        if stats.problem is not None:
            return b""
        if not self._buffer and stats.content_ns:
            # The usual read of a paced stream (a GPU's decode step apart): exactly one ordinary content
            # event, one ``data: {...}`` line and its blank line, a choice running, no usage, no error.
            # Forwarded as it came and counted. Cheapest test first (:meth:`take_event`: the event is the
            # template's with another text); else the tests of the hot path below, for one event (and the
            # template learnt from it).
            if self.take_event(data, 0, len(data), now_ns):
                return data
            last = len(data) - 2
            plain = (data.find(b"\n") == last and data.endswith(b"\n\n") and data.startswith(b"data: {")
                     and data.count(_RUNNING) + data.count(_RUNNING_SPACED) == 1 and data.find(b"\r") < 0
                     and data.find(b'"usage"') < 0 and data.find(b'"error"') < 0)
            if plain and self._template is None and self._template_tries:
                self._template = _template_of(data)
                self._template_tries -= 1
            limit = self._max_event_bytes
            if plain and (limit is None or len(data) <= limit):
                stats.content_ns.append(now_ns)
                return data
        buffer = self._buffer + data if self._buffer else data
        # Byte tests use ``find``, not ``in``: ``needle in bytes`` first tries the needle as an
        # integer and pays for the TypeError, which costs more than the scan of a chunk.
        if buffer.find(b"\r") >= 0:
            return self._feed_general(buffer, now_ns)
        if stats.content_ns and (self._max_event_bytes is None or len(buffer) <= self._max_event_bytes):
            # The hot path: everything complete in this read is ordinary mid-stream content
            # (one ``data: {...}`` line per event, each with a running choice, no usage, no
            # error). Then it is forwarded as it came and only counted and timestamped, with
            # a few byte scans for the whole read rather than work per event. Events that
            # arrived together are 0 s apart, as they would be one by one.
            end = buffer.rfind(b"\n\n") + 2
            if end > 1:
                whole = buffer[:end] if end < len(buffer) else buffer
                # one event (its end the only separator) is the usual read of a paced stream
                event_count = 1 if whole.find(b"\n\n") == end - 2 else whole.count(b"\n\n")
                if (whole.count(b"data: {") == event_count
                        and whole.count(_RUNNING) + whole.count(_RUNNING_SPACED) == event_count
                        and whole.find(b'"usage"') < 0 and whole.find(b'"error"') < 0):
                    self._buffer = buffer[end:]
                    self._count_content(event_count, now_ns)
                    return whole
        events = buffer.split(b"\n\n")
        self._buffer = events.pop()
        if self._max_event_bytes is not None and len(buffer) > self._max_event_bytes:
            self._check_size(events)
        if not events:
            return b""
        # Event by event. What is forwarded is the read's complete part with a few events
        # replaced or removed: ``pieces`` gathers runs of unchanged events (slices of
        # ``buffer``) and the replacements, and stays empty while nothing changed.
        # A mid-stream content event (one ``data: {...}`` line, a choice still running, no
        # usage, no error) is counted without JSON; byte tests only, so a false "no" costs a
        # parse, never correctness. Where they can, the tests are made once for the read:
        # events before its first ``"usage"`` or ``"error"`` contain neither, and when it has
        # no newline besides the separators', every event is one line.
        complete = len(buffer) - len(self._buffer)
        clean_until = min(_first(buffer, b'"usage"', complete), _first(buffer, b'"error"', complete))
        one_line_each = buffer.count(b"\n", 0, complete) == 2 * len(events)
        pieces: list[bytes] = []
        start = pos = 0  # start of the run of unchanged events not yet in pieces; start of this event
        counted = 0  # content events met and not yet added to the stats (all arrived at now_ns)
        bulk = one_line_each  # the run of plain content events up to clean_until may be counted at once
        index = 0
        while index < len(events):
            if bulk and stats.content_ns:
                # A whole stream in one read (an upstream faster than us): after the first content
                # event, the events before the first "usage" or "error" are counted in bulk.
                bulk = False
                run_end, events_in_run = _running_run(buffer, pos, clean_until, complete)
                if events_in_run:
                    counted += events_in_run
                    pos = run_end
                    index += events_in_run
                    continue
            body = events[index]
            index += 1
            end = pos + len(body) + 2
            payload: bytes | None = None  # the JSON of a one-line data event
            if body.startswith(b"data: {") and (one_line_each or body.find(b"\n") < 0):
                if stats.content_ns and _is_running(body) and (
                        end <= clean_until or _no_usage_no_error(body)):
                    counted += 1  # a content chunk among others (first, last, usage) in this read
                    pos = end
                    continue
                payload = body[6:]
            if counted:  # the stats up to date before an event that reads them
                self._count_content(counted, now_ns)
                counted = 0
            raw = buffer[pos:end]
            forwarded = self._event(raw, body, now_ns) if payload is None else self._json_event(raw, payload, now_ns)
            if stats.problem is not None:
                pieces.append(buffer[start:pos])  # forward what came before the bad event, nothing after
                return b"".join(pieces)
            if forwarded is not raw:
                pieces.append(buffer[start:pos])
                pieces.append(forwarded)
                start = end
            pos = end
        if counted:
            self._count_content(counted, now_ns)
        if not pieces:
            return buffer[:pos]
        pieces.append(buffer[start:pos])
        return b"".join(pieces)

    def take_event(self, data: bytes, start: int, end: int, now_ns: int) -> bool:
        """Count ``data[start:end]`` as a content chunk that arrived at ``now_ns`` if it is one whole ordinary
        content event, to be forwarded unchanged; False (and nothing done) when that takes more than this test.

        The test: nothing is held back from an earlier read, and the bytes around the event's text are those
        of the stream's first plain content event (its template, :func:`_template_of`) while the text has no
        quote, backslash or line end, so it cannot have ended the string: then the event is that one with
        another text. A few byte comparisons, no copy: the proxy's relay calls it first on a socket read that
        is exactly one HTTP chunk (:meth:`serving.upstream_http.UpstreamConnection.take_whole_chunks`), and
        :meth:`feed` on a read that is exactly one event. What it declines goes through :meth:`feed`.
        """
        template = self._template
        if template is None or self._buffer or self.stats.problem is not None:
            return False
        prefix, suffix = template
        text_end = end - len(suffix)
        limit = self._max_event_bytes
        if (text_end >= start + len(prefix) and data.startswith(prefix, start) and data.endswith(suffix, start, end)
                and _IN_STRING_ESCAPES.search(data, start + len(prefix), text_end) is None
                and (limit is None or end - start <= limit)):
            self.stats.content_ns.append(now_ns)
            return True
        return False

    def _count_content(self, events: int, now_ns: int) -> None:
        """Count ``events`` mid-stream content events that arrived together at ``now_ns``: 0 s apart after the first."""
        if events == 1:
            self.stats.content_ns.append(now_ns)
        else:
            self.stats.content_ns.extend([now_ns] * events)

    def _check_size(self, complete: list[bytes]) -> None:
        """Flag an event (complete, or still unterminated in the buffer) larger than ``max_event_bytes``."""
        limit = self._max_event_bytes or 0
        if len(self._buffer) > limit or any(len(body) > limit for body in complete):
            self.stats.problem = "upstream_event_too_large"
            self._buffer = b""
            complete.clear()

    def _feed_general(self, buffer: bytes, now_ns: int) -> bytes:
        """Slow path for streams that use CRLF line ends."""
        out: list[bytes] = []
        while True:
            best, best_len = -1, 0
            for sep in _SEPARATORS:
                index = buffer.find(sep)
                if index >= 0 and (best < 0 or index < best):
                    best, best_len = index, len(sep)
            if best < 0:
                break
            raw, buffer = buffer[: best + best_len], buffer[best + best_len :]
            forwarded = self._event(raw, raw[:best], now_ns)
            if self.stats.problem is not None:
                buffer = b""
                break
            out.append(forwarded)
        self._buffer = buffer
        if self._max_event_bytes is not None:
            self._check_size([])
        return b"".join(out)

    def _event(self, raw: bytes, body: bytes, now_ns: int) -> bytes:
        data_lines = [line[5:].lstrip() for line in body.splitlines() if line.startswith(b"data:")]
        if not data_lines:
            return raw
        return self._json_event(raw, b"\n".join(data_lines), now_ns)

    def _json_event(self, raw: bytes, payload: bytes, now_ns: int) -> bytes:
        if payload == b"[DONE]" or payload.strip() == b"[DONE]":
            self.stats.done = True
            return raw
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.stats.undecodable_events += 1
            self.stats.problem = "upstream_malformed_event"
            return b""
        if not isinstance(obj, dict):
            return raw
        return self._chunk(raw, obj, now_ns)

    def _chunk(self, raw: bytes, obj: dict[str, Any], now_ns: int) -> bytes:
        stats = self.stats
        if stats.response_model is None and isinstance(obj.get("model"), str):
            stats.response_model = obj["model"]
        choices = obj.get("choices")
        content = False
        if choices:
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                if not content:
                    delta = choice.get("delta")
                    if isinstance(delta, dict):
                        content = bool(delta.get("content") or delta.get("reasoning_content")
                                       or delta.get("tool_calls"))
                    else:
                        content = bool(choice.get("text"))
                reason = choice.get("finish_reason")
                if reason:
                    stats.finish_reason = str(reason)
        elif "error" in obj:
            error = obj["error"]
            if not isinstance(error, dict):
                stats.error, stats.error_type = str(error), upstream_error_type(None, None)
            else:
                stats.error = str(error.get("message"))
                stats.error_type = upstream_error_type(error.get("type"), error.get("code"))
                if self._trace_id is not None or error.get("type") != stats.error_type:
                    error["type"] = stats.error_type  # the client reads the type the record and span carry
                    if self._trace_id is not None:
                        error["trace_id"] = self._trace_id
                    return b"data: " + orjson.dumps(obj) + b"\n\n"  # rare: worth a re-serialization
        if content:
            stats.content_ns.append(now_ns)
        if "timings" in obj:  # llama.cpp: its usage chunk (its native stream's last event) carries the timings
            stats.phases = from_llamacpp(obj["timings"])
        usage = obj.get("usage")
        if isinstance(usage, dict):
            stats.prompt_tokens = usage.get("prompt_tokens", stats.prompt_tokens)
            stats.completion_tokens = usage.get("completion_tokens", stats.completion_tokens)
            if self._on_usage is not None:
                self._on_usage(stats.prompt_tokens, stats.completion_tokens)
            if not choices:
                return b"" if self._strip_usage_chunk else raw
            if self._strip_usage_field:
                return _without_usage(raw, obj)
        return raw


def _running_run(buffer: bytes, start: int, limit: int, complete: int) -> tuple[int, int]:
    """The end and number of the events from ``start`` that are all running ``data: {...}`` lines ending
    before ``limit``; ``(start, 0)`` when none are. Tried: all the events before ``limit``, and all but the
    last; the latter first when ``limit`` is a usage or error event (before the read's ``complete`` end),
    since the event before that is, as a rule, the one with the finish_reason."""
    end = buffer.rfind(b"\n\n", start, limit) + 2
    if end <= start + 1:
        return start, 0
    but_last = buffer.rfind(b"\n\n", start, end - 2) + 2
    for run_end in (but_last, end) if limit < complete else (end, but_last):
        if run_end <= start + 1:
            continue
        run = buffer[start:run_end]
        events = run.count(b"\n\n")
        if run.count(b"data: {") == events and run.count(_RUNNING) + run.count(_RUNNING_SPACED) == events:
            return run_end, events
    return start, 0


def _template_of(event: bytes) -> tuple[bytes, bytes] | None:
    """A plain content event's bytes before its text and after it: ``(b'data: {..."content":"', b'"}...}\\n\\n')``.

    The text is the first ``content`` (chat) or ``text`` (completions) string value; None when it has
    none, or when its text holds an escape (the template's parts must be exactly what surrounds a
    string's characters). Another event that starts and ends with these parts and has between them
    only characters that cannot end a JSON string (no quote, backslash or line end) is the same event
    with another text: plain content as well.
    """
    for key in _TEXT_KEYS:
        at = event.find(key)
        if at < 0:
            continue
        opening = at + len(key) + (event[at + len(key):at + len(key) + 1] == b" ")
        if event[opening:opening + 1] != b'"':
            return None
        closing = event.find(b'"', opening + 1)
        if closing < 0 or event.find(b"\\", opening + 1, closing) >= 0:
            return None
        return event[:opening + 1], event[closing:]
    return None


def _first(data: bytes, needle: bytes, end: int) -> int:
    """Where ``needle`` first occurs in ``data[:end]``, or ``end``."""
    found = data.find(needle, 0, end)
    return end if found < 0 else found


def _is_running(body: bytes) -> bool:
    """Whether an event has a choice still running (vLLM writes ``"finish_reason":null`` compactly;
    json.dumps writes it with a space)."""
    return body.find(_RUNNING) >= 0 or body.find(_RUNNING_SPACED) >= 0


def _no_usage_no_error(body: bytes) -> bool:
    """Whether an event has neither a ``usage`` nor an ``error`` member (or text that looks like one)."""
    return body.find(b'"usage"') < 0 and body.find(b'"error"') < 0


def _without_usage(raw: bytes, obj: dict[str, Any]) -> bytes:
    """The event re-serialized without its ``usage`` member (orjson: compact, like vLLM's own output)."""
    del obj["usage"]
    return b"data: " + orjson.dumps(obj) + b"\n\n"

"""Shadow traffic: a copy of a sampled request goes to serve.shadow_upstream and is compared, never awaited.

The copy is a task of its own, started once the request is admitted and chosen
(:meth:`serving.upstream_choice.UpstreamChoice.shadow_for`); the client's answer never waits for it.
What waits is the request's record: its metrics, log record and span are finished when the copy
is done, at most serve.shadow_timeout_s later, and carry both sides' status, outcome, TTFT, e2e
and tokens, and how far the outputs differ:

- ``shadow_result``: ``match`` or ``mismatch`` when both answered with a text; ``not_compared``
  when either has none (an error, an answer that is neither JSON nor SSE); ``dropped_full``
  (serve.shadow_max_inflight copies in flight), ``dropped_slow`` (past serve.shadow_timeout_s)
  or ``dropped_down`` (refused, reset, or the shadow's readiness probe failing) when the copy was
  dropped and its answer is unknown. A streamed answer's text is what the relay forwarded to the
  client (:class:`ForwardedText`, on shadowed streams only).
- A greedy request (``temperature`` 0, or ``top_k`` 1) should give the same text on both sides: it
  matches only when the texts are equal. Any other request matches when its normalised token
  edit distance is 0.
- ``shadow_distance``: the Levenshtein distance between the two outputs split at whitespace,
  divided by the longer one's token count (rapidfuzz): 0 the same, 1 nothing in common. Whitespace
  tokens, not the models' own: the two sides may tokenize differently (tokenizer drift is its own signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web
from rapidfuzz.distance import Levenshtein

from alert_rules.engine import RuleFileError, parse_duration_ms
from exporters.records import RequestRecord, outcome_of_status
from log_pipeline.records import event_from_record
from serving.endpoints import error_response
from serving.explain import RequestRing
from serving.stream_relay import PieceReader

log = structlog.get_logger(__name__)

SHADOW_HEADER = "x-inferwatch-shadow"
"""Sent on every shadow copy (value ``1``), so the shadow's logs can tell copies from real traffic."""


def output_text(answer: Any) -> str | None:
    """The generated text of a non-streamed answer (every choice's, joined), or None when it has none."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        return None
    texts = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        texts.append(text if isinstance(text, str) else "")
    return "\n".join(texts)


def is_greedy(payload: Mapping[str, Any]) -> bool:
    """A request whose output is determined by its prompt: ``temperature`` 0 or ``top_k`` 1."""
    return payload.get("temperature") == 0 or payload.get("top_k") == 1


def output_distance(a: str, b: str) -> float:
    """Normalised token edit distance of two outputs (tokens split at whitespace): 0 the same, 1 all different."""
    return float(Levenshtein.normalized_distance(a.split(), b.split()))


@dataclass(slots=True)
class ShadowAnswer:
    """What the shadow answered to one copy (times in seconds from when the copy was sent)."""

    status: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    text: str | None = None
    dropped: str | None = None
    """``slow`` or ``down`` when the copy got no complete answer."""


@dataclass(slots=True)
class _Copy:
    task: asyncio.Task[ShadowAnswer]
    greedy: bool
    primary_text: str | None = None
    forwarded: list[bytes] | None = None
    """What the client's stream carried (its text is read from it once the copy is done)."""


class ForwardedText:
    """The SSE reader of a shadowed stream, keeping what it lets through to the client (a
    :class:`serving.stream_relay.PieceReader`): the client's text, for the comparison. Only shadowed
    streams get one; the relay of every other stream is untouched."""

    def __init__(self, reader: PieceReader, kept: list[bytes]) -> None:
        self._reader = reader
        self._kept = kept

    def feed(self, data: bytes, now_ns: int) -> bytes:
        forwarded = self._reader.feed(data, now_ns)
        self._kept.append(forwarded)
        return forwarded

    def take_event(self, data: bytes, start: int, end: int, now_ns: int) -> bool:
        if not self._reader.take_event(data, start, end, now_ns):
            return False
        self._kept.append(data[start:end])
        return True

    @property
    def broken(self) -> bool:
        return self._reader.broken


class ShadowCopies:
    """Sends copies to the shadow, at most ``max_inflight`` at once, and fills each request's ``shadow_*`` fields."""

    def __init__(
        self, upstream: str, max_inflight: int, timeout_s: float, session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self._max_inflight = max_inflight
        self._timeout_s = timeout_s
        self._session = session
        self._copies: dict[str, _Copy] = {}
        """Copies by the span id of their request, until the request's record is finished."""
        self.in_flight = 0
        self.ready: bool | None = None
        """The shadow's last readiness probe (None before the first): while False, copies are dropped as down."""

    def send(self, record: RequestRecord, path_qs: str, headers: dict[str, str], body: bytes,
             payload: Mapping[str, Any], streamed: bool) -> None:
        """Start a copy of the request (or drop it, counted on the record); returns at once."""
        if self.in_flight >= self._max_inflight:
            record.shadow_result = "dropped_full"
            return
        if self.ready is False:
            record.shadow_result = "dropped_down"
            return
        self.in_flight += 1
        task = asyncio.create_task(self._send(path_qs, {**headers, SHADOW_HEADER: "1"}, body, streamed))
        task.add_done_callback(self._done)
        self._copies[record.span_id] = _Copy(task, is_greedy(payload))

    def primary_answer(self, record: RequestRecord, body: bytes) -> None:
        """The client's non-streamed answer, for the comparison (nothing happens for an unshadowed request)."""
        copy = self._copies.get(record.span_id)
        if copy is not None and body.startswith(b"{"):
            with contextlib.suppress(ValueError):  # not JSON: nothing to compare
                copy.primary_text = output_text(orjson.loads(body))

    def tap(self, record: RequestRecord, reader: PieceReader) -> PieceReader:
        """The reader the relay of a streamed answer uses: ``reader`` itself, or for a shadowed request one that
        keeps the client's text."""
        copy = self._copies.get(record.span_id)
        if copy is None:
            return reader
        copy.forwarded = []
        return ForwardedText(reader, copy.forwarded)

    def after_copy(self, record: RequestRecord, finish: Callable[[], None]) -> Callable[[], None]:
        """``finish``, or, for a shadowed request, a call that runs it once its copy is done and compared."""
        copy = self._copies.pop(record.span_id, None)
        if copy is None:
            return finish

        def when_done(task: asyncio.Task[ShadowAnswer]) -> None:
            try:
                answer = task.result() if not task.cancelled() else ShadowAnswer(dropped="slow")
                if copy.forwarded is not None:
                    copy.primary_text = stream_text(b"".join(copy.forwarded).splitlines())
                compare(record, answer, copy.primary_text, greedy=copy.greedy)
            except Exception:  # a comparison must never lose the request's record
                log.exception("shadow_comparison_failed", trace_id=record.trace_id)
            finish()

        return lambda: copy.task.add_done_callback(when_done)

    def cancel_all(self) -> None:
        """At shutdown: stop the copies still out (their requests' records are finished as dropped slow)."""
        for copy in list(self._copies.values()):
            copy.task.cancel()

    def _done(self, _task: asyncio.Task[ShadowAnswer]) -> None:
        self.in_flight -= 1

    async def _send(self, path_qs: str, headers: dict[str, str], body: bytes, streamed: bool) -> ShadowAnswer:
        answer = ShadowAnswer()
        start_ns = time.perf_counter_ns()
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._session().post(self.upstream + path_qs, data=body, headers=headers) as response:
                    answer.status = response.status
                    if streamed and response.content_type == "text/event-stream":
                        await _read_stream(response, answer, start_ns)
                    else:
                        data = await response.read()
                        answer.ttft_s = (time.perf_counter_ns() - start_ns) / 1e9
                        _read_body(data, answer)
        except TimeoutError:
            answer.dropped = "slow"
        except (aiohttp.ClientError, OSError) as err:
            log.info("shadow_copy_failed", upstream=self.upstream, error=repr(err))
            answer.dropped = "down"
        answer.e2e_s = (time.perf_counter_ns() - start_ns) / 1e9
        return answer


def _read_body(data: bytes, answer: ShadowAnswer) -> None:
    try:
        obj = orjson.loads(data)
    except ValueError:
        return
    if not isinstance(obj, dict):
        return
    answer.text = output_text(obj)
    _read_usage(obj, answer)


def _read_usage(obj: dict[str, Any], answer: ShadowAnswer) -> None:
    usage = obj.get("usage")
    if isinstance(usage, dict):
        answer.prompt_tokens = usage.get("prompt_tokens")
        answer.completion_tokens = usage.get("completion_tokens")


def _event(line: bytes) -> dict[str, Any] | None:
    """The JSON object of an SSE ``data:`` line, or None (another line, ``[DONE]``, not an object)."""
    if not line.startswith(b"data:"):
        return None
    try:
        event = orjson.loads(line[5:].strip())
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _event_text(event: dict[str, Any]) -> str:
    """The text an SSE chunk adds (a chat delta's content or a completion's text, every choice's)."""
    pieces = []
    for choice in event.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(text, str):
            pieces.append(text)
    return "".join(pieces)


def stream_text(lines: Iterable[bytes]) -> str:
    """The whole text of an SSE stream's lines."""
    return "".join(_event_text(event) for line in lines if (event := _event(line)) is not None)


async def _read_stream(response: aiohttp.ClientResponse, answer: ShadowAnswer, start_ns: int) -> None:
    """Read the shadow's SSE stream: the first content event's time, the text and the usage."""
    pieces: list[str] = []
    async for line in response.content:
        event = _event(line)
        if event is None:
            continue
        _read_usage(event, answer)
        text = _event_text(event)
        if text:
            if answer.ttft_s is None:
                answer.ttft_s = (time.perf_counter_ns() - start_ns) / 1e9
            pieces.append(text)
    answer.text = "".join(pieces)


def compare(record: RequestRecord, answer: ShadowAnswer, primary_text: str | None, *, greedy: bool) -> None:
    """Fill the record's ``shadow_*`` fields from the shadow's answer and the client's text."""
    if answer.dropped is not None:
        record.shadow_result = f"dropped_{answer.dropped}"
        return
    record.shadow_status = answer.status
    record.shadow_outcome = str(outcome_of_status(answer.status))
    record.shadow_ttft_s, record.shadow_e2e_s = answer.ttft_s, answer.e2e_s
    record.shadow_prompt_tokens, record.shadow_completion_tokens = answer.prompt_tokens, answer.completion_tokens
    if primary_text is None or answer.text is None:
        record.shadow_result = "not_compared"
        return
    record.shadow_distance = distance = output_distance(primary_text, answer.text)
    same = primary_text == answer.text if greedy else distance == 0.0
    record.shadow_result = "match" if same else "mismatch"


def add_shadow_routes(admin: web.Application, ring: RequestRing) -> None:
    """``GET /admin/shadow?since=D`` on the admin sub-application: the shadowed requests among the sidecar's
    recent ones (serve.explain_ring_size), as log events, for ``inferwatch shadow report --sidecar``."""

    async def shadowed(request: web.Request) -> web.Response:
        try:
            since_ms = parse_duration_ms(request.query.get("since", "1h"), "since")
        except RuleFileError as err:
            return error_response(request, 400, str(err))
        since_unix = time.time() - since_ms / 1000.0
        events = [event_from_record(record, sla_s=None) for record in ring
                  if record.shadow_result is not None and record.start_unix >= since_unix]
        return web.json_response({"ring_size": len(ring), "since_s": since_ms / 1000.0, "requests": events},
                                 headers={"Cache-Control": "no-store"})

    admin.router.add_get("/shadow", shadowed)

"""The measuring reverse proxy for vLLM's OpenAI-compatible API (``/v1/*``)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from array import array
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import structlog
from opentelemetry.trace import Span, Status, StatusCode

from exporters.catalog.request import GENERATION_ROUTES, OLLAMA_ROUTES, ROUTES
from exporters.engine_phases import of_answer, ollama_outcome
from exporters.engine_stats_wire import EngineRequestStats
from exporters.genai_metrics import operation_name, provider_name
from exporters.inflight import InFlightRequests, InFlightTokens, PromptSizeEstimator
from exporters.records import AnswerPhases, Outcome, RequestRecord, length_bucket_labels, outcome_of_status
from serving.admission import Admission, Refusal
from serving.body_checks import BodyError, decode_json_object
from serving.config import ServeConfig
from serving.errors import error_body, sse_error_event, upstream_error_body
from serving.exchange import Exchange
from serving.ndjson import CONTENT_TYPE as NDJSON_CONTENT_TYPE
from serving.ndjson import NdjsonReader, error_line
from serving.sse import SseReader
from serving.stream_relay import StreamRelay
from serving.tenancy import Tenancy
from serving.tracing import TRACE_HEADER, Tracing, span_id_hex, trace_id_hex
from serving.unicode_nfc import normalize_prompt_text
from serving.upstream_choice import Upstream, UpstreamChoice
from serving.upstream_http import (
    ConnectTimeoutError,
    DisconnectedError,
    ReadTimeoutError,
    UnreachableError,
    UpstreamConnection,
    UpstreamPool,
    upstream_address,
)

if TYPE_CHECKING:
    from serving.shadow import ShadowCopies

log = structlog.get_logger(__name__)

NATIVE_STREAM_ROUTES = frozenset(OLLAMA_ROUTES)
"""Routes that stream unless the request says ``"stream": false`` (Ollama's), with their counts built in."""
KNOWN_ROUTES = frozenset(ROUTES)
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade",
})
REQUEST_HEADERS_DROPPED = HOP_BY_HOP | {"host", "content-length", "accept-encoding", "traceparent", "tracestate"}
RESPONSE_HEADERS_DROPPED = HOP_BY_HOP | {"content-length", "content-encoding", "server", "date"}
MAX_MODEL_LABELS = 64
PROMPT_PLACEHOLDER = "[prompt text]"


_PROBLEMS = {
    "upstream_malformed_event": "upstream sent an SSE data line (or NDJSON line) that is not JSON",
    "upstream_event_too_large": "upstream sent an SSE event (or NDJSON line) larger than serve.max_event_bytes",
}

Observer = Callable[[RequestRecord, Span], None]
FinishHook = Callable[[RequestRecord, Callable[[], None]], None]
"""Called with a finished request and the call that runs its observers and ends its span (engine stats)."""
RequestDescriber = Callable[[RequestRecord, Mapping[str, str], dict[str, Any] | None, Sequence[str]], None]
"""Called once a request's body is read, with its headers, decoded generation payload (None for others) and the
prompt's text pieces (:attr:`Outgoing.texts`)."""


def engine_attributes(engine: EngineRequestStats) -> dict[str, float | int]:
    """Span attributes of vLLM's own numbers for a request (times in milliseconds, as in the log record)."""
    return {
        "inferwatch.engine.queue_ms": round(engine.queued_s * 1000.0, 1),
        "inferwatch.engine.prefill_ms": round(engine.prefill_s * 1000.0, 1),
        "inferwatch.engine.decode_ms": round(engine.decode_s * 1000.0, 1),
        "inferwatch.engine.preemptions": engine.preemptions,
        "inferwatch.engine.cached_tokens": engine.cached_tokens,
    }
"""Called once per request, after it ended and before its span ends (metrics, logs, health)."""


def answer_attributes(phases: AnswerPhases) -> dict[str, float | int | str]:
    """Span attributes of the engine's numbers that came in its answer (milliseconds, as in the log record)."""
    attributes: dict[str, float | int | str] = {
        "inferwatch.engine.source": phases.engine,
        "inferwatch.engine.prefill_ms": round(phases.prefill_s * 1000.0, 1),
        "inferwatch.engine.decode_ms": round(phases.decode_s * 1000.0, 1),
    }
    for name, seconds in (("load_ms", phases.load_s), ("total_ms", phases.total_s)):
        if seconds is not None:
            attributes[f"inferwatch.engine.{name}"] = round(seconds * 1000.0, 1)
    if phases.cached_tokens is not None:
        attributes["inferwatch.engine.cached_tokens"] = phases.cached_tokens
    return attributes


def run_observers(observers: list[Observer], record: RequestRecord, span: Span) -> None:
    """Run each observer on a finished request; one that fails is logged, never raised."""
    for observer in observers:
        try:
            observer(record, span)
        except Exception:  # an observer must never break the request path
            log.exception("request_observer_failed", observer=getattr(observer, "__name__", repr(observer)))


def prompt_strings(payload: dict[str, Any]) -> list[str]:
    """The prompt's text pieces: ``prompt`` (string or strings) and each message's text content."""
    found: list[str] = []
    prompt = payload.get("prompt")
    for item in prompt if isinstance(prompt, list) else [prompt]:
        if isinstance(item, str):
            found.append(item)
    messages = payload.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else [content]:
            text = part.get("text") if isinstance(part, dict) else part
            if isinstance(text, str):
                found.append(text)
    return found


def without_prompt_text(message: str, payload: dict[str, Any] | None) -> str:
    """``message`` with any prompt text it quotes (validation errors echo their input) replaced."""
    if payload is None:
        return message
    for text in prompt_strings(payload):
        if len(text) >= 4 and text in message:
            message = message.replace(text, PROMPT_PLACEHOLDER)
    return message


def _seconds_left(deadline_ns: int) -> float:
    """Seconds until ``deadline_ns`` (perf_counter_ns), never negative: one total limit across the request's phases."""
    return max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9)


async def _within_deadline(sending: Awaitable[UpstreamConnection], deadline_ns: int) -> UpstreamConnection:
    """Await ``sending`` within what is left of the request's deadline."""
    async with asyncio.timeout(_seconds_left(deadline_ns)):
        return await sending


def prompt_hash(payload: dict[str, Any], record: RequestRecord, texts: Sequence[str]) -> None:
    """Store a short SHA-256 of the prompt (or messages) and its length in characters (of ``texts``, its
    :func:`prompt_strings`), never the text."""
    prompt = payload.get("messages", payload.get("prompt"))
    if prompt is None:
        return
    record.prompt_hash = hashlib.sha256(orjson.dumps(prompt)).hexdigest()[:16]
    record.prompt_chars = sum(map(len, texts))


@dataclass(slots=True)
class Outgoing:
    """The request as it will be sent upstream, and what the client asked for."""

    body: bytes
    payload: dict[str, Any] | None = None
    model: str | None = None
    stream: bool = False
    client_usage: bool = False
    client_continuous: bool = False
    texts: Sequence[str] = ()
    """The prompt's text pieces (:func:`prompt_strings`), read once after normalization: its length and text class."""


@dataclass
class ProxyState:
    """Mutable state shared by the requests of one proxy."""

    known_models: set[str] = field(default_factory=set)


class Proxy:
    """Forwards ``/v1/*`` to the upstream, streaming included, and measures every request.

    Whatever the upstream does, the client gets a well-formed answer within the configured
    timeouts: the upstream's own answer, a JSON error with ``error.type`` and ``trace_id`` when
    the failure comes before the status line went out, or a final SSE error event and a clean
    end of the stream when it comes after.
    """

    def __init__(
        self,
        config: ServeConfig,
        session: Callable[[], aiohttp.ClientSession],
        tracing: Tracing,
        observers: list[Observer],
        inflight: InFlightTokens,
        admission: Admission,
        capture_prompt_hash: bool = False,
        on_normalized: Callable[[], None] | None = None,
        finish_with_engine_stats: FinishHook | None = None,
        in_flight: InFlightRequests | None = None,
        shadow: ShadowCopies | None = None,
        describe_request: RequestDescriber | None = None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self._config = config
        self._tenancy = tenancy
        self._describe_request = describe_request
        self._in_flight = in_flight if in_flight is not None else InFlightRequests()
        self._finish_with_engine_stats = finish_with_engine_stats
        self._session = session
        self._tracing = tracing
        self._observers = observers
        self._inflight = inflight
        self._admission = admission
        self._live_usage = config.live_token_counts
        self._exact_usage = config.live_token_counts and config.exact_live_token_counts
        self._prompt_sizes = PromptSizeEstimator()
        self._capture_prompt_hash = capture_prompt_hash
        self._on_normalized = on_normalized
        self._upstream = config.upstream.rstrip("/")
        self.provider_name = provider_name(config.engine)
        """The spans' ``gen_ai.provider.name``: the engine behind the sidecar, set again once it is recognized."""
        self.upstream_pool = UpstreamPool(self._upstream, config.connect_timeout_s)
        """The request path's connections to the upstream (serving/upstream_http.py)."""
        self.choice = UpstreamChoice(config, self.upstream_pool, self._prompt_sizes, shadow)
        """Which upstream each request goes to: long lane, canary, priority, shadow (serving/upstream_choice.py)."""
        address, port = upstream_address(self._upstream)
        self._server_attributes: dict[str, str | int] = {"server.address": address, "server.port": port}
        self._edges = tuple(config.length_bucket_edges)
        self._bucket_labels = length_bucket_labels(self._edges)  # length_bucket's labels, made once
        self._read_timeout_s = config.read_timeout_s  # until the status line, and between a body's pieces;
        # a stream's reads are watched by stream_relay.StallWatch
        self._request_timeout_s = config.request_timeout_s or None
        self._state = ProxyState()
        self._tokenize_timeout = aiohttp.ClientTimeout(total=2.0)
        self.active = 0
        """Requests being proxied right now (the in-flight limit counts these)."""

    async def handle(self, request: Exchange) -> None:
        """Proxy one request and answer it through ``request``; never raises except on cancellation."""
        start_ns = time.perf_counter_ns()
        route = request.path if request.path in KNOWN_ROUTES else "other"
        span = self._tracing.start_request_span(
            f"{request.method} {route}", request.headers,
            {"http.request.method": request.method, "url.path": request.path, **self._server_attributes},
        )
        record = RequestRecord(
            trace_id=trace_id_hex(span), span_id=span_id_hex(span), route=route,
            upstream=self._upstream, start_unix=time.time(),
        )
        structlog.contextvars.bind_contextvars(trace_id=record.trace_id)  # the handler's own task: no leak
        if self._tenancy is not None:  # tenant and request class from the headers: serving/tenancy.py
            self._tenancy.tag(request.headers, record)
        self.active += 1
        try:
            await self._forward(request, record, span, start_ns)
        except asyncio.CancelledError:
            record.outcome = Outcome.CANCELLED
            record.error_type = "client_disconnected"
            raise
        finally:
            self.active -= 1
            record.e2e_s = (time.perf_counter_ns() - start_ns) / 1e9
            self._inflight.remove(record.span_id)
            finish: Callable[[], None] = partial(self._finish, record, span)
            if self.choice.shadow is not None:  # a shadowed request's record waits for its copy: serving/shadow.py
                finish = self.choice.shadow.after_copy(record, finish)
            if self._finish_with_engine_stats is None:
                finish()
            else:  # vLLM's own numbers are joined first; they may still be on their way
                self._finish_with_engine_stats(record, finish)

    async def _forward(self, request: Exchange, record: RequestRecord, span: Span, start_ns: int) -> None:
        trace_headers = {TRACE_HEADER: record.trace_id, "Cache-Control": "no-store"}
        admission = self._admission
        try:
            admission.check_capacity(self.active)
            body = await admission.read_body(request)
            admission.check_signature(request, body)
            outgoing = self._prepare(request.method, record, body)
            if self._describe_request is not None:  # client, requested model, text class: serving/cutover.py
                self._describe_request(record, request.headers, outgoing.payload, outgoing.texts)
            admission.check_shedding(outgoing.model, request.headers)
            upstream = self._choose(request, outgoing, record) if self.choice.active else self.choice.main
        except Refusal as refusal:
            self._refuse(request, record, refusal, trace_headers)
            return
        if outgoing.payload is not None and span.is_recording():  # OpenTelemetry's GenAI conventions, request side
            span.set_attributes({
                "gen_ai.operation.name": operation_name(record.route) or "text_completion",
                "gen_ai.provider.name": self.provider_name, "gen_ai.request.model": outgoing.model or "",
            })
        tokenizing = None
        if outgoing.payload is not None and self._live_usage and outgoing.model:
            if not self._exact_usage:
                if record.prompt_chars is None:  # prompt_hash may have counted them already
                    record.prompt_chars = sum(map(len, outgoing.texts))
                record.prompt_tokens_estimate = self._prompt_sizes.estimate(outgoing.model, record.prompt_chars)
                if not outgoing.stream:  # a stream enters the table with its chunk counter
                    self._inflight.track(record.span_id, outgoing.model, record.prompt_tokens_estimate)
            elif not outgoing.stream:
                tokenizing = asyncio.create_task(self._count_prompt(outgoing.payload, record))
        in_flight_key = (self._in_flight_label(outgoing.model), record.route)
        self._in_flight.add(in_flight_key)  # inferwatch_requests_in_flight, read at scrape time
        try:
            await self._send(request, record, span, start_ns, outgoing, trace_headers, upstream)
        finally:
            self._in_flight.remove(in_flight_key)
            if tokenizing is not None and not tokenizing.done():
                tokenizing.cancel()
            if record.error_message:
                record.error_message = without_prompt_text(record.error_message, outgoing.payload)

    def _prepare(self, method: str, record: RequestRecord, body: bytes) -> Outgoing:
        """Read a generation request's JSON and ask the upstream for the usage data we measure with.

        Raises:
            Refusal: the body of a generation request is not a JSON object within the limits (400).
        """
        outgoing = Outgoing(body)
        if method != "POST" or record.route not in GENERATION_ROUTES:
            return outgoing
        try:
            payload = decode_json_object(body, self._config.max_json_depth)
        except BodyError as err:
            raise Refusal(400, Outcome.CLIENT_ERROR, "invalid_request_error", f"malformed JSON body: {err}") from None
        outgoing.payload = payload
        model = payload.get("model")
        outgoing.model = model if isinstance(model, str) else None
        record.model = outgoing.model or "unknown"
        native = record.route in NATIVE_STREAM_ROUTES
        outgoing.stream = record.stream = payload.get("stream") is not False if native else bool(payload.get("stream"))
        changed = False
        if self._config.normalize_unicode and normalize_prompt_text(payload):
            changed = True
            if self._on_normalized is not None:
                self._on_normalized()
        outgoing.texts = prompt_strings(payload)  # after normalization; one walk for every reader
        if self._capture_prompt_hash:
            prompt_hash(payload, record, outgoing.texts)  # after normalization: one text, one hash
        if self._tenancy is not None:
            self._tenancy.key_prompt(payload, outgoing.model, record)  # salted, for the repeat-prompt estimate
            self._tenancy.key_body(body, record)  # salted, for fast retries (exporters/fast_retries.py)
        if outgoing.stream and not native:  # Ollama's native stream always ends with its counts
            options = payload.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            outgoing.client_usage = bool(options.get("include_usage"))
            outgoing.client_continuous = bool(options.get("continuous_usage_stats"))
            options["include_usage"] = True
            if self._exact_usage:
                options["continuous_usage_stats"] = True
            payload["stream_options"] = options
            changed = True
        if changed:
            outgoing.body = orjson.dumps(payload)
        return outgoing

    async def _count_prompt(self, payload: dict[str, Any], record: RequestRecord) -> None:
        """Put a non-streamed request's prompt size in the live table (vLLM ``/tokenize``) while it runs."""
        body: dict[str, Any] = {"model": payload["model"]}
        if isinstance(payload.get("messages"), list):
            body["messages"] = payload["messages"]
        elif isinstance(payload.get("prompt"), str):
            body["prompt"] = payload["prompt"]
        else:
            return
        try:
            async with self._session().post(self._upstream + "/tokenize", data=orjson.dumps(body),
                                            headers={"Content-Type": "application/json"},
                                            timeout=self._tokenize_timeout) as response:
                if response.status != 200:
                    return
                count = (await response.json(loads=orjson.loads)).get("count")
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        if isinstance(count, int):
            self._inflight.update(record.span_id, record.model, count)

    def _choose(self, request: Exchange, outgoing: Outgoing, record: RequestRecord) -> Upstream:
        """The request's upstream by canary, lane and priority (serving/upstream_choice.py); may add its priority.

        Raises:
            Refusal: a long prompt while the long lane is down, with serve.long_prompt_fallback = refuse.
        """
        if outgoing.payload is not None and record.prompt_chars is None:
            record.prompt_chars = sum(map(len, outgoing.texts))
        upstream, changed = self.choice.choose(request, outgoing.payload, record)
        if changed:
            outgoing.body = orjson.dumps(outgoing.payload)
        return upstream

    def _connect(
        self, request: Exchange, target: Upstream, headers: dict[str, str], body: bytes | None, deadline_ns: int | None,
    ) -> Awaitable[UpstreamConnection]:
        """Send the request to ``target``: what to await for its status line, within the request's deadline (no
        coroutine of its own around the pool's without a deadline, the default: one frame fewer a request)."""
        sending = target.pool.request(request.method, request.path_qs, headers, body, self._read_timeout_s)
        return sending if deadline_ns is None else _within_deadline(sending, deadline_ns)

    async def _send(
        self, request: Exchange, record: RequestRecord, span: Span, start_ns: int, outgoing: Outgoing,
        trace_headers: dict[str, str], target: Upstream,
    ) -> None:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_HEADERS_DROPPED}
        headers["Accept-Encoding"] = "identity"
        if self._finish_with_engine_stats is not None:
            headers["X-Request-Id"] = record.trace_id  # vLLM's request id, how its plugin's records find us
        self._tracing.inject(span, headers)
        deadline_ns = start_ns + int(self._request_timeout_s * 1e9) if self._request_timeout_s else None
        shadowing = outgoing.payload is not None and self.choice.shadow is not None  # one test when off
        shadow = self.choice.shadow_for(record) if shadowing else None
        if shadow is not None:  # a copy to the shadow upstream, never awaited here
            shadow.send(record, request.path_qs, headers, outgoing.body, outgoing.payload or {}, outgoing.stream)
        try:
            try:
                upstream = await self._connect(request, target, headers, outgoing.body or None, deadline_ns)
            except UnreachableError:
                if target is not self.choice.long:
                    raise
                # the long lane refused the connection (nothing was sent): the fallback takes the request
                target = self.choice.fall_back(record, "unreachable")
                upstream = await self._connect(request, target, headers, outgoing.body or None, deadline_ns)
        except Refusal as refusal:
            self._refuse(request, record, refusal, trace_headers)
            return
        except Exception as err:  # every way of not getting a status line; see _upstream_failure
            self._upstream_failure(request, record, err, trace_headers, before_status=True)
            return
        try:
            record.accept_s = (time.perf_counter_ns() - start_ns) / 1e9
            record.upstream_sent_s = (upstream.sent_ns - start_ns) / 1e9
            record.connect_s = upstream.connect_ns / 1e9
            record.http_status = upstream.status
            record.outcome = outcome_of_status(upstream.status)
            record.model = self._model_label(outgoing.model, upstream.status)
            response_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in RESPONSE_HEADERS_DROPPED
            }
            if "Cache-Control" not in upstream.headers:
                response_headers["Cache-Control"] = "no-store"  # never a cached answer from another model
            response_headers[TRACE_HEADER] = record.trace_id
            content_type = upstream.headers.get("Content-Type", "")
            is_sse = content_type.startswith("text/event-stream")
            is_ndjson = content_type.startswith(NDJSON_CONTENT_TYPE)  # Ollama's native stream
            if (is_sse or is_ndjson) and upstream.status < 400:
                await self._stream(
                    request, upstream, response_headers, record, start_ns, deadline_ns, ndjson=is_ndjson,
                    expect_done=outgoing.stream,
                    strip_usage_chunk=outgoing.stream and not outgoing.client_usage,
                    strip_usage_field=outgoing.stream and self._exact_usage and not outgoing.client_continuous,
                    shadow=shadow,
                )
                return
            try:
                if deadline_ns is None:
                    data = await upstream.read_body(self._read_timeout_s)
                else:
                    async with asyncio.timeout(_seconds_left(deadline_ns)):
                        data = await upstream.read_body(self._read_timeout_s)
            except Exception as err:
                self._upstream_failure(request, record, err, trace_headers, before_status=False)
                return
            record.ttft_s = (time.perf_counter_ns() - start_ns) / 1e9
            if upstream.status >= 400:
                data, message, record.error_type = upstream_error_body(data, upstream.status, record.trace_id)
                if record.route in NATIVE_STREAM_ROUTES:  # Ollama's clients read "error" as a string
                    data = error_line(message or "", record.error_type, record.trace_id)
                record.error_message = message[:500] if message is not None else None
                response_headers["Content-Type"] = "application/json"
            else:
                self._read_json_body(data, record)
                if shadow is not None:
                    shadow.primary_answer(record, data)
            request.respond(upstream.status, response_headers, data)
        finally:
            upstream.release()

    def _upstream_failure(
        self, request: Exchange, record: RequestRecord, err: BaseException, headers: dict[str, str], *,
        before_status: bool,
    ) -> None:
        """The JSON answer when the upstream failed before the client got anything; re-raises what is not ours."""
        upstream = record.upstream
        if isinstance(err, ConnectTimeoutError):
            answer = (504, Outcome.TIMEOUT, "upstream_connect_timeout", f"upstream {upstream} did not accept a "
                      f"connection within {self._config.connect_timeout_s:g} s (serve.connect_timeout_s)")
        elif isinstance(err, ReadTimeoutError):
            answer = (504, Outcome.TIMEOUT, "upstream_timeout", f"upstream {upstream} stayed silent for "
                      f"{self._config.read_timeout_s:g} s (serve.read_timeout_s)")
        elif isinstance(err, TimeoutError):
            answer = (504, Outcome.TIMEOUT, "request_timeout", f"upstream {upstream} did not finish within "
                      f"{self._config.request_timeout_s:g} s (serve.request_timeout_s)")
        elif isinstance(err, UnreachableError):
            answer = (502, Outcome.UPSTREAM_ERROR, "upstream_unreachable", f"upstream {upstream} is unreachable: {err}")
        elif isinstance(err, DisconnectedError):
            moment = "before its status line" if before_status else "in the middle of its answer"
            answer = (502, Outcome.UPSTREAM_ERROR, "upstream_disconnected",
                      f"upstream {upstream} broke the connection {moment}: {err!r}")
        else:
            raise err
        self._fail(request, record, *answer, err, headers)

    async def _stream(
        self,
        request: Exchange,
        upstream: UpstreamConnection,
        headers: dict[str, str],
        record: RequestRecord,
        start_ns: int,
        deadline_ns: int | None,
        *,
        ndjson: bool = False,
        expect_done: bool,
        strip_usage_chunk: bool,
        strip_usage_field: bool,
        shadow: ShadowCopies | None = None,
    ) -> None:
        key, inflight = record.span_id, self._inflight

        def on_usage(prompt: int | None, completion: int | None) -> None:
            inflight.update(key, record.model, (prompt or 0) + (completion or 0))

        reader: SseReader | NdjsonReader
        if ndjson:
            reader = NdjsonReader(max_line_bytes=self._config.max_event_bytes, trace_id=record.trace_id)
        else:
            reader = SseReader(strip_usage_chunk=strip_usage_chunk, strip_usage_field=strip_usage_field,
                               on_usage=on_usage if self._exact_usage else None,
                               max_event_bytes=self._config.max_event_bytes, trace_id=record.trace_id)
        if record.prompt_tokens_estimate is not None:
            inflight.track(key, record.model, record.prompt_tokens_estimate, reader.stats)
        client = await request.start_stream(upstream.status, headers)
        relayed = reader if shadow is None else shadow.tap(record, reader)  # a shadowed stream keeps its text
        relay = StreamRelay(upstream, relayed, self._config.read_timeout_s, deadline_ns)
        failure: tuple[Outcome, str, str] | None = None
        stats = reader.stats
        try:
            await relay.run(client)  # the hot loop: serving/stream_relay.py
            if stats.problem is not None:
                failure = (Outcome.UPSTREAM_ERROR, stats.problem, _PROBLEMS[stats.problem])
            elif relay.past_deadline:
                failure = (Outcome.TIMEOUT, "request_timeout", "the stream did not finish within "
                           f"{self._config.request_timeout_s:g} s (serve.request_timeout_s)")
            elif reader.pending:  # the upstream ended the stream
                failure = (Outcome.UPSTREAM_ERROR, "upstream_stream_truncated",
                           "upstream ended the stream in the middle of an event")
            elif expect_done and not stats.done and stats.error is None:
                failure = (Outcome.UPSTREAM_ERROR, "upstream_stream_truncated", "upstream ended the stream without "
                           + ("its final done message" if ndjson else "its final [DONE] event"))
        except ConnectionResetError as err:  # the client went away while we wrote to it
            record.outcome = Outcome.CANCELLED
            record.error_type, record.error_message = "client_disconnected", str(err)
            upstream.close()
            return
        except ReadTimeoutError:
            failure = (Outcome.TIMEOUT, "upstream_stalled",
                       f"upstream stayed silent for {self._config.read_timeout_s:g} s in the middle of the "
                       "stream (serve.read_timeout_s)")
        except DisconnectedError as err:
            failure = (Outcome.UPSTREAM_ERROR, "upstream_stream_broken", f"upstream stream broke: {err}")
        finally:
            self._stream_stats(reader, record, start_ns)
            record.client_wait_s = relay.client_wait_ns / 1e9
        if failure is not None:
            upstream.close()
            record.outcome, record.error_type, record.error_message = failure
            log.warning(record.error_type, upstream=self._upstream, error=record.error_message)
            end = error_line if ndjson else sse_error_event
            await client.finish(end(record.error_message or "", record.error_type or "", record.trace_id))
        else:
            await client.finish(b"")

    def _stream_stats(self, reader: SseReader | NdjsonReader, record: RequestRecord, start_ns: int) -> None:
        stats = reader.stats
        record.ttft_s = stats.ttft_s(start_ns)
        # One array of doubles, not a list of float objects: the explain ring keeps the record for 10,000 requests,
        # and 64 float objects freed that much later, cold, cost about 25 us a stream (BENCHMARKS.md).
        record.inter_token_s = array("d", stats.gaps_s)
        record.prompt_tokens = stats.prompt_tokens
        record.completion_tokens = stats.completion_tokens
        record.finish_reason = stats.finish_reason
        record.response_model = stats.response_model
        record.answer_phases = stats.phases  # llama.cpp's timings, Ollama's final message
        if stats.error and record.outcome is Outcome.OK:
            record.outcome = Outcome.UPSTREAM_ERROR
            record.error_type, record.error_message = stats.error_type, stats.error

    def _read_json_body(self, data: bytes, record: RequestRecord) -> None:
        if not data.startswith(b"{"):
            return
        try:
            obj = orjson.loads(data)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("model"), str):
            record.response_model = obj["model"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("finish_reason"):
                    record.finish_reason = str(choice["finish_reason"])
        if obj.get("done") is True:  # Ollama's native answer: its counts are its own
            record.prompt_tokens, record.completion_tokens, record.finish_reason = ollama_outcome(obj)
        record.answer_phases = of_answer(obj)  # llama.cpp's timings, Ollama's durations

    def learn_models(self, names: list[str]) -> None:
        """Remember model names the upstream serves (from /v1/models), so their errors keep their label."""
        for name in names[:MAX_MODEL_LABELS]:
            if len(self._state.known_models) < MAX_MODEL_LABELS:
                self._state.known_models.add(name)

    def _in_flight_label(self, requested: str | None) -> str:
        """A request's model label before the upstream answered: a known model, else unknown or other."""
        if requested is None:
            return "unknown"
        return requested if requested in self._state.known_models else "other"

    def _model_label(self, requested: str | None, status: int) -> str:
        """The model label: the requested model once the upstream accepted it, else a bounded fallback."""
        if requested is None:
            return "unknown"
        known = self._state.known_models
        if requested in known:
            return requested
        if status < 400 and len(known) < MAX_MODEL_LABELS:
            known.add(requested)
            return requested
        return "other"

    @staticmethod
    def _refuse(request: Exchange, record: RequestRecord, refusal: Refusal, headers: dict[str, str]) -> None:
        """The sidecar's own answer to a request it does not forward."""
        record.http_status, record.outcome, record.refused = refusal.status, refusal.outcome, True
        record.error_type, record.error_message = refusal.kind, refusal.message
        headers = {**headers, "Content-Type": "application/json"}
        if refusal.retry_after_s is not None:
            headers["Retry-After"] = str(refusal.retry_after_s)
        request.respond(refusal.status, headers,
                        error_body(refusal.message, refusal.kind, refusal.status, trace_id=record.trace_id))

    def _fail(
        self, request: Exchange, record: RequestRecord, status: int, outcome: Outcome, kind: str, message: str,
        err: BaseException, headers: dict[str, str],
    ) -> None:
        record.http_status, record.outcome = status, outcome
        record.error_type, record.error_message = kind, message
        log.warning(kind, upstream=record.upstream, error=repr(err), trace_id=record.trace_id)
        request.respond(status, {**headers, "Content-Type": "application/json"},
                        error_body(message, kind, status, upstream=record.upstream, trace_id=record.trace_id))

    @staticmethod
    def _span_attributes(record: RequestRecord) -> dict[str, str | int | float | list[str]]:
        """The span's attributes of a finished request: status, outcome, GenAI response and usage, engine."""
        attributes: dict[str, str | int | float | list[str]] = {
            "http.response.status_code": record.http_status, "inferwatch.outcome": record.outcome.value,
            "inferwatch.lane": record.lane, "inferwatch.role": record.role,  # which upstream served it
        }
        if record.priority_class is not None:
            attributes["inferwatch.priority_class"] = record.priority_class
        if record.shadow_result is not None:
            attributes["inferwatch.shadow.result"] = record.shadow_result
        if record.response_model is not None:
            attributes["gen_ai.response.model"] = record.response_model
        if record.finish_reason is not None:
            attributes["gen_ai.response.finish_reasons"] = [record.finish_reason]
        if record.prompt_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = record.prompt_tokens
        if record.completion_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = record.completion_tokens
        if record.engine is not None:  # vLLM's own numbers, from its stat-logger plugin
            attributes.update(engine_attributes(record.engine))
        elif record.answer_phases is not None:  # Ollama's or llama.cpp's, from its answer
            attributes.update(answer_attributes(record.answer_phases))
        if record.outcome.is_error:
            attributes["error.type"] = record.error_type or record.outcome.value
        return attributes

    def _finish(self, record: RequestRecord, span: Span) -> None:
        """Derive the length bucket, run the observers (never let one fail the request), end the span."""
        known = record.prompt_tokens
        if known is None:  # no usage: failed, refused or cut before it; classed by the sidecar's estimate
            known = record.prompt_tokens_estimate  # (a 32k prompt that times out in prefill is still 32k)
        record.length_bucket = "unknown" if known is None else self._bucket_labels[bisect_left(self._edges, known)]
        if record.prompt_tokens and record.prompt_chars and not self._exact_usage:
            self._prompt_sizes.learn(record.model, record.prompt_chars, record.prompt_tokens)
        if record.model not in self._state.known_models and record.model != "unknown":
            record.model = "other"  # never a label value the upstream did not accept: bounded cardinality
        if span.is_recording():  # not while no span processor would see it (see Tracing)
            if record.outcome.is_error:
                span.set_status(Status(StatusCode.ERROR, record.error_type or record.outcome.value))
            span.set_attributes(self._span_attributes(record))  # one lock, not one per attribute
        run_observers(self._observers, record, span)
        span.end()

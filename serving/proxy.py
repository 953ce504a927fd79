"""The measuring reverse proxy for vLLM's OpenAI-compatible API (``/v1/*``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web
from opentelemetry.trace import Span, Status, StatusCode

from exporters.inflight import InFlightTokens
from exporters.records import Outcome, RequestRecord, length_bucket
from serving.config import ServeConfig
from serving.sse import SseReader
from serving.tracing import Tracing, span_id_hex, trace_id_hex

log = structlog.get_logger(__name__)

GENERATION_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
KNOWN_ROUTES = GENERATION_ROUTES | {"/v1/models", "/v1/embeddings", "/v1/responses"}
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade",
})
REQUEST_HEADERS_DROPPED = HOP_BY_HOP | {"host", "content-length", "accept-encoding", "traceparent", "tracestate"}
RESPONSE_HEADERS_DROPPED = HOP_BY_HOP | {"content-length", "content-encoding", "server", "date"}
TRACE_HEADER = "x-trace-id"
MAX_MODEL_LABELS = 64

Observer = Callable[[RequestRecord, Span], None]
"""Called once per request, after it ended and before its span ends (metrics, logs, health)."""


def classify_status(status: int) -> Outcome:
    """Map an upstream HTTP status to an outcome class."""
    if status < 400:
        return Outcome.OK
    if status in (429, 503):
        return Outcome.OVERLOADED
    if status < 500:
        return Outcome.CLIENT_ERROR
    return Outcome.UPSTREAM_ERROR


def error_body(message: str, kind: str, status: int, **extra: Any) -> bytes:
    """An OpenAI-style JSON error body."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status, **extra}}).encode()


def prompt_hash(payload: dict[str, Any], record: RequestRecord) -> None:
    """Store a short SHA-256 of the prompt (or messages) and its length in characters, never the text."""
    prompt = payload.get("messages", payload.get("prompt"))
    if prompt is None:
        return
    if isinstance(prompt, list):
        text = "".join(
            str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt
        )
    else:
        text = str(prompt)
    record.prompt_hash = hashlib.sha256(orjson.dumps(prompt)).hexdigest()[:16]
    record.prompt_chars = len(text)


@dataclass(slots=True)
class Outgoing:
    """The request as it will be sent upstream, and what the client asked for."""

    body: bytes
    payload: dict[str, Any] | None = None
    model: str | None = None
    stream: bool = False
    client_usage: bool = False
    client_continuous: bool = False


@dataclass
class ProxyState:
    """Mutable state shared by the requests of one proxy."""

    known_models: set[str] = field(default_factory=set)


class Proxy:
    """Forwards ``/v1/*`` to the upstream, streaming included, and measures every request."""

    def __init__(
        self,
        config: ServeConfig,
        session: Callable[[], aiohttp.ClientSession],
        tracing: Tracing,
        observers: list[Observer],
        inflight: InFlightTokens,
        live_usage: bool = True,
        capture_prompt_hash: bool = False,
    ) -> None:
        self._config = config
        self._session = session
        self._tracing = tracing
        self._observers = observers
        self._inflight = inflight
        self._live_usage = live_usage
        self._capture_prompt_hash = capture_prompt_hash
        self._upstream = config.upstream.rstrip("/")
        self._edges = tuple(config.length_bucket_edges)
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
        )
        self._state = ProxyState()
        self._tokenize_timeout = aiohttp.ClientTimeout(total=2.0)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Proxy one request; never raises except on cancellation."""
        start_ns = time.perf_counter_ns()
        route = request.path if request.path in KNOWN_ROUTES else "other"
        span = self._tracing.start_request_span(
            f"{request.method} {route}", request.headers,
            {"http.request.method": request.method, "url.path": request.path, "server.address": self._upstream},
        )
        record = RequestRecord(
            trace_id=trace_id_hex(span), span_id=span_id_hex(span), route=route,
            upstream=self._upstream, start_unix=time.time(),
        )
        try:
            return await self._forward(request, record, span, start_ns)
        except asyncio.CancelledError:
            record.outcome = Outcome.CANCELLED
            record.error_type = "client_disconnected"
            raise
        finally:
            record.e2e_s = (time.perf_counter_ns() - start_ns) / 1e9
            self._inflight.remove(record.span_id)
            self._finish(record, span)

    async def _forward(
        self, request: web.Request, record: RequestRecord, span: Span, start_ns: int
    ) -> web.StreamResponse:
        trace_headers = {TRACE_HEADER: record.trace_id}
        try:
            outgoing = self._prepare(request.method, record, await request.read())
        except ValueError as err:
            return self._refuse(record, 400, f"malformed JSON body: {err}", "invalid_request_error", trace_headers)
        tokenizing = None
        if outgoing.payload is not None and not outgoing.stream and self._live_usage and outgoing.model:
            tokenizing = asyncio.create_task(self._count_prompt(outgoing.payload, record))
        try:
            return await self._send(request, record, span, start_ns, outgoing, trace_headers)
        finally:
            if tokenizing is not None and not tokenizing.done():
                tokenizing.cancel()

    def _prepare(self, method: str, record: RequestRecord, body: bytes) -> Outgoing:
        """Read a generation request's JSON and ask the upstream for the usage data we measure with.

        Raises:
            ValueError: the body of a generation request is not a JSON object.
        """
        outgoing = Outgoing(body)
        if method != "POST" or record.route not in GENERATION_ROUTES:
            return outgoing
        payload = orjson.loads(body)  # orjson.JSONDecodeError is a ValueError
        if not isinstance(payload, dict):
            raise ValueError("the body must be a JSON object")
        outgoing.payload = payload
        model = payload.get("model")
        outgoing.model = model if isinstance(model, str) else None
        record.model = outgoing.model or "unknown"
        outgoing.stream = record.stream = bool(payload.get("stream"))
        if self._capture_prompt_hash:
            prompt_hash(payload, record)
        if outgoing.stream:
            options = payload.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            outgoing.client_usage = bool(options.get("include_usage"))
            outgoing.client_continuous = bool(options.get("continuous_usage_stats"))
            options["include_usage"] = True
            if self._live_usage:
                options["continuous_usage_stats"] = True
            payload["stream_options"] = options
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

    async def _send(
        self, request: web.Request, record: RequestRecord, span: Span, start_ns: int, outgoing: Outgoing,
        trace_headers: dict[str, str],
    ) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_HEADERS_DROPPED}
        headers["Accept-Encoding"] = "identity"
        self._tracing.inject(span, headers)
        url = self._upstream + request.path_qs
        try:
            async with self._session().request(
                request.method, url, data=outgoing.body or None, headers=headers, timeout=self._timeout,
                allow_redirects=False,
            ) as upstream:
                record.accept_s = (time.perf_counter_ns() - start_ns) / 1e9
                record.http_status = upstream.status
                record.outcome = classify_status(upstream.status)
                record.model = self._model_label(outgoing.model, upstream.status)
                response_headers = {
                    k: v for k, v in upstream.headers.items() if k.lower() not in RESPONSE_HEADERS_DROPPED
                }
                response_headers.update(trace_headers)
                is_sse = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
                if outgoing.stream and is_sse:
                    return await self._stream(
                        request, upstream, response_headers, record, start_ns,
                        strip_usage_chunk=not outgoing.client_usage,
                        strip_usage_field=self._live_usage and not outgoing.client_continuous,
                    )
                data = await upstream.read()
                record.ttft_s = (time.perf_counter_ns() - start_ns) / 1e9
                self._read_json_body(data, record)
                return web.Response(body=data, status=upstream.status, headers=response_headers)
        except (aiohttp.ServerTimeoutError, TimeoutError) as err:
            return self._fail(record, 504, Outcome.TIMEOUT, "upstream_timeout",
                              f"upstream {self._upstream} did not answer within the timeout", err, trace_headers)
        except aiohttp.ClientError as err:
            return self._fail(record, 502, Outcome.UPSTREAM_ERROR, "upstream_unreachable",
                              f"upstream {self._upstream} is unreachable: {err}", err, trace_headers)

    async def _stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        headers: dict[str, str],
        record: RequestRecord,
        start_ns: int,
        *,
        strip_usage_chunk: bool,
        strip_usage_field: bool,
    ) -> web.StreamResponse:
        key, inflight = record.span_id, self._inflight

        def on_usage(prompt: int | None, completion: int | None) -> None:
            inflight.update(key, record.model, (prompt or 0) + (completion or 0))

        reader = SseReader(strip_usage_chunk=strip_usage_chunk, strip_usage_field=strip_usage_field,
                           on_usage=on_usage)
        response = web.StreamResponse(status=upstream.status, headers=headers)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                out = reader.feed(chunk, time.perf_counter_ns())
                if out:
                    await response.write(out)
            rest = reader.flush()
            if rest:
                await response.write(rest)
            await response.write_eof()
        except ConnectionResetError as err:
            record.outcome = Outcome.CANCELLED
            record.error_type, record.error_message = "client_disconnected", str(err)
            upstream.close()
        except (aiohttp.ServerTimeoutError, TimeoutError) as err:
            record.outcome = Outcome.TIMEOUT
            record.error_type, record.error_message = "upstream_stalled", str(err) or "read timeout"
            upstream.close()
            await self._end_stream_with_error(response, record, "upstream stalled past the read timeout")
        except aiohttp.ClientError as err:
            record.outcome = Outcome.UPSTREAM_ERROR
            record.error_type, record.error_message = "upstream_stream_broken", str(err)
            upstream.close()
            await self._end_stream_with_error(response, record, f"upstream stream broke: {err}")
        finally:
            self._stream_stats(reader, record, start_ns)
        return response

    @staticmethod
    async def _end_stream_with_error(response: web.StreamResponse, record: RequestRecord, message: str) -> None:
        event = {"error": {"message": message, "type": record.error_type, "trace_id": record.trace_id}}
        try:
            await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await response.write_eof()
        except ConnectionResetError:
            pass

    def _stream_stats(self, reader: SseReader, record: RequestRecord, start_ns: int) -> None:
        stats = reader.stats
        record.ttft_s = stats.ttft_s(start_ns)
        record.inter_token_s = stats.gaps_s
        record.prompt_tokens = stats.prompt_tokens
        record.completion_tokens = stats.completion_tokens
        record.finish_reason = stats.finish_reason
        if stats.error and record.outcome is Outcome.OK:
            record.outcome = Outcome.UPSTREAM_ERROR
            record.error_type, record.error_message = "upstream_error_event", stats.error

    def _read_json_body(self, data: bytes, record: RequestRecord) -> None:
        if not data.startswith(b"{"):
            return
        try:
            obj = orjson.loads(data)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        usage = obj.get("usage")
        if isinstance(usage, dict):
            record.prompt_tokens = usage.get("prompt_tokens")
            record.completion_tokens = usage.get("completion_tokens")
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("finish_reason"):
                    record.finish_reason = str(choice["finish_reason"])
        if record.outcome is not Outcome.OK:
            error = obj.get("error")
            message = error.get("message") if isinstance(error, dict) else obj.get("message", error)
            record.error_type = f"http_{record.http_status}"
            record.error_message = str(message)[:500] if message is not None else None

    def learn_models(self, names: list[str]) -> None:
        """Remember model names the upstream serves (from /v1/models), so their errors keep their label."""
        for name in names[:MAX_MODEL_LABELS]:
            if len(self._state.known_models) < MAX_MODEL_LABELS:
                self._state.known_models.add(name)

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

    def _refuse(
        self, record: RequestRecord, status: int, message: str, kind: str, headers: dict[str, str]
    ) -> web.Response:
        record.http_status, record.outcome = status, Outcome.CLIENT_ERROR
        record.error_type, record.error_message = kind, message
        return web.Response(body=error_body(message, kind, status, trace_id=record.trace_id), status=status,
                            headers=headers, content_type="application/json")

    def _fail(
        self, record: RequestRecord, status: int, outcome: Outcome, kind: str, message: str,
        err: BaseException, headers: dict[str, str],
    ) -> web.Response:
        record.http_status, record.outcome = status, outcome
        record.error_type, record.error_message = kind, message
        log.warning(kind, upstream=self._upstream, error=repr(err), trace_id=record.trace_id)
        body = error_body(message, kind, status, upstream=self._upstream, trace_id=record.trace_id)
        return web.Response(body=body, status=status, headers=headers, content_type="application/json")

    def _finish(self, record: RequestRecord, span: Span) -> None:
        """Derive the length bucket, run the observers (never let one fail the request), end the span."""
        record.length_bucket = length_bucket(record.prompt_tokens, self._edges)
        if record.model not in self._state.known_models and record.model != "unknown":
            record.model = "other"  # never a label value the upstream did not accept: bounded cardinality
        span.set_attribute("http.response.status_code", record.http_status)
        span.set_attribute("inferwatch.outcome", record.outcome.value)
        span.set_attribute("gen_ai.request.model", record.model)
        if record.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", record.prompt_tokens)
        if record.completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", record.completion_tokens)
        if record.outcome.is_error:
            span.set_status(Status(StatusCode.ERROR, record.error_type or record.outcome.value))
        for observer in self._observers:
            try:
                observer(record, span)
            except Exception:  # an observer must never break the request path
                log.exception("request_observer_failed", observer=getattr(observer, "__name__", repr(observer)))
        span.end()

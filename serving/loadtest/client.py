"""One request, measured from the client's side: status, TTFT, gaps between content chunks, e2e, usage, trace id.

The time to the first content chunk and the gaps come from ``SseReader``, the same reader the
sidecar measures streams with; token counts come from the answer's ``usage``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from serving.bounded_read import read_at_most
from serving.sse import SseReader

TRACE_HEADER = "x-trace-id"
DETAIL_CHARS = 200
ERROR_BODY_BYTES = 64 * 1024
"""The most of a failed request's answer read for its error message."""


@dataclass(slots=True)
class RequestResult:
    """One request as the client saw it; ``error`` is None when it succeeded.

    ``sent_s``, ``due_s`` and ``lag_s`` are seconds after the start of the run (of the step for
    ``due_s``); ``asked_prompt_tokens`` is the calibrated prompt length, when the prompt was
    generated at one; ``prompt_tokens`` and ``completion_tokens`` are the answer's usage.
    ``retry`` is how many failed requests of the same closed-loop worker came right before this
    one (0: not a retry) and ``backoff_s`` the pause the worker took before sending it;
    ``retry_after_s`` is a failed answer's ``Retry-After`` in seconds.
    """

    index: int
    due_s: float = 0.0
    lag_s: float = 0.0
    sent_s: float = 0.0
    step: str = ""
    model: str = ""
    bucket: str = ""
    asked_prompt_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    detail: str = ""
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    trace_id: str | None = None
    retry: int = 0
    backoff_s: float = 0.0
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the request succeeded."""
        return self.error is None

    @property
    def first_token_s(self) -> float | None:
        """When its first content chunk arrived, in seconds after the start of the run (None without one)."""
        return None if self.ttft_s is None else self.sent_s + self.ttft_s

    def to_dict(self) -> dict[str, Any]:
        """The raw sample, JSON-ready (seconds)."""
        return {
            "index": self.index, "step": self.step, "model": self.model, "bucket": self.bucket,
            "sent_s": self.sent_s, "due_s": self.due_s, "lag_s": self.lag_s, "status": self.status,
            "error": self.error, "detail": self.detail, "ttft_s": self.ttft_s, "itl_s": list(self.itl_s),
            "e2e_s": self.e2e_s, "asked_prompt_tokens": self.asked_prompt_tokens,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "trace_id": self.trace_id, "retry": self.retry, "backoff_s": self.backoff_s,
        }


async def send_request(
    session: aiohttp.ClientSession, url: str, payload: dict[str, Any], *, timeout_s: float, index: int = 0
) -> RequestResult:
    """Post one request and measure it; never raises except on cancellation."""
    result = RequestResult(index=index)
    start_ns = time.perf_counter_ns()
    try:
        async with session.post(url, data=orjson.dumps(payload), headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            result.status = response.status
            result.trace_id = response.headers.get(TRACE_HEADER)
            if response.status >= 400:
                result.error = str(response.status)
                result.retry_after_s = _seconds(response.headers.get("Retry-After"))
                body = await read_at_most(response.content, ERROR_BODY_BYTES)
                result.detail = _error_detail(body[:ERROR_BODY_BYTES])
            elif payload.get("stream"):
                await _read_stream(response, result, start_ns)
            else:
                _read_body(await response.read(), result)
    except TimeoutError:
        result.error, result.detail = "timeout", f"no complete answer within {timeout_s:g} s"
    except aiohttp.ClientConnectorError as err:
        result.error, result.detail = "connection_error", str(err)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as err:
        result.error, result.detail = "disconnected", str(err) or type(err).__name__
    except aiohttp.ClientError as err:
        result.error, result.detail = "client_error", f"{type(err).__name__}: {err}"
    except OSError as err:
        result.error, result.detail = "connection_error", f"{type(err).__name__}: {err}"
    result.e2e_s = (time.perf_counter_ns() - start_ns) / 1e9
    return result


async def _read_stream(response: aiohttp.ClientResponse, result: RequestResult, start_ns: int) -> None:
    reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
    async for data in response.content.iter_any():
        reader.feed(data, time.perf_counter_ns())
    reader.flush()
    stats = reader.stats
    result.ttft_s = stats.ttft_s(start_ns)
    result.itl_s = stats.gaps_s
    result.prompt_tokens = stats.prompt_tokens
    result.completion_tokens = stats.completion_tokens
    if stats.error is not None:
        result.error, result.detail = "stream_error", stats.error[:DETAIL_CHARS]
    elif not stats.done:
        result.error, result.detail = "incomplete_stream", "the stream ended without data: [DONE]"


def _read_body(raw: bytes, result: RequestResult) -> None:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        result.error, result.detail = "bad_response", f"not JSON: {raw[:80]!r}"
        return
    usage = body.get("usage") if isinstance(body, dict) else None
    if isinstance(usage, dict):
        result.prompt_tokens = usage.get("prompt_tokens")
        result.completion_tokens = usage.get("completion_tokens")


def _seconds(header: str | None) -> float | None:
    """A ``Retry-After`` given in seconds (an HTTP date is not followed: None)."""
    try:
        value = float(header) if header is not None else None
    except ValueError:
        return None
    return value if value is not None and 0 <= value < 86_400 else None


def _error_detail(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:DETAIL_CHARS].decode("utf-8", "replace").strip()
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else (error or body)
    return str(message)[:DETAIL_CHARS]

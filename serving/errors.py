"""The error answers a client gets from the sidecar: always OpenAI's ``{"error": {...}}`` with the trace id.

Three shapes, one per moment a request can fail:

- before anything was sent to the client, the sidecar's own refusal or failure
  (:func:`error_body`, e.g. 413, 502, 503, 504), on ``/v1/*`` and everywhere else (an admin
  refusal, an unknown path: serving/endpoints.py), always with a ``trace_id``;
- an upstream 4xx/5xx answer, rewritten so it always parses as JSON and names the trace id
  (:func:`upstream_error_body`; vLLM's own JSON errors keep every field they had);
- after a stream has started, a final SSE event (:func:`sse_error_event`), since the status
  line has already gone out.
"""

from __future__ import annotations

import html
import re
from typing import Any

import orjson

_TAGS = re.compile(rb"<[^>]*>")
_SPACES = re.compile(rb"\s+")
_PLAIN_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9 _.\-]{0,63}")
MAX_QUOTED_BODY = 300
"""Characters of a non-JSON upstream body quoted in the rewritten error message."""


def error_body(message: str, kind: str, status: int, **extra: Any) -> bytes:
    """An OpenAI-style JSON error body."""
    return orjson.dumps({"error": {"message": message, "type": kind, "code": status, **extra}})


def upstream_error_type(value: object, status: object) -> str:
    """The ``error.type`` of an upstream's error answer or event, the same in the answer, record, span and metrics.

    The upstream's own ``type`` when it is a short plain word (vLLM's: ``NotFoundError``,
    ``ServiceUnavailableError``, ...), else the class of its status: ``overloaded`` (429, 503),
    ``invalid_request_error`` (another 4xx) or ``upstream_error`` (5xx, or no status).
    """
    if isinstance(value, str) and _PLAIN_TYPE.fullmatch(value):
        return value
    return _kind(status if isinstance(status, int) and 400 <= status < 600 else 500)


def upstream_error_body(data: bytes, status: int, trace_id: str) -> tuple[bytes, str | None, str]:
    """Rewrite an upstream error answer as OpenAI's error object with ``trace_id``; also return its message
    and its ``error.type``.

    A JSON ``{"error": {...}}`` keeps all its fields (``trace_id`` added, ``type`` filled in when
    missing or not a short plain word: :func:`upstream_error_type`); a flat ``{"message": ...,
    "type": ...}`` (older vLLM) moves under ``error``; anything else (an HTML page from a load
    balancer, plain text, nothing) becomes a message quoting the start of the body with its tags
    stripped.
    """
    obj: Any = None
    if data[:1] in (b"{", b" ", b"\n"):
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict):
            fields = dict(error)
        elif isinstance(error, str):
            fields = {"message": error}
        else:
            fields = {k: v for k, v in obj.items() if k != "object"}
        fields.setdefault("message", f"upstream answered HTTP {status}")
        fields["type"] = upstream_error_type(fields.get("type"), status)
        fields.setdefault("code", status)
        fields["trace_id"] = trace_id
        message = fields["message"]
        return orjson.dumps({"error": fields}), str(message) if message is not None else None, fields["type"]
    quoted = _quote(data)
    message = f"upstream answered HTTP {status}" + (f": {quoted}" if quoted else " with an empty body")
    kind = _kind(status)
    return error_body(message, kind, status, trace_id=trace_id), message, kind


def sse_error_event(message: str, kind: str, trace_id: str) -> bytes:
    """The final SSE event that tells a client its stream failed after it had started."""
    return b"data: " + orjson.dumps({"error": {"message": message, "type": kind, "trace_id": trace_id}}) + b"\n\n"


def _kind(status: int) -> str:
    if status in (429, 503):
        return "overloaded"
    return "invalid_request_error" if status < 500 else "upstream_error"


def _quote(data: bytes) -> str:
    text = _SPACES.sub(b" ", _TAGS.sub(b" ", data[: MAX_QUOTED_BODY * 8])).strip()
    quoted = html.unescape(text.decode("utf-8", "replace"))
    return quoted if len(quoted) <= MAX_QUOTED_BODY else quoted[: MAX_QUOTED_BODY - 1] + "…"

"""Incremental reader of an NDJSON stream (Ollama's ``/api/generate`` and ``/api/chat``): forwards whole lines as
they complete and measures them, as :mod:`serving.sse` does for SSE.

Pure: fed raw network chunks with their arrival time, it returns the bytes to forward now. Each line is one JSON
object: a part (``done: false``) carrying a piece of text in ``response`` (generate) or ``message.content`` /
``thinking`` / ``tool_calls`` (chat), or the final message (``done: true``) with ``done_reason``, the token counts
and Ollama's durations (exporters/engine_phases.py), or an error (``{"error": "..."}``). A line that is not a JSON
object, or longer than ``max_line_bytes``, sets :attr:`~serving.sse.StreamStats.problem` and nothing more is
forwarded (the proxy ends the stream with its own error line, :func:`error_line`). Error lines get the trace id.
"""

from __future__ import annotations

from typing import Any

import orjson

from exporters.engine_phases import from_ollama, ollama_outcome
from serving.errors import upstream_error_type
from serving.sse import StreamReader

CONTENT_TYPE = "application/x-ndjson"


def error_line(message: str, kind: str, trace_id: str) -> bytes:
    """The proxy's own last line of a failed stream: Ollama's error shape, with the type and trace id."""
    return orjson.dumps({"error": message, "type": kind, "trace_id": trace_id}) + b"\n"


class NdjsonReader(StreamReader):
    """Splits a byte stream into lines, measures them and decides what to forward."""

    __slots__ = ("_max_line_bytes", "_trace_id")

    def __init__(self, *, max_line_bytes: int | None = None, trace_id: str | None = None) -> None:
        super().__init__()
        self._max_line_bytes = max_line_bytes
        self._trace_id = trace_id

    def feed(self, data: bytes, now_ns: int) -> bytes:
        """Take a network chunk that arrived at ``now_ns``; return the complete lines to forward."""
        if self.stats.problem is not None:
            return b""
        buffer = self._buffer + data if self._buffer else data
        end = buffer.rfind(b"\n") + 1
        self._buffer = buffer[end:]
        limit = self._max_line_bytes
        if limit is not None and len(self._buffer) > limit:
            self.stats.problem, self._buffer = "upstream_event_too_large", b""
            return b""
        if not end:
            return b""
        out: list[bytes] = []
        for line in buffer[:end].split(b"\n")[:-1]:
            if limit is not None and len(line) > limit:
                self.stats.problem = "upstream_event_too_large"
                break
            forwarded = self._line(line, now_ns)
            if self.stats.problem is not None:
                break
            out.append(forwarded)
        return b"".join(out)

    def take_event(self, data: bytes, start: int, end: int, now_ns: int) -> bool:
        """No shortcut: every read goes through :meth:`feed` (see serving.stream_relay.PieceReader)."""
        return False

    def _line(self, line: bytes, now_ns: int) -> bytes:
        if not line.strip():
            return line + b"\n"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            self.stats.undecodable_events += 1
            self.stats.problem = "upstream_malformed_event"
            return b""
        stats = self.stats
        if stats.response_model is None and isinstance(obj.get("model"), str):
            stats.response_model = obj["model"]
        if "error" in obj:
            return self._error(obj)
        if obj.get("done") is True:
            stats.done = True
            stats.prompt_tokens, stats.completion_tokens, stats.finish_reason = ollama_outcome(obj)
            stats.phases = from_ollama(obj)
        if _has_content(obj):
            stats.content_ns.append(now_ns)
        return line + b"\n"

    def _error(self, obj: dict[str, Any]) -> bytes:
        stats = self.stats
        error = obj["error"]
        stats.error = error if isinstance(error, str) else str(error)
        stats.error_type = upstream_error_type(obj.get("type"), None)
        if self._trace_id is None:
            return orjson.dumps(obj) + b"\n"
        return orjson.dumps({**obj, "type": stats.error_type, "trace_id": self._trace_id}) + b"\n"



def _has_content(obj: dict[str, Any]) -> bool:
    """Whether a part carries generated text (or reasoning, or a tool call): a token for TTFT and the gaps."""
    if obj.get("response") or obj.get("thinking"):
        return True
    message = obj.get("message")
    return isinstance(message, dict) and bool(
        message.get("content") or message.get("thinking") or message.get("tool_calls"))

"""Incremental reader of an OpenAI-style SSE stream: forwards events as they complete and measures them.

Pure: fed raw network chunks with their arrival time, it returns the bytes to forward now.
It finds the first content chunk, the gaps between content chunks, ``usage`` and
``finish_reason``, and removes what the sidecar added to the upstream request: the final
usage-only chunk (``stream_options.include_usage``) and the per-chunk ``usage`` field
(``continuous_usage_stats``) when the client did not ask for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_SEPARATORS = (b"\n\n", b"\r\n\r\n")


@dataclass(slots=True)
class StreamStats:
    """What was seen in a stream so far."""

    first_content_ns: int | None = None
    last_content_ns: int | None = None
    content_events: int = 0
    gaps_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    undecodable_events: int = 0
    done: bool = False


def _has_content(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    return bool(choice.get("text"))


class SseReader:
    """Splits a byte stream into SSE events, measures them and decides what to forward."""

    def __init__(
        self,
        *,
        strip_usage_chunk: bool,
        strip_usage_field: bool,
        on_usage: Callable[[int | None, int | None], None] | None = None,
    ) -> None:
        self.stats = StreamStats()
        self._buffer = b""
        self._strip_usage_chunk = strip_usage_chunk
        self._strip_usage_field = strip_usage_field
        self._on_usage = on_usage

    def feed(self, data: bytes, now_ns: int) -> bytes:
        """Take a network chunk that arrived at ``now_ns``; return the complete events to forward."""
        self._buffer += data
        out: list[bytes] = []
        while True:
            cut, sep_len = self._next_boundary()
            if cut < 0:
                break
            event = self._buffer[: cut + sep_len]
            self._buffer = self._buffer[cut + sep_len :]
            forwarded = self._event(event, event[:cut], now_ns)
            if forwarded:
                out.append(forwarded)
        return b"".join(out)

    def flush(self) -> bytes:
        """Return whatever incomplete event is left at the end of the stream, unchanged."""
        rest, self._buffer = self._buffer, b""
        return rest

    def _next_boundary(self) -> tuple[int, int]:
        best, best_len = -1, 0
        for sep in _SEPARATORS:
            index = self._buffer.find(sep)
            if index >= 0 and (best < 0 or index < best):
                best, best_len = index, len(sep)
        return best, best_len

    def _event(self, raw: bytes, body: bytes, now_ns: int) -> bytes:
        data_lines = [line[5:].lstrip() for line in body.splitlines() if line.startswith(b"data:")]
        if not data_lines:
            return raw
        payload = b"\n".join(data_lines)
        if payload.strip() == b"[DONE]":
            self.stats.done = True
            return raw
        try:
            obj = json.loads(payload)
        except ValueError:
            self.stats.undecodable_events += 1
            return raw
        if not isinstance(obj, dict):
            return raw
        return self._chunk(raw, obj, now_ns)

    def _chunk(self, raw: bytes, obj: dict[str, Any], now_ns: int) -> bytes:
        stats = self.stats
        if "error" in obj and not obj.get("choices"):
            error = obj["error"]
            stats.error = str(error.get("message") if isinstance(error, dict) else error)
        choices = obj.get("choices") or []
        if any(isinstance(c, dict) and _has_content(c) for c in choices):
            if stats.last_content_ns is not None:
                stats.gaps_s.append((now_ns - stats.last_content_ns) / 1e9)
            else:
                stats.first_content_ns = now_ns
            stats.last_content_ns = now_ns
            stats.content_events += 1
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                stats.finish_reason = str(choice["finish_reason"])
        usage = obj.get("usage")
        if isinstance(usage, dict):
            stats.prompt_tokens = usage.get("prompt_tokens", stats.prompt_tokens)
            stats.completion_tokens = usage.get("completion_tokens", stats.completion_tokens)
            if self._on_usage is not None:
                self._on_usage(stats.prompt_tokens, stats.completion_tokens)
            if not choices:
                return b"" if self._strip_usage_chunk else raw
            if self._strip_usage_field:
                del obj["usage"]
                return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
        return raw

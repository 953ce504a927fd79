"""An engine's own account of one request, read from its answer: Ollama's final message, llama.cpp's ``timings``.

vLLM's per-request numbers come from its stat-logger plugin (exporters/engine_stats_wire.py); Ollama and
llama.cpp put theirs in the answer itself, so the proxy reads them there and the record carries them as
:class:`~exporters.records.AnswerPhases`, joined to the trace like the plugin's: log record fields, span attributes, the
per-request engine histograms and ``inferwatch explain``'s parts.

- Ollama (``/api/generate``, ``/api/chat``; the final message, ``done: true``, streamed or not): durations in
  integer nanoseconds, ``load_duration`` (loading the model: a cold start), ``prompt_eval_duration`` (prefill),
  ``eval_duration`` (decode), ``total_duration``; ``prompt_eval_count`` and ``eval_count`` tokens. Ollama leaves
  out a field that is zero (Go's ``omitempty``): absent counts as 0 here once the message is a final one.
- llama.cpp (``/completion``, ``/v1/completions``, ``/v1/chat/completions``; the answer, or the stream's usage
  chunk): ``timings`` with ``prompt_ms`` (prefill), ``predicted_ms`` (decode), ``prompt_n``, ``predicted_n`` and
  ``cache_n`` (prompt tokens reused from the cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporters.records import AnswerPhases

OLLAMA = "ollama"
LLAMACPP = "llamacpp"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def from_ollama(message: Mapping[str, Any]) -> AnswerPhases | None:
    """The phases of Ollama's final message (``done: true``); None for any other message."""
    if message.get("done") is not True:
        return None
    ns = {key: _count(message.get(key, 0)) for key in
          ("load_duration", "prompt_eval_duration", "eval_duration", "total_duration")}
    if any(value is None for value in ns.values()) or not ns["total_duration"]:
        return None  # not numbers, or no account at all (a load-only answer)

    def seconds(key: str) -> float:
        return (ns[key] or 0) / 1e9

    return AnswerPhases(
        OLLAMA, seconds("prompt_eval_duration"), seconds("eval_duration"), seconds("load_duration"),
        seconds("total_duration"), _count(message.get("prompt_eval_count", 0)), None,
        _count(message.get("eval_count", 0)),
    )


def from_llamacpp(timings: Any) -> AnswerPhases | None:
    """The phases of a llama.cpp ``timings`` object; None when it is not one."""
    if not isinstance(timings, Mapping):
        return None
    prompt_ms, predicted_ms = _number(timings.get("prompt_ms")), _number(timings.get("predicted_ms"))
    if prompt_ms is None or predicted_ms is None:
        return None
    cached = _count(timings.get("cache_n"))
    prompt = _count(timings.get("prompt_n"))
    return AnswerPhases(
        LLAMACPP, prompt_ms / 1000.0, predicted_ms / 1000.0, prompt_tokens=None if prompt is None else prompt
        + (cached or 0), cached_tokens=cached, generated_tokens=_count(timings.get("predicted_n")),
    )


def of_answer(answer: Mapping[str, Any]) -> AnswerPhases | None:
    """The phases an answer (a JSON body, a final stream message or usage chunk) carries, from either engine."""
    if "timings" in answer:
        return from_llamacpp(answer["timings"])
    return from_ollama(answer) if "total_duration" in answer else None


def ollama_outcome(message: Mapping[str, Any]) -> tuple[int | None, int | None, str | None]:
    """``(prompt tokens, completion tokens, done_reason)`` of Ollama's final message (absent counts are 0)."""
    reason = message.get("done_reason")
    return (_count(message.get("prompt_eval_count", 0)), _count(message.get("eval_count", 0)),
            reason if isinstance(reason, str) and reason else None)

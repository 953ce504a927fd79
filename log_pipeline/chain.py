"""structlog processors and configuration: schema version, redaction, and a logger onto the sink.

Processors have structlog's shape ``(logger, method_name, event_dict) -> event_dict``. The
request chain (:func:`request_logger`) ends in the :class:`~log_pipeline.sink.RecordSink`, which
samples, counts and archives; :func:`configure_logging` sets up the sidecar's own diagnostic
logs as JSON lines on stderr. Serving calls each once at startup.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from log_pipeline.records import SCHEMA_VERSION
from log_pipeline.sink import RecordSink

REDACTED = "[redacted]"
SECRET_KEYS = frozenset({
    "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api_key", "api-key",
    "password", "token", "secret",
})
"""Keys whose values never reach a log, at any depth, compared case-insensitively."""
TEXT_KEYS = frozenset({"prompt", "messages", "completion", "choices", "input", "content"})
"""Keys holding prompt or completion text, removed from every event."""


def add_schema_version(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Stamp the log schema version unless the event carries one."""
    event_dict.setdefault("schema_version", SCHEMA_VERSION)
    return event_dict


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: REDACTED if str(k).lower() in SECRET_KEYS else _scrub(v)
            for k, v in value.items()
            if str(k).lower() not in TEXT_KEYS
        }
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def redact(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Replace secrets (Authorization, cookies, API keys) and drop prompt/completion text, at any depth."""
    for key in list(event_dict):
        lowered = str(key).lower()
        if lowered in TEXT_KEYS:
            del event_dict[key]
        elif lowered in SECRET_KEYS:
            event_dict[key] = REDACTED
        elif isinstance(event_dict[key], dict | list | tuple):
            event_dict[key] = _scrub(event_dict[key])
    return event_dict


class SinkLogger:
    """The wrapped logger of the request chain: every method hands the event dict to the sink."""

    def __init__(self, sink: RecordSink) -> None:
        self._sink = sink

    def msg(self, **event: Any) -> bool:
        """Offer one event to the sink; False when it was kept but could not be queued."""
        return self._sink.offer(event)

    info = warning = error = critical = debug = msg


REQUEST_PROCESSORS: tuple[Processor, ...] = (redact, add_schema_version)


def request_logger(sink: RecordSink) -> Any:
    """A bound logger whose ``info("request", **fields)`` goes, redacted and versioned, to ``sink``."""
    return structlog.wrap_logger(
        SinkLogger(sink), processors=list(REQUEST_PROCESSORS), wrapper_class=structlog.BoundLogger,
    )


def configure_logging(
    level: str = "info", *, stream: TextIO | None = None, extra: Iterable[Processor] = ()
) -> None:
    """Configure structlog for the sidecar's diagnostics: JSON lines on ``stream`` (stderr)."""
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        *extra,
        redact,
        add_schema_version,
        structlog.processors.format_exc_info,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.JSONRenderer(sort_keys=False),
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=True,
    )

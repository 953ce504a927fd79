"""The sidecar's own diagnostics: structlog processors (schema version, redaction) and their setup.

Processors have structlog's shape ``(logger, method_name, event_dict) -> event_dict``.
:func:`configure_logging`, called once by ``inferwatch serve``, makes every diagnostic, from
structlog and from the standard library's ``logging`` (the rule engine, aiohttp, apscheduler)
alike, one JSON line on stderr carrying the trace id of the request being served (bound by the
proxy in structlog's context variables) and passed through :func:`redact`. Request records do
not come this way: they are built field by field and go to the
:class:`~log_pipeline.sink.RecordSink`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from log_pipeline.records import SCHEMA_VERSION

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


def configure_logging(
    level: str = "info", *, stream: TextIO | None = None, extra: Iterable[Processor] = (), cache: bool = True,
    chatty: Iterable[str] = (),
) -> None:
    """Send structlog and standard-library logs as redacted JSON lines to ``stream`` (stderr).

    ``cache`` lets each module-level logger settle its configuration on first use (fast; what
    ``serve`` wants); tests that configure more than once turn it off. The standard-library
    loggers named in ``chatty`` (a scheduler's line per job run) speak only from ``warning`` up,
    unless ``level`` is ``debug``.
    """
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        *extra,
        redact,
        add_schema_version,
        structlog.processors.format_exc_info,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    numeric_level = logging.getLevelName(level.upper())
    out = stream or sys.stderr
    structlog.configure(
        processors=[*shared, structlog.processors.JSONRenderer(sort_keys=False)],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=cache,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, structlog.stdlib.ExtraAdder(), *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.JSONRenderer(sort_keys=False)],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric_level)
    for name in chatty:
        logging.getLogger(name).setLevel(logging.NOTSET if numeric_level <= logging.DEBUG else logging.WARNING)

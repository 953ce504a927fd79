"""Request records as OpenTelemetry log records over OTLP/HTTP (``logs.otlp_endpoint``).

The records are the ones the archive keeps (every error, slow requests and the success sample).
Each becomes one log record whose own ``trace_id`` and ``span_id`` fields are the request span's,
so a backend (Loki 3, Elastic, any OpenTelemetry Collector) can jump from a trace to its line. The
record's fields become attributes under their archive names; the body is a one-line summary.
Batching, the bounded queue and the drop counters are :class:`log_pipeline.shipper.RecordShipper`'s;
this module only encodes and sends, with OpenTelemetry's own OTLP/HTTP exporter (so the
``OTEL_EXPORTER_OTLP_LOGS_*`` variables for headers, TLS and compression apply).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry

from log_pipeline.config import LogConfig
from log_pipeline.shipper import RecordShipper

SCOPE = InstrumentationScope("inferwatch.requests")
EVENT_NAME = "inferwatch.request"
_SEVERITY = {"info": SeverityNumber.INFO, "warning": SeverityNumber.WARN, "error": SeverityNumber.ERROR}
_OWN_FIELDS = frozenset({"ts", "level", "trace_id", "span_id", "event"})
"""Record keys that map to the log record's own fields rather than to attributes."""


def _unix_ns(ts: str) -> int:
    return int(datetime.fromisoformat(ts).timestamp() * 1e9)


def summary(event: Mapping[str, Any]) -> str:
    """The body: ``<route> <outcome> <status> model=<m> e2e_ms=<ms>`` (what a log viewer lists)."""
    return (f"{event.get('route')} {event.get('outcome')} {event.get('http_status')} "
            f"model={event.get('model')} e2e_ms={event.get('e2e_ms')}")


def log_record(event: Mapping[str, Any], resource: Resource) -> ReadableLogRecord:
    """One request event as an OpenTelemetry log record with the request's trace and span ids."""
    level = str(event.get("level", "info"))
    attributes = {k: v for k, v in event.items() if k not in _OWN_FIELDS and v is not None}
    # the ids as ints beside event_name: the API's LogRecord takes both, though no overload spells it
    record = LogRecord(  # type: ignore[call-overload]
        timestamp=_unix_ns(event["ts"]),
        observed_timestamp=time.time_ns(),
        trace_id=int(event["trace_id"], 16),
        span_id=int(event["span_id"], 16),
        severity_text=level.upper(),
        severity_number=_SEVERITY.get(level, SeverityNumber.ERROR),
        body=summary(event),
        attributes=attributes,
        event_name=EVENT_NAME,
    )
    return ReadableLogRecord(record, resource=resource, instrumentation_scope=SCOPE)


class OtlpLogSender:
    """Encodes a batch of request events and posts it to the OTLP/HTTP logs endpoint."""

    def __init__(self, endpoint: str, service_name: str, timeout_s: float) -> None:
        self.resource = Resource.create({"service.name": service_name})
        self.exporter = OTLPLogExporter(endpoint=endpoint, timeout=timeout_s)

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> bool:
        records = [log_record(event, self.resource) for event in batch]
        return self.exporter.export(records) is LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the exporter's HTTP session."""
        self.exporter.shutdown()  # type: ignore[no-untyped-call]  # the OTLP exporter is not annotated


def otlp_shipper(config: LogConfig, service_name: str, registry: CollectorRegistry) -> RecordShipper | None:
    """The shipper of kept records to ``config.otlp_endpoint``; None when it is not set."""
    if not config.otlp_endpoint:
        return None
    sender = OtlpLogSender(config.otlp_endpoint, service_name, config.otlp_timeout_s)
    return RecordShipper(sender, registry, queue_size=config.otlp_queue_size,
                         batch_records=config.otlp_batch_records, flush_s=config.otlp_flush_ms / 1000.0,
                         on_close=sender.shutdown)

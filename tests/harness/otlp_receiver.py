"""A tiny OTLP/HTTP receiver for tests: decodes the traces (/v1/traces) and logs (/v1/logs) sent to it."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

T = TypeVar("T")


@dataclass(frozen=True)
class ReceivedSpan:
    """The fields of an exported span that the tests look at."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, object]


@dataclass(frozen=True)
class ReceivedLogRecord:
    """The fields of an exported log record that the tests look at."""

    service: str
    trace_id: str
    span_id: str
    time_unix_nano: int
    severity_text: str
    severity_number: int
    body: object
    event_name: str
    attributes: dict[str, object]


def _service(resource: object) -> str:
    for attr in resource.attributes:  # type: ignore[attr-defined]
        if attr.key == "service.name":
            return str(_value(attr.value))
    return ""


def _value(any_value: object) -> object:
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(any_value, kind) if kind else None


class OtlpReceiver:
    """Listens on 127.0.0.1:PORT (/v1/traces and /v1/logs) and records every span and log record it is sent."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.log_records: list[ReceivedLogRecord] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/logs":
                    logs = ExportLogsServiceRequest()
                    logs.ParseFromString(body)
                    receiver._add_logs(logs)
                    payload = ExportLogsServiceResponse().SerializeToString()
                else:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    receiver._add(request)
                    payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """The URL to give an OTLP/HTTP span exporter."""
        return f"http://127.0.0.1:{self.port}/v1/traces"

    @property
    def logs_endpoint(self) -> str:
        """The URL to give an OTLP/HTTP log exporter."""
        return f"http://127.0.0.1:{self.port}/v1/logs"

    def _add_logs(self, request: ExportLogsServiceRequest) -> None:
        records = []
        for resource_logs in request.resource_logs:
            service = _service(resource_logs.resource)
            for scope_logs in resource_logs.scope_logs:
                for r in scope_logs.log_records:
                    records.append(
                        ReceivedLogRecord(
                            service, r.trace_id.hex(), r.span_id.hex(), r.time_unix_nano, r.severity_text,
                            r.severity_number, _value(r.body), r.event_name,
                            {a.key: _value(a.value) for a in r.attributes},
                        )
                    )
        with self._lock:
            self.log_records.extend(records)

    def logs_for(self, trace_id: str, deadline_s: float = 30.0) -> list[ReceivedLogRecord]:
        """Wait until a log record of ``trace_id`` arrives; return those received (maybe none)."""
        return self._wait(lambda: [r for r in self.log_records if r.trace_id == trace_id], deadline_s)

    def _wait(self, found: Callable[[], list[T]], deadline_s: float) -> list[T]:
        """Poll ``found()`` under the lock until it is not empty or the deadline passes."""
        end = time.monotonic() + deadline_s
        while True:
            with self._lock:
                result = found()
            if result or time.monotonic() > end:
                return result
            time.sleep(0.05)

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            service = _service(resource_spans.resource)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            service, span.name, span.trace_id.hex(), span.span_id.hex(),
                            span.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(spans)

    def wait_for(self, predicate: Callable[[ReceivedSpan], bool], deadline_s: float = 30.0) -> list[ReceivedSpan]:
        """Wait until some received spans satisfy ``predicate(span)``; return them (maybe empty)."""
        return self._wait(lambda: [s for s in self.spans if predicate(s)], deadline_s)

    def close(self) -> None:
        """Stop listening."""
        self._server.shutdown()
        self._server.server_close()

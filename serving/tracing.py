"""OpenTelemetry for the sidecar: continue or start a W3C trace per request, export over OTLP when asked."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION_SCOPE = "inferwatch.serving"


class Tracing:
    """A tracer provider owned by one app (never the global provider), with optional OTLP export."""

    def __init__(self, service_name: str, otlp_endpoint: str = "") -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, timeout=5), schedule_delay_millis=500)
            )
        self.tracer = self.provider.get_tracer(INSTRUMENTATION_SCOPE)

    def start_request_span(self, name: str, headers: Mapping[str, str], attributes: dict[str, str]) -> Span:
        """Start a SERVER span that continues the incoming ``traceparent``, or a new trace when it is invalid."""
        parent = _PROPAGATOR.extract(carrier={k.lower(): v for k, v in headers.items()})
        return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)

    @staticmethod
    def inject(span: Span, headers: MutableMapping[str, str]) -> None:
        """Write the span's ``traceparent`` (and ``tracestate``) into outgoing headers."""
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span, Context()))

    def shutdown(self) -> None:
        """Flush and stop the exporter."""
        self.provider.shutdown()


def trace_id_hex(span: Span) -> str:
    """The 32-hex-digit trace id of a span."""
    return format(span.get_span_context().trace_id, "032x")


def span_id_hex(span: Span) -> str:
    """The 16-hex-digit span id of a span."""
    return format(span.get_span_context().span_id, "016x")

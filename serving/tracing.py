"""OpenTelemetry for the sidecar: continue or start a W3C trace per request, export over OTLP when asked."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

_PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION_SCOPE = "inferwatch.serving"


class _Provider(TracerProvider):
    """A tracer provider that knows whether a span processor was added: until one is, spans go nowhere."""

    has_processors = False

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.has_processors = True


class _RecordOnlyWhenProcessed(Sampler):
    """The provider's own sampler, except that nothing is recorded while no span processor would see it.

    A recorded SDK span costs the proxy about 80 µs per request on the 2-core machine (attribute
    checks on every set, bookkeeping at start and end), all thrown away at the span's end when
    no processor is configured (no OTLP endpoint, no test exporter). Then this sampler asks the
    real one, answers DROP (the SDK makes a non-recording span: same ids, no attribute work) and
    keeps the real decision in :attr:`sampled`, which :meth:`Tracing.start_request_span` puts
    back into the span's flags: the traceparent sent upstream is the one the real sampler chose.
    """

    def __init__(self, inner: Sampler, provider: _Provider) -> None:
        self._inner = inner
        self._provider = provider
        self.sampled = False
        """The real decision for the last span made non-recording here (read right after its start)."""

    def should_sample(
        self, parent_context: Context | None, trace_id: int, name: str, kind: SpanKind | None = None,
        attributes: Attributes = None, links: Sequence[Link] | None = None, trace_state: TraceState | None = None,
    ) -> SamplingResult:
        result = self._inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)
        if self._provider.has_processors:
            return result
        self.sampled = result.decision.is_sampled()
        return SamplingResult(Decision.DROP, None, result.trace_state)

    def get_description(self) -> str:
        return self._inner.get_description()


class Tracing:
    """A tracer provider owned by one app (never the global provider), with optional OTLP export."""

    def __init__(self, service_name: str, otlp_endpoint: str = "") -> None:
        self.provider = _Provider(resource=Resource.create({"service.name": service_name}))
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, timeout=5), schedule_delay_millis=500)
            )
        # the default sampler (or OTEL_TRACES_SAMPLER's), wrapped before any tracer takes it
        self._sampler = _RecordOnlyWhenProcessed(self.provider.sampler, self.provider)
        self.provider.sampler = self._sampler
        self.tracer = self.provider.get_tracer(INSTRUMENTATION_SCOPE)

    def start_request_span(
        self, name: str, headers: CIMultiDictProxy[str] | CIMultiDict[str], attributes: dict[str, str]
    ) -> Span:
        """Start a SERVER span that continues the incoming ``traceparent``, or a new trace when it is invalid.

        ``headers`` are the request's (case-insensitive, as aiohttp gives them).

        While no span processor is configured the span does not record (``is_recording()`` is
        false: setting attributes on it does nothing); its ids and flags are the same.
        """
        if "traceparent" in headers:  # the propagator reads lower-case keys: copy the headers only then
            parent = _PROPAGATOR.extract(carrier={k.lower(): v for k, v in headers.items()})
        else:
            parent = Context()  # what extract gives without a traceparent, without copying the headers
        self._sampler.sampled = False
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        if self._sampler.sampled and not span.is_recording():  # dropped here, sampled by the real sampler
            context = span.get_span_context()
            span = NonRecordingSpan(SpanContext(
                context.trace_id, context.span_id, is_remote=False,
                trace_flags=TraceFlags(context.trace_flags | TraceFlags.SAMPLED), trace_state=context.trace_state,
            ))
        return span

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

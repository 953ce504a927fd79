"""OpenTelemetry for the sidecar: continue or start a W3C trace per request, export over OTLP when asked."""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import DEFAULT_ON
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_NO_PARENT = Context()
"""What extracting a request without a ``traceparent`` gives (a context is immutable: one serves all)."""
_FLAGS = {(sampled, random_id): TraceFlags((TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
                                           | (TraceFlags.RANDOM_TRACE_ID if random_id else 0))
          for sampled in (False, True) for random_id in (False, True)}
"""A span's flags by (sampled, random trace id); the random-id flag is W3C level 2's, as the SDK sets it."""
INSTRUMENTATION_SCOPE = "inferwatch.serving"
TRACE_HEADER = "x-trace-id"
"""The response header that carries the request's trace id (every answer of the sidecar has it)."""


class _Provider(TracerProvider):
    """A tracer provider that knows whether a span processor was added: until one is, spans go nowhere
    (and :meth:`Tracing.start_request_span` makes them without the SDK's span)."""

    has_processors = False

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.has_processors = True


class Tracing:
    """A tracer provider owned by one app (never the global provider), with optional OTLP export."""

    def __init__(self, service_name: str, otlp_endpoint: str = "") -> None:
        self.provider = _Provider(resource=Resource.create({"service.name": service_name}))
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, timeout=5), schedule_delay_millis=500)
            )
        self.tracer = self.provider.get_tracer(INSTRUMENTATION_SCOPE)

    def start_request_span(
        self, name: str, headers: Mapping[str, str], attributes: Mapping[str, str | int]
    ) -> Span:
        """Start a SERVER span that continues the incoming ``traceparent``, or a new trace when it is invalid.

        ``headers`` are the request's (case-insensitive, as aiohttp gives them).

        While no span processor is configured the span does not record (``is_recording()`` is
        false: setting attributes on it does nothing); its ids and flags are the same.
        """
        if "traceparent" in headers:  # the propagator reads lower-case keys: copy the headers only then
            parent = _PROPAGATOR.extract(carrier={k.lower(): v for k, v in headers.items()})
        else:
            parent = _NO_PARENT  # what extract gives without a traceparent, without copying the headers
        if self.provider.has_processors:
            return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        return self._unrecorded_span(name, parent, attributes)

    def _unrecorded_span(self, name: str, parent: Context, attributes: Mapping[str, str | int]) -> Span:
        """The span the SDK's tracer would start, made as the SDK makes a span its sampler does not record.

        A recorded SDK span costs the proxy about 80 µs per request on the 2-core machine
        (attribute checks on every set, bookkeeping at start and end), all thrown away at the
        span's end when no processor is configured (no OTLP endpoint, no test exporter); even a
        dropped one cost about 8 µs in the tracer's own steps. This is those steps for the
        non-recording case and no more: the parent's trace id or a new one, the provider's own
        sampler (the default, or OTEL_TRACES_SAMPLER's) deciding the sampled flag and the trace
        state that the traceparent sent upstream carries, the random-trace-id flag, a new span id.
        tests/unit/serving/test_tracing.py holds the result to the SDK's own span for the same parent.
        """
        provider, ids = self.provider, self.provider.id_generator
        if parent is _NO_PARENT and provider.sampler is DEFAULT_ON:  # the default sampler on a new trace: what
            # ParentBased(ALWAYS_ON) gives a root (sampled, no trace state), without asking it (a third of the cost)
            return NonRecordingSpan(SpanContext(ids.generate_trace_id(), ids.generate_span_id(), is_remote=False,
                                                trace_flags=_FLAGS[True, ids.is_trace_id_random()]))
        parent_context = trace.get_current_span(parent).get_span_context()
        if parent_context.is_valid:
            trace_id, random_id = parent_context.trace_id, parent_context.trace_flags.random_trace_id
        else:
            trace_id, random_id = ids.generate_trace_id(), ids.is_trace_id_random()
        result = provider.sampler.should_sample(parent, trace_id, name, SpanKind.SERVER, attributes)
        flags = _FLAGS[result.decision.is_sampled(), bool(random_id)]  # type: ignore[no-untyped-call]  # OTel SDK
        return NonRecordingSpan(SpanContext(trace_id, ids.generate_span_id(), is_remote=False,
                                            trace_flags=flags, trace_state=result.trace_state))

    @staticmethod
    def inject(span: Span, headers: MutableMapping[str, str]) -> None:
        """Write the span's ``traceparent`` (and ``tracestate``) into outgoing headers.

        The W3C headers as the SDK's propagator writes them (tests/unit/serving/test_tracing.py holds
        the two equal), without the propagator's context round trip: a third of the span's cost.
        """
        context = span.get_span_context()
        if not context.is_valid:
            return
        headers["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        if context.trace_state:
            headers["tracestate"] = context.trace_state.to_header()

    def shutdown(self) -> None:
        """Flush and stop the exporter."""
        self.provider.shutdown()


def request_trace_id(traceparent: str | None) -> str:
    """The trace id of a request the proxy does not trace (an admin refusal, an unknown path, a refused head).

    The caller's ``traceparent`` trace id when the proxy's propagator takes it (so the answer joins the
    caller's trace exactly when a proxied request would), else a new random one, so every error answer
    names a trace id as the proxy's do.
    """
    if traceparent:
        context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
        if context.is_valid:
            return f"{context.trace_id:032x}"
    return os.urandom(16).hex()


def trace_id_hex(span: Span) -> str:
    """The 32-hex-digit trace id of a span."""
    return format(span.get_span_context().trace_id, "032x")


def span_id_hex(span: Span) -> str:
    """The 16-hex-digit span id of a span."""
    return format(span.get_span_context().span_id, "016x")

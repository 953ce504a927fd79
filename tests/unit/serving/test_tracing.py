"""The request span without a span processor against the SDK's own, for the same incoming trace context.

With no processor the sidecar makes the span itself (serving/tracing.py); the SDK's tracer,
once a processor is added, is the truth its ids, flags and trace state must match.
"""

from __future__ import annotations

import pytest
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving.tracing import Tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENTS = {
    "none": {},
    "sampled": {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
    "not sampled": {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-00"},
    "with tracestate": {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01", "tracestate": "vendor=abc,other=1"},
    "invalid": {"traceparent": "00-zz-not-valid"},
}


def outgoing(tracing: Tracing, incoming: dict[str, str]) -> tuple[str, dict[str, str]]:
    span = tracing.start_request_span("POST /v1/completions", CIMultiDict(incoming), {"url.path": "/v1/completions"})
    headers: dict[str, str] = {}
    tracing.inject(span, headers)
    propagated: dict[str, str] = {}  # what the SDK's own W3C propagator writes for the same span
    TraceContextTextMapPropagator().inject(propagated, context=trace.set_span_in_context(span))
    assert headers == propagated
    span.end()
    return format(span.get_span_context().trace_id, "032x"), headers


@pytest.mark.parametrize("sampler", ["parentbased_always_on", "always_off", "traceidratio"])
@pytest.mark.parametrize("parent", list(PARENTS))
def test_an_unrecorded_span_carries_what_the_sdks_span_would(
    monkeypatch: pytest.MonkeyPatch, parent: str, sampler: str
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    bare, recorded = Tracing("t"), Tracing("t")
    exported = InMemorySpanExporter()
    recorded.provider.add_span_processor(SimpleSpanProcessor(exported))
    ours_id, ours = outgoing(bare, PARENTS[parent])
    sdk_id, sdk = outgoing(recorded, PARENTS[parent])
    if parent in ("none", "invalid"):  # a new trace each: compare all but the ids
        assert ours_id != sdk_id
        if sampler == "traceidratio":  # the ratio sampler decides by the trace id: judge each by its own
            return
    else:
        assert ours_id == sdk_id == TRACE_ID
    assert ours.keys() == sdk.keys()
    assert ours["traceparent"].split("-")[3] == sdk["traceparent"].split("-")[3]  # the sampled flag
    assert ours.get("tracestate") == sdk.get("tracestate")
    assert ours["traceparent"].split("-")[2] != "00f067aa0ba902b7"  # a span of its own under the parent


def test_no_processor_no_recording_and_a_processor_records() -> None:
    tracing = Tracing("t")
    span = tracing.start_request_span("GET /v1/models", CIMultiDict(), {})
    assert not span.is_recording()
    exported = InMemorySpanExporter()
    tracing.provider.add_span_processor(SimpleSpanProcessor(exported))
    span = tracing.start_request_span("GET /v1/models", CIMultiDict(), {"url.path": "/v1/models"})
    assert span.is_recording()
    span.end()
    assert [s.attributes["url.path"] for s in exported.get_finished_spans()] == ["/v1/models"]

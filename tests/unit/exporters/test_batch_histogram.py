"""The batch histogram exposes exactly what prometheus_client's Histogram does for the same observations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from exporters.batch_histogram import BatchHistogram
from exporters.catalog.request import INTER_TOKEN_LATENCY_SECONDS as SPEC


def _samples(registry: CollectorRegistry) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), round(s.value, 9))
        for family in registry.collect() for s in family.samples if not s.name.endswith("_created")
    )


gaps = st.lists(st.one_of(st.floats(0, 100), st.sampled_from(SPEC.buckets or (0.1,))), max_size=50)


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(st.tuples(st.sampled_from(["a", "b"]), gaps), max_size=8))
def test_same_samples_as_a_histogram_fed_one_value_at_a_time(requests: list[tuple[str, list[float]]]) -> None:
    """Bucket counts (bounds inclusive, as Prometheus' le), sums and counts equal the library Histogram's."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram(SPEC, ours)
    reference = Histogram(SPEC.name, SPEC.help, SPEC.labels, registry=theirs, buckets=SPEC.buckets or ())
    for model, values in requests:
        batch.labels(model, "/v1/completions", "le512", "default", "primary").observe_many(values)
        child = reference.labels(model, "/v1/completions", "le512", "default", "primary")
        for value in values:
            child.observe(value)
    assert _samples(ours) == _samples(theirs)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.one_of(
    st.floats(0, 100), st.integers(0, 5000), st.sampled_from(SPEC.buckets or (0.1,))
)), max_size=40))
def test_single_observations_give_the_samples_of_a_histogram(values: list[tuple[str, float]]) -> None:
    """One value at a time (latencies, token counts), bounds included: the library Histogram's samples."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram(SPEC, ours)
    reference = Histogram(SPEC.name, SPEC.help, SPEC.labels, registry=theirs, buckets=SPEC.buckets or ())
    for model, value in values:
        batch.labels(model, "/v1/completions", "le512", "default", "primary").observe(value)
        reference.labels(model, "/v1/completions", "le512", "default", "primary").observe(value)
    assert _samples(ours) == _samples(theirs)


def test_a_single_observation_carries_its_exemplar_like_the_library() -> None:
    """OpenMetrics exemplar lines of single observations equal prometheus_client's, timestamps aside."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram(SPEC, ours)
    reference = Histogram(SPEC.name, SPEC.help, SPEC.labels, registry=theirs, buckets=SPEC.buckets or ())
    for value, trace in ((0.004, "ab"), (0.3, "cd"), (0.25, "ef"), (1e6, "01")):
        batch.labels("m", "/v1/completions", "le512", "default", "primary").observe(value, {"trace_id": trace * 16})
        reference.labels("m", "/v1/completions", "le512", "default", "primary").observe(value, {"trace_id": trace * 16})

    def exemplars(registry: CollectorRegistry) -> list[str]:
        return [line.rsplit(" ", 1)[0] for line in openmetrics(registry).decode().splitlines() if "# {" in line]

    assert exemplars(ours) == exemplars(theirs)
    assert len(exemplars(ours)) == 3  # 0.3 and 0.25 share a bucket: the latest wins


def test_the_exemplar_marks_the_last_gap_of_the_request() -> None:
    """OpenMetrics shows the trace id on the bucket of the request's last observation."""
    registry = CollectorRegistry()
    batch = BatchHistogram(SPEC, registry)
    batch.labels("m", "/v1/completions", "le512", "default", "primary").observe_many(
        [0.001, 0.3], {"trace_id": "ab" * 16})
    text = openmetrics(registry).decode()
    (line,) = [line for line in text.splitlines() if "# {" in line]
    assert line.startswith('inferwatch_inter_token_latency_seconds_bucket{lane="default",le="0.3",')
    assert f'trace_id="{"ab" * 16}"' in line

"""Property tests: ingestion of malformed expositions never raises and counts what it skipped."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exporters.derive import normalized
from exporters.vllm_parse import parse_exposition

DATA = Path(__file__).resolve().parents[2] / "data"
REAL_LINES = (DATA / "vllm_v1_engine_0.32.prom").read_text().splitlines()

junk_line = st.one_of(
    st.text(max_size=60),
    st.sampled_from([
        "# TYPE vllm:num_requests_running histogram", "# TYPE vllm:kv_cache_usage_perc gauge extra",
        "vllm:num_requests_running{engine=\"0\" 3", "vllm:kv_cache_usage_perc{} NaN",
        "vllm:num_preemptions_total{model_name=\"m\"} -Inf", "vllm:cache_config_info{num_gpu_blocks=\"x\"} 1",
        "vllm:iteration_tokens_total_bucket{le=\"oops\"} 3", "{}", "# HELP", "\x00\x01",
    ]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(junk_line, max_size=30))
def test_arbitrary_lines_never_raise(lines: list[str]) -> None:
    """Any list of junk lines parses to a snapshot and derives a view without raising."""
    snapshot = parse_exposition("\n".join(lines))
    normalized(snapshot)
    assert snapshot.parse_errors <= len(lines)
    assert all(name.startswith("vllm:") for name in snapshot.unknown_families)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_corrupting_a_wanted_family_counts_a_parse_error(data: st.DataObject) -> None:
    """Breaking one sample line of a parsed family is counted, and the other families still parse."""
    candidates = [i for i, line in enumerate(REAL_LINES) if line.startswith("vllm:num_requests_waiting{")]
    index = data.draw(st.sampled_from(candidates))
    broken = list(REAL_LINES)
    broken[index] = broken[index].replace("}", "", 1)
    snapshot = parse_exposition("\n".join(broken))
    assert snapshot.parse_errors >= 1
    assert snapshot.series[0].running == 2.0


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=len(REAL_LINES)), st.integers(min_value=1, max_value=40))
def test_truncated_or_spliced_real_text_never_raises(start: int, length: int) -> None:
    """Any slice of a real exposition (cut mid-family) parses without raising."""
    snapshot = parse_exposition("\n".join(REAL_LINES[start:start + length]))
    normalized(snapshot)
    assert snapshot.parse_errors <= length


@given(st.lists(st.sampled_from(["{}", "{a=\"b\"} 1", " {x} 2"]), min_size=1, max_size=10))
def test_lines_without_a_metric_name_are_each_counted(lines: list[str]) -> None:
    """Every sample line that has no metric name counts as one parse error."""
    assert parse_exposition("\n".join(lines)).parse_errors == len(lines)

"""Tests of serving.ndjson: Ollama's NDJSON stream read line by line, forwarded unchanged, and measured.

The lines are Ollama's documented shapes (docs.ollama.com, api/usage and api/streaming: the example final
message's numbers are the reference's own).
"""

from __future__ import annotations

import json

import pytest

from exporters.engine_phases import from_llamacpp, from_ollama
from serving.ndjson import NdjsonReader, error_line
from serving.sse import SseReader

FINAL = {"model": "gemma3", "created_at": "2025-10-17T23:14:07.414671Z", "response": "", "done": True,
         "done_reason": "stop", "total_duration": 174560334, "load_duration": 101397084, "prompt_eval_count": 11,
         "prompt_eval_duration": 13074791, "eval_count": 18, "eval_duration": 52479709}


def _part(piece: str) -> bytes:
    return json.dumps({"model": "gemma3", "created_at": "2025-10-17T23:14:07Z", "response": piece,
                       "done": False}).encode() + b"\n"


def test_lines_split_anywhere_are_forwarded_whole_and_timed_on_arrival() -> None:
    """A line cut over two reads goes out once whole; each content line is timed when it completes."""
    stream = _part("Hello") + _part("!") + json.dumps(FINAL).encode() + b"\n"
    reader = NdjsonReader()
    cut = len(_part("Hello")) + 5
    out = reader.feed(stream[:cut], 100) + reader.feed(stream[cut:], 250)
    assert out == stream
    assert reader.stats.content_ns == [100, 250]
    assert reader.pending == 0


def test_the_final_message_gives_tokens_reason_and_ollamas_durations_in_seconds() -> None:
    """prompt_eval_count, eval_count, done_reason, and the four durations from nanoseconds."""
    reader = NdjsonReader()
    reader.feed(_part("Hi") + json.dumps(FINAL).encode() + b"\n", 1)
    stats = reader.stats
    assert (stats.prompt_tokens, stats.completion_tokens, stats.finish_reason, stats.done) == (11, 18, "stop", True)
    phases = stats.phases
    assert phases is not None
    assert (phases.load_s, phases.prefill_s, phases.decode_s, phases.total_s) == (
        0.101397084, 0.013074791, 0.052479709, 0.174560334)


def test_a_duration_ollama_leaves_out_is_zero_not_unknown() -> None:
    """Ollama omits zero fields (Go's omitempty): a warm model's final message has no load_duration."""
    warm = {k: v for k, v in FINAL.items() if k != "load_duration"}
    phases = from_ollama(warm)
    assert phases is not None
    assert phases.load_s == 0.0


def test_an_error_line_is_counted_and_carries_the_trace_id() -> None:
    """Ollama's in-stream error becomes the record's error; the client's line gains the trace id."""
    reader = NdjsonReader(trace_id="ab" * 16)
    out = reader.feed(b'{"error":"an unknown error was encountered while running the model"}\n', 1)
    assert json.loads(out)["trace_id"] == "ab" * 16
    assert reader.stats.error == "an unknown error was encountered while running the model"


@pytest.mark.parametrize(("data", "problem"), [
    pytest.param(b"not json\n", "upstream_malformed_event", id="a line that is not JSON breaks the stream"),
    pytest.param(b"[1, 2]\n", "upstream_malformed_event", id="a line that is not an object breaks the stream"),
    pytest.param(b'{"response":"' + b"x" * 200, "upstream_event_too_large", id="an endless line breaks it"),
])
def test_a_bad_line_stops_forwarding(data: bytes, problem: str) -> None:
    """Nothing is forwarded from a bad line on: the proxy ends the stream with its own error line."""
    reader = NdjsonReader(max_line_bytes=100)
    assert reader.feed(_part("ok") + data, 1) in (_part("ok"), b"")
    assert reader.stats.problem == problem
    assert reader.broken
    assert reader.feed(_part("more"), 2) == b""


def test_the_proxys_own_error_line_is_one_json_line() -> None:
    """The last line of a failed stream: Ollama's error shape plus type and trace id."""
    line = error_line("upstream stayed silent", "upstream_stalled", "cd" * 16)
    assert line.endswith(b"\n")
    assert json.loads(line) == {"error": "upstream stayed silent", "type": "upstream_stalled", "trace_id": "cd" * 16}


def test_llamacpps_timings_are_prefill_decode_and_cached_tokens() -> None:
    """prompt_ms and predicted_ms in seconds; the prompt is the evaluated plus the cached tokens."""
    phases = from_llamacpp({"cache_n": 3, "prompt_n": 7, "prompt_ms": 2.224, "predicted_n": 8,
                            "predicted_ms": 4.134})
    assert phases is not None
    assert (phases.prefill_s, phases.decode_s) == pytest.approx((0.002224, 0.004134))
    assert (phases.cached_tokens, phases.prompt_tokens, phases.generated_tokens) == (3, 10, 8)


def test_llamacpps_timings_are_read_from_its_sse_usage_chunk_and_its_native_last_event() -> None:
    """The OpenAI stream's usage chunk and /completion's last event (stop true, no usage) both give the phases."""
    timings = {"cache_n": 0, "prompt_n": 7, "prompt_ms": 2.224, "predicted_n": 8, "predicted_ms": 4.134}
    usage_chunk = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 8}, "timings": timings}
    native_last = {"index": 0, "content": "", "stop": True, "stop_type": "limit", "timings": timings}
    for event in (usage_chunk, native_last):
        reader = SseReader(strip_usage_chunk=False, strip_usage_field=False)
        reader.feed(b"data: " + json.dumps(event).encode() + b"\n\n", 1)
        assert reader.stats.phases is not None
        assert reader.stats.phases.prefill_s == pytest.approx(0.002224)

"""Tests of RequestRecord → log event."""

from __future__ import annotations

from exporters.records import Outcome, RequestRecord
from log_pipeline.records import FIELDS, event_from_record, format_ts


def _record(**changes: object) -> RequestRecord:
    base = RequestRecord(
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7", route="/v1/chat/completions",
        model="llama", stream=True, upstream="http://127.0.0.1:8000", http_status=200,
        length_bucket="le512", prompt_tokens=12, completion_tokens=34, accept_s=0.0123, ttft_s=0.08,
        e2e_s=1.23456, inter_token_s=[0.01, 0.03], finish_reason="stop", start_unix=1_754_568_000.5,
        prompt_hash="ab" * 32, prompt_chars=77,
    )
    for key, value in changes.items():
        setattr(base, key, value)
    return base


class TestEventFromRecord:
    def test_a_success_has_every_schema_field_in_order_and_no_error_fields(self) -> None:
        """An ok request yields exactly FIELDS, level info, times in ms rounded to 0.1."""
        event = event_from_record(_record(), sla_s=None)
        assert tuple(event) == (*FIELDS, "largest_gap_ms")  # a stream's largest gap, for inferwatch explain
        assert event["level"] == "info"
        assert (event["ttft_ms"], event["itl_ms"], event["e2e_ms"], event["queue_ms"]) == (80.0, 20.0, 1234.6, 12.3)
        assert event["ts"] == "2025-08-07T12:00:01.735Z"
        assert event["slow"] is False

    def test_no_prompt_text_or_hash_by_default(self) -> None:
        """Without the opt-in, the prompt's hash and length are absent."""
        event = event_from_record(_record(), sla_s=None)
        assert "prompt_sha256" not in event
        assert "prompt_chars" not in event

    def test_prompt_hash_capture_keeps_only_hash_and_length(self) -> None:
        """With capture_prompt_hash the event gets the hash and length, nothing else new."""
        event = event_from_record(_record(), sla_s=None, capture_prompt_hash=True)
        assert (event["prompt_sha256"], event["prompt_chars"]) == ("ab" * 32, 77)
        assert set(event) == {*FIELDS, "largest_gap_ms", "prompt_sha256", "prompt_chars"}

    def test_failures_carry_error_type_and_a_bounded_message(self) -> None:
        """A timeout has level error, its error type, and a message cut to 512 characters."""
        event = event_from_record(
            _record(outcome=Outcome.TIMEOUT, http_status=504, error_type="ReadTimeout", error_message="x" * 2000),
            sla_s=None,
        )
        assert (event["level"], event["outcome"], event["error_type"]) == ("error", "timeout", "ReadTimeout")
        assert len(event["error_message"]) == 512

    def test_client_errors_are_warnings(self) -> None:
        """A 400 is logged at level warning."""
        assert event_from_record(_record(outcome=Outcome.CLIENT_ERROR), sla_s=None)["level"] == "warning"

    def test_slow_compares_e2e_with_the_sla(self) -> None:
        """e2e 1.23 s is slow against a 1 s SLA and not against a 2 s one."""
        assert event_from_record(_record(), sla_s=1.0)["slow"] is True
        assert event_from_record(_record(), sla_s=2.0)["slow"] is False

    def test_missing_timings_stay_null(self) -> None:
        """A request that never got a first token has ttft_ms and itl_ms null."""
        event = event_from_record(_record(ttft_s=None, inter_token_s=[], e2e_s=None), sla_s=1.0)
        assert (event["ttft_ms"], event["itl_ms"], event["e2e_ms"], event["slow"]) == (None, None, None, False)


def test_format_ts_rounds_to_milliseconds() -> None:
    """format_ts prints UTC with three decimals and a Z."""
    assert format_ts(0.0015) == "1970-01-01T00:00:00.002Z"

"""Tests of the trace-id ratio sampler."""

from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace.sampling import Decision as OtelDecision
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

from log_pipeline.sampling import Sampler, classify, trace_randomness


def _ids(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.getrandbits(128):032x}" for _ in range(n)]


class TestSampler:
    def test_keeps_the_ratio_within_a_fifth_of_a_percent_over_a_million_ids(self) -> None:
        """Over 1 M random trace ids a 5 % sampler keeps between 4.8 % and 5.2 %."""
        sampler = Sampler(0.05)
        kept = sum(sampler.decide(t, is_error=False, slow=False).keep for t in _ids(1_000_000, 7))
        assert 48_000 <= kept <= 52_000

    def test_decisions_depend_only_on_the_trace_id(self) -> None:
        """Two samplers give the same decision for every id, whatever the order they see them in."""
        ids = _ids(20_000, 3)
        first = {t: Sampler(0.05).decide(t, is_error=False, slow=False).keep for t in ids}
        other = Sampler(0.05)
        assert {t: other.decide(t, is_error=False, slow=False).keep for t in reversed(ids)} == first

    def test_agrees_with_opentelemetry_trace_id_ratio_based(self) -> None:
        """The keep decision equals OpenTelemetry Python's TraceIdRatioBased for the same ratio."""
        otel = TraceIdRatioBased(0.05)
        sampler = Sampler(0.05)
        for trace_id in _ids(20_000, 11):
            expected = otel.should_sample(None, int(trace_id, 16), "span").decision
            ours = sampler.decide(trace_id, is_error=False, slow=False).keep
            assert ours == (expected is OtelDecision.RECORD_AND_SAMPLE), trace_id

    def test_a_trace_kept_at_a_ratio_is_kept_at_a_larger_one(self) -> None:
        """Raising the ratio only adds traces."""
        ids = _ids(20_000, 5)
        low = {t for t in ids if Sampler(0.02).decide(t, is_error=False, slow=False).keep}
        high = {t for t in ids if Sampler(0.1).decide(t, is_error=False, slow=False).keep}
        assert low < high

    def test_errors_and_slow_requests_are_always_kept_with_their_reason(self) -> None:
        """A ratio of 0 still keeps errors (reason error) and slow requests (reason slow)."""
        sampler = Sampler(0.0)
        trace_id = "f" * 32
        assert sampler.decide(trace_id, is_error=True, slow=True).reason == "error"
        assert sampler.decide(trace_id, is_error=False, slow=True).reason == "slow"
        dropped = sampler.decide(trace_id, is_error=False, slow=False)
        assert (dropped.keep, dropped.reason) == (False, "dropped_sampling")

    def test_ratio_one_keeps_every_success_as_sampled(self) -> None:
        """At ratio 1 even the largest trace id is kept, with reason sampled."""
        decision = Sampler(1.0).decide("f" * 32, is_error=False, slow=False)
        assert (decision.keep, decision.reason) == (True, "sampled")

    def test_a_ratio_outside_zero_to_one_is_refused(self) -> None:
        """A ratio of 1.5 raises ValueError."""
        with pytest.raises(ValueError, match="between 0 and 1"):
            Sampler(1.5)

    def test_malformed_trace_ids_are_hashed_deterministically(self) -> None:
        """A non-hex id gets a stable 64-bit value from a hash, not from Python's salted hash()."""
        assert trace_randomness("not-a-trace") == trace_randomness("not-a-trace")
        assert trace_randomness("not-a-trace") != trace_randomness("not-a-trace2")
        assert trace_randomness("0" * 16 + "00000000000000ff") == 255


class TestClassify:
    def test_any_outcome_but_ok_is_an_error(self) -> None:
        """client_error and timeout count as errors, ok does not."""
        assert classify({"outcome": "client_error"}) == (True, False)
        assert classify({"outcome": "timeout"}) == (True, False)
        assert classify({"outcome": "ok"}) == (False, False)

    def test_slow_from_the_flag_or_the_threshold(self) -> None:
        """The slow flag counts, and so does e2e_ms above a positive threshold; booleans are not numbers."""
        assert classify({"outcome": "ok", "slow": True}) == (False, True)
        assert classify({"e2e_ms": 2500.0}, slow_after_ms=2000.0) == (False, True)
        assert classify({"e2e_ms": 2500.0}) == (False, False)
        assert classify({"e2e_ms": True}, slow_after_ms=0.5) == (False, False)

    def test_decide_event_uses_the_event_fields(self) -> None:
        """An error event with a malformed trace id is kept as an error."""
        decision = Sampler(0.0).decide_event({"trace_id": 42, "level": "error"})
        assert (decision.keep, decision.reason) == (True, "error")

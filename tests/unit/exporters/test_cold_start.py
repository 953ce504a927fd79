"""The sidecar's cold-start tracker: readiness probes and first tokens in, cold starts and a histogram out."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog.process import UPSTREAM_COLD_START
from exporters.cold_start import ColdStartTracker, Phase


class Clock:
    """A monotonic and a wall clock that move only when told."""

    def __init__(self) -> None:
        self.now = 50.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now


@pytest.fixture(name="clock")
def _clock() -> Clock:
    return Clock()


@pytest.fixture(name="tracker")
def _tracker(clock: Clock) -> ColdStartTracker:
    return ColdStartTracker(clock=clock.monotonic, wall=clock.wall, keep=3)


def _samples(tracker: ColdStartTracker) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    registry.register(tracker)
    text = generate_latest(registry).decode()
    return {(s.name, s.labels.get("le", "")): s.value for f in text_string_to_metric_families(text) for s in f.samples}


class TestColdStarts:
    """Readiness lost -> ready -> first token makes one cold start."""

    def test_restart_is_measured_from_readiness_lost_to_the_first_token(
        self, tracker: ColdStartTracker, clock: Clock
    ) -> None:
        """Ready, lost at 50 s, back at 80 s, token at 83 s: ready after 30 s, first token after 33 s."""
        tracker.probe(True)
        tracker.probe(False)
        clock.now = 65.0
        tracker.probe(False)
        clock.now = 80.0
        tracker.probe(True)
        clock.now = 83.0
        event = tracker.first_token()
        assert event is not None
        assert (event.cause, event.ready_after_s, event.first_token_after_s) == ("readiness_lost", 30.0, 33.0)
        assert event.began_unix == 1_700_000_050.0
        assert tracker.phase is Phase.READY
        assert tracker.first_token() is None

    def test_an_upstream_not_ready_at_start_counts_from_the_first_probe(
        self, tracker: ColdStartTracker, clock: Clock
    ) -> None:
        """The sidecar starts beside a loading vLLM: the cold start runs from its first probe."""
        tracker.probe(False)
        clock.now = 70.0
        tracker.probe(True)
        clock.now = 71.5
        event = tracker.first_token()
        assert event is not None
        assert (event.cause, event.first_token_after_s) == ("not_ready_at_start", 21.5)

    def test_an_upstream_ready_when_first_seen_has_no_cold_start(self, tracker: ColdStartTracker) -> None:
        """Already serving when first probed: tokens end nothing."""
        tracker.probe(True)
        assert tracker.first_token() is None
        assert tracker.recent == ()
        assert tracker.in_progress() is None

    def test_a_token_while_still_marked_down_ends_the_cold_start(
        self, tracker: ColdStartTracker, clock: Clock
    ) -> None:
        """A successful token before the next probe proves readiness: ready and first token coincide."""
        tracker.probe(True)
        tracker.probe(False)
        clock.now = 62.0
        event = tracker.first_token()
        assert event is not None
        assert event.ready_after_s == event.first_token_after_s == 12.0

    def test_the_token_time_can_be_given_and_an_old_token_ends_nothing(
        self, tracker: ColdStartTracker, clock: Clock
    ) -> None:
        """A request finished after the loss whose first token came before it is ignored; a token time given
        for a later request is used as is, and ready is never later than that token."""
        tracker.probe(True)
        clock.now = 60.0
        tracker.probe(False)
        clock.now = 90.0
        assert tracker.first_token(at=55.0) is None
        tracker.probe(True)
        event = tracker.first_token(at=85.0)
        assert event is not None
        assert (event.ready_after_s, event.first_token_after_s) == (25.0, 25.0)

    def test_losing_readiness_again_before_the_token_keeps_the_same_start(
        self, tracker: ColdStartTracker, clock: Clock
    ) -> None:
        """A flap before any token is one cold start measured from the first loss."""
        tracker.probe(True)
        tracker.probe(False)
        clock.now = 60.0
        tracker.probe(True)
        clock.now = 61.0
        tracker.probe(False)
        clock.now = 90.0
        tracker.probe(True)
        clock.now = 95.0
        event = tracker.first_token()
        assert event is not None
        assert (event.ready_after_s, event.first_token_after_s) == (40.0, 45.0)

    def test_readyz_details_show_the_cold_start_in_progress_and_the_last_ones(
        self, tracker: ColdStartTracker, clock: Clock
    ) -> None:
        """Only the last ``keep`` cold starts are listed; one in progress shows its phase and age."""
        tracker.probe(True)
        for number in range(4):
            tracker.probe(False)
            clock.now += 10 + number
            tracker.probe(True)
            tracker.first_token()
        assert [c["first_token_after_s"] for c in tracker.details()["recent_cold_starts"]] == [11.0, 12.0, 13.0]
        tracker.probe(False)
        clock.now += 4
        progress = tracker.details()["cold_start_in_progress"]
        assert progress == {"cause": "readiness_lost", "began_unix": pytest.approx(1_700_000_096.0),
                            "phase": "down", "for_s": 4.0}


class TestHistogram:
    """The histogram is exposed under the catalog's name and buckets."""

    def test_counts_sum_and_buckets(self, tracker: ColdStartTracker, clock: Clock) -> None:
        """Cold starts of 12 s and 250 s land in the 15 s and 300 s buckets; sum and count add up."""
        tracker.probe(True)
        for seconds in (12.0, 250.0):
            tracker.probe(False)
            clock.now += seconds
            tracker.probe(True)
            tracker.first_token()
        samples = _samples(tracker)
        assert samples[(UPSTREAM_COLD_START.count, "")] == 2
        assert samples[(UPSTREAM_COLD_START.sum, "")] == pytest.approx(262.0)
        assert samples[(UPSTREAM_COLD_START.bucket, "10.0")] == 0
        assert samples[(UPSTREAM_COLD_START.bucket, "15.0")] == 1
        assert samples[(UPSTREAM_COLD_START.bucket, "180.0")] == 1
        assert samples[(UPSTREAM_COLD_START.bucket, "300.0")] == 2
        assert samples[(UPSTREAM_COLD_START.bucket, "+Inf")] == 2

    def test_empty_histogram_is_exposed_with_zero_counts(self, tracker: ColdStartTracker) -> None:
        """Before any cold start the family exists with count 0."""
        samples = _samples(tracker)
        assert samples[(UPSTREAM_COLD_START.count, "")] == 0
        assert samples[(UPSTREAM_COLD_START.bucket, "+Inf")] == 0

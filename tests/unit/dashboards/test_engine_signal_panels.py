"""The engine board shows queue depth by reason, vLLM's own rejections and KV offloading (V1's swap)."""

from __future__ import annotations

from typing import Any

from alert_rules.config import RulesConfig
from exporters.catalog import engine, request, vllm


def _panel(boards: dict[str, dict[str, Any]], title: str) -> dict[str, Any]:
    board = next(b for name, b in boards.items() if name.endswith("-engine.json"))
    return next(p for p in board["panels"] if p["title"] == title)


def _exprs(panel: dict[str, Any]) -> str:
    return "\n".join(t["expr"] for t in panel["targets"])


def test_queue_by_reason_reads_the_sidecar_and_vllm(boards: dict[str, dict[str, Any]]) -> None:
    """Queue depth by reason plots the sidecar's summed family and vLLM's own gauge, by reason."""
    exprs = _exprs(_panel(boards, "Queue depth by reason"))
    assert engine.ENGINE_WAITING_BY_REASON.series in exprs
    assert vllm.NUM_REQUESTS_WAITING_BY_REASON.series in exprs


def test_rejections_sit_next_to_the_sidecars_overloaded_answers(boards: dict[str, dict[str, Any]]) -> None:
    """The rejection panel shows vLLM's counter (both spellings) and the sidecar's overloaded outcomes."""
    exprs = _exprs(_panel(boards, "Admission rejections"))
    assert engine.ENGINE_ADMISSION_REJECTIONS.series in exprs
    assert vllm.ADMISSION_REJECTIONS.series in exprs
    assert f'{request.REQUESTS.series}{{' in exprs
    assert 'outcome="overloaded"' in exprs


def test_offload_panels_plot_the_swap_family_with_the_alert_limit(boards: dict[str, dict[str, Any]]) -> None:
    """The offload traffic panel rates KV swap bytes by direction with the offload alert's limit as its line."""
    traffic = _panel(boards, "KV offload traffic (V1 swap)")
    assert f"rate({engine.KV_SWAP_BYTES.series}{{" in _exprs(traffic)
    steps = traffic["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == RulesConfig().kv_offload_bytes_per_s
    state = _exprs(_panel(boards, "KV offload time, CPU space and failures"))
    for spec in (engine.KV_SWAP_SECONDS, engine.KV_SWAP_CPU_USAGE, engine.KV_SWAP_ALLOCATION_FAILURES):
        assert spec.series in state

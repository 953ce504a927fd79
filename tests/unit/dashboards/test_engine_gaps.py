"""Panels that read a series some engine does not feed say so in their description (never a silent empty panel)."""

from __future__ import annotations

from typing import Any

from exporters.catalog import engine as ce
from exporters.catalog import request as cr
from exporters.catalog.engines import SIGNALS, families_in


def _panels(boards: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for board in boards.values() for p in board["panels"] if p.get("targets")]


def _reads(panel: dict[str, Any], family: str) -> bool:
    return any(family in families_in(t["expr"]) for t in panel["targets"])


def test_every_kv_usage_panel_says_on_which_engines_it_stays_empty(boards: dict[str, dict[str, Any]]) -> None:
    """A panel of KV usage names llama.cpp (no KV gauge) and Ollama (no /metrics) in its description."""
    kv = [p for p in _panels(boards) if _reads(p, ce.KV_USAGE.name)]
    assert kv
    for panel in kv:
        assert "llama.cpp (llama-server exports no KV-cache gauge)" in panel["description"], panel["title"]
        assert "Ollama" in panel["description"], panel["title"]


def test_every_panel_reading_a_signal_some_engine_lacks_says_so(boards: dict[str, dict[str, Any]]) -> None:
    """For each signal of the engine table with a missing engine, each panel reading it names that engine."""
    for signal in SIGNALS:
        for panel in (p for p in _panels(boards) if any(_reads(p, family) for family in signal.series)):
            for why in signal.missing().values():
                assert why in panel["description"], (panel["title"], signal.name)


def test_a_panel_of_the_sidecars_own_request_series_names_no_engine(boards: dict[str, dict[str, Any]]) -> None:
    """The request counters are the sidecar's own, fed in front of every engine: no note."""
    only_requests = [p for p in _panels(boards)
                     if all(families_in(t["expr"]) & {cr.REQUESTS.name} for t in p["targets"])
                     and not any(_reads(p, f) for s in SIGNALS for f in s.series)]
    assert only_requests
    assert all("No data on" not in p["description"] for p in only_requests)

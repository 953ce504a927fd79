"""The baseline profile: latency percentiles, throughput, energy, power and temperature, saved or compared."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Limits:
    """How much worse than the baseline a run may be: p99 latency up by ``p99_rise``, throughput down by
    ``throughput_drop`` (shares)."""

    p99_rise: float = 0.10
    throughput_drop: float = 0.10


def save(path: Path, profile: dict[str, Any]) -> None:
    """Write the profile as JSON (parent folders created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=2, sort_keys=True) + "\n")


def load(path: Path) -> dict[str, Any]:
    """Read a saved profile; a missing or unreadable file is a ConfigError naming --compare."""
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError("--compare", f"cannot read the baseline: {err}", str(path)) from err
    if not isinstance(profile, dict):
        raise ConfigError("--compare", "the baseline is not a JSON object", str(path))
    return profile


def regressions(baseline: dict[str, Any], now: dict[str, Any], limits: Limits) -> list[str]:
    """What got worse beyond the limits, one sentence each (empty: no regression)."""
    found = []
    for key in ("e2e_p99_s", "ttft_p99_s"):
        before, after = baseline.get(key), now.get(key)
        if before and after is not None and after > before * (1 + limits.p99_rise):
            found.append(f"{key} {after:.4g} s is {after / before - 1:+.0%} against {before:.4g} s "
                         f"(limit +{limits.p99_rise:.0%})")
    for key in ("requests_per_s", "output_tokens_per_s"):
        before, after = baseline.get(key), now.get(key)
        if before and after is not None and after < before * (1 - limits.throughput_drop):
            found.append(f"{key} {after:.4g} is {after / before - 1:+.0%} against {before:.4g} "
                         f"(limit -{limits.throughput_drop:.0%})")
    return found


__all__ = ["Limits", "load", "regressions", "save"]

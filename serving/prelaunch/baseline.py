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
    ``throughput_drop``, power up by ``power_rise``, tokens per joule down by ``tokens_per_joule_drop`` (shares),
    the hottest GPU up by ``temperature_rise_c`` degrees (a share of a Celsius reading means nothing)."""

    p99_rise: float = 0.10
    throughput_drop: float = 0.10
    power_rise: float = 0.10
    tokens_per_joule_drop: float = 0.10
    temperature_rise_c: float = 5.0


RISES = (("e2e_p99_s", "p99_rise", " s"), ("ttft_p99_s", "p99_rise", " s"), ("power_watts", "power_rise", " W"))
"""Profile keys that must not rise by more than a share: (key, the share's Limits field, unit)."""
DROPS = (("requests_per_s", "throughput_drop", ""), ("output_tokens_per_s", "throughput_drop", ""),
         ("tokens_per_joule", "tokens_per_joule_drop", ""))
"""Profile keys that must not drop by more than a share."""
TEMPERATURE = "temperature_celsius_max"
COMPARED = (*(key for key, _, _ in RISES + DROPS), TEMPERATURE)


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
    """What got worse beyond the limits, one sentence each (empty: no regression). A figure missing on either
    side is not compared (see :func:`uncompared`)."""
    found = []
    for key, limit, unit in RISES:
        before, after, share = baseline.get(key), now.get(key), getattr(limits, limit)
        if before and after is not None and after > before * (1 + share):
            found.append(f"{key} {after:.4g}{unit} is {after / before - 1:+.0%} against {before:.4g}{unit} "
                         f"(limit +{share:.0%})")
    for key, limit, unit in DROPS:
        before, after, share = baseline.get(key), now.get(key), getattr(limits, limit)
        if before and after is not None and after < before * (1 - share):
            found.append(f"{key} {after:.4g}{unit} is {after / before - 1:+.0%} against {before:.4g}{unit} "
                         f"(limit -{share:.0%})")
    before, after = baseline.get(TEMPERATURE), now.get(TEMPERATURE)
    if before is not None and after is not None and after > before + limits.temperature_rise_c:
        found.append(f"{TEMPERATURE} {after:.4g} °C is {after - before:+.3g} °C against {before:.4g} °C "
                     f"(limit +{limits.temperature_rise_c:g} °C)")
    return found


def uncompared(baseline: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The compared figures missing from the baseline or from this run (no NVML reading, say)."""
    return [key for key in COMPARED if baseline.get(key) is None or now.get(key) is None]


__all__ = ["COMPARED", "Limits", "load", "regressions", "save", "uncompared"]

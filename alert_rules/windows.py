"""Multi-window, multi-burn-rate alert windows (SRE workbook ch. 5), with factors derived from intent.

Each window pair says which share of the error budget may be spent in its long window before
it alerts; the burn-rate factor is derived from that share and the SLO period (Sloth's way), and
every threshold is computed in decimal arithmetic from the config's ratios, then written as a
float literal. So 14.4 x (1 - 0.999) is 0.0144 exactly as a decimal, the same float everywhere
(generated rules, promtool tests, the embedded evaluator), and an error ratio equal to the
threshold never fires (the comparison is a strict ``>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from alert_rules.spec import Severity

HOUR = 3600
DAY = 24 * HOUR


@dataclass(frozen=True, slots=True)
class WindowPair:
    """A long window, its short companion (1/12 of it) and the budget share it may spend."""

    severity: Severity
    long_s: int
    short_s: int
    budget_share: Decimal

    def factor(self, period_days: int) -> Decimal:
        """Burn-rate factor: the budget share spent over the long window, scaled to the SLO period."""
        return self.budget_share * Decimal(period_days * DAY) / Decimal(self.long_s)


PAGE_FAST = WindowPair(Severity.CRITICAL, 1 * HOUR, 5 * 60, Decimal("0.02"))
PAGE_SLOW = WindowPair(Severity.CRITICAL, 6 * HOUR, 30 * 60, Decimal("0.05"))
TICKET = WindowPair(Severity.WARNING, 3 * DAY, 6 * HOUR, Decimal("0.10"))

WINDOW_PAIRS: tuple[WindowPair, ...] = (PAGE_FAST, PAGE_SLOW, TICKET)
"""Workbook Table 5-8 for a 30-day period: page 14.4x (1h & 5m) or 6x (6h & 30m), ticket 1x (3d & 6h)."""


def budget(objective: float) -> Decimal:
    """The error budget of an objective given as a ratio (0.999 -> 0.001), exact in decimal."""
    return Decimal(1) - Decimal(repr(float(objective)))


def threshold(pair: WindowPair, objective: float, period_days: int) -> float:
    """The error-ratio threshold of a window pair: factor x budget, computed one way only."""
    return float(pair.factor(period_days) * budget(objective))


def windows_used(pairs: tuple[WindowPair, ...] = WINDOW_PAIRS) -> tuple[int, ...]:
    """Every window length (seconds) the pairs need, shortest first."""
    return tuple(sorted({w for p in pairs for w in (p.long_s, p.short_s)}))


def long_windows(pairs: tuple[WindowPair, ...] = WINDOW_PAIRS) -> tuple[int, ...]:
    """The long window of each pair (seconds), shortest first: where the burn alerts count their requests."""
    return tuple(sorted({p.long_s for p in pairs}))


def detection_time_s(
    pair: WindowPair, objective: float, period_days: int, error_ratio: float
) -> float | None:
    """Workbook detection time of a constant error ratio from a clean start; None when it never fires."""
    limit = pair.factor(period_days) * budget(objective)
    error = Decimal(repr(float(error_ratio)))
    if error <= limit:
        return None
    return float(limit / error * Decimal(pair.long_s))


__all__ = [
    "PAGE_FAST", "PAGE_SLOW", "TICKET", "WINDOW_PAIRS", "WindowPair", "budget", "detection_time_s",
    "long_windows", "threshold", "windows_used",
]

"""The showback report's PNGs, drawn with matplotlib (no pyplot state), in the load-test report's palette.

``usage_by_tenant.png``: GPU-seconds and tokens per tenant, stacked by cost pool.
``cost_share.png``: cost per tenant stacked by cost pool, and each tenant's share of the total.
At most :data:`TOP_TENANTS` tenants are drawn; the rest are summed as one bar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from exporters.cost import POOLS
from serving.loadtest.plots import DPI, PALETTE

TOP_TENANTS = 20
REST = "(the rest)"


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _by_tenant_and_pool(document: dict[str, Any], figure: str) -> tuple[list[str], dict[str, list[float]]]:
    """Tenants in the report's order (the top ones, then the rest) and each pool's ``figure`` per tenant."""
    order = [row["tenant"] for row in document["by_tenant"]]
    shown = order[:TOP_TENANTS]
    names = shown + ([REST] if len(order) > TOP_TENANTS else [])
    values = {pool: [0.0] * len(names) for pool in POOLS}
    for row in document["rows"]:
        index = shown.index(row["tenant"]) if row["tenant"] in shown else len(shown)
        values.setdefault(row["pool"], [0.0] * len(names))[index] += row[figure]
    return names, values


def _stacked(axes: Any, names: list[str], values: dict[str, list[float]], label: str, *, legend: bool) -> None:
    """Horizontal bars per tenant, one segment per cost pool that has any (the pools keep their colours)."""
    left = [0.0] * len(names)
    drawn = 0
    for colour, (pool, widths) in zip(PALETTE, values.items(), strict=False):
        if not any(widths):
            continue
        axes.barh(names, widths, left=left, color=colour, label=pool)
        left = [a + b for a, b in zip(left, widths, strict=True)]
        drawn += 1
    axes.set_xlabel(label)
    axes.locator_params(axis="x", nbins=5)
    if legend and drawn:
        axes.legend(title="cost pool", loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=drawn, frameon=False)


def draw_all(document: dict[str, Any], directory: Path) -> list[str]:
    """Draw both plots into ``directory``; their file names."""
    if not document["rows"]:
        return []
    height = 2.2 + 0.35 * min(len(document["by_tenant"]), TOP_TENANTS + 1)
    title = f"{document['from'][:16]} to {document['to'][:16]}"

    figure = _figure(12, height)
    gpu_axes, token_axes = figure.subplots(1, 2, sharey=True)
    names, gpu = _by_tenant_and_pool(document, "gpu_seconds")
    gpu_axes.invert_yaxis()  # the most expensive tenant on top (the axes share y: inverted once)
    _stacked(gpu_axes, names, gpu, "GPU-seconds", legend=True)
    _, prompt = _by_tenant_and_pool(document, "prompt_tokens")
    _, completion = _by_tenant_and_pool(document, "completion_tokens")
    tokens = {pool: [a + b for a, b in zip(prompt[pool], completion[pool], strict=True)] for pool in prompt}
    _stacked(token_axes, names, tokens, "tokens (prompt + completion)", legend=False)
    figure.suptitle(f"Usage by tenant and cost pool, {title}")
    figure.savefig(directory / "usage_by_tenant.png", dpi=DPI, format="png")

    figure = _figure(12, height)
    cost_axes, share_axes = figure.subplots(1, 2, sharey=True)
    currency = document["currency"]
    names, cost = _by_tenant_and_pool(document, "cost")
    cost_axes.invert_yaxis()
    _stacked(cost_axes, names, cost, f"cost ({currency})", legend=True)
    total = document["totals"]["cost"]
    shares = [sum(pool[i] for pool in cost.values()) / total * 100 if total else 0.0 for i in range(len(names))]
    share_axes.barh(names, shares, color="#7f7f7f")  # grey: a share, not a pool
    share_axes.set_xlabel("share of the total cost (%)")
    for index, share in enumerate(shares):
        share_axes.annotate(f"{share:.1f}%", (share, index), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=8)
    figure.suptitle(f"Cost by tenant and cost pool, and cost share, {title} (total {total:,.4f} {currency})")
    figure.savefig(directory / "cost_share.png", dpi=DPI, format="png")
    return ["usage_by_tenant.png", "cost_share.png"]

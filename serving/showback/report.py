"""A showback report: rows of usage by tenant, model and cost pool, their totals, and the files written.

Every figure in ``totals``, ``by_tenant`` and ``by_pool`` is the sum of the rows (summed in one
order, so the JSON and CSV add up exactly); the Markdown rounds for reading.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import asdict, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from exporters.files import write_atomic
from exporters.usage_ledger import Key, Usage

SCHEMA = "inferwatch.showback/1"
FIGURES = tuple(field.name for field in fields(Usage))
COLUMNS = ("tenant", "model", "pool", *FIGURES)


def _total(rows: list[Usage]) -> Usage:
    total = Usage()
    for row in rows:
        total.add(row)
    return total


def _grouped(rows: dict[Key, Usage], by: Callable[[Key], str]) -> dict[str, Usage]:
    groups: dict[str, list[Usage]] = {}
    for key, usage in sorted(rows.items()):
        groups.setdefault(by(key), []).append(usage)
    return {name: _total(group) for name, group in groups.items()}


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(round(unix), UTC).isoformat().replace("+00:00", "Z")


def build_report(rows: dict[Key, Usage], start: float, end: float, currency: str, source: str) -> dict[str, Any]:
    """The report document (schema ``inferwatch.showback/1``)."""
    ordered = sorted(rows.items())
    totals = _total([usage for _, usage in ordered])
    by_tenant = _grouped(rows, lambda key: key[0])
    tenants = sorted(by_tenant.items(), key=lambda item: (-item[1].cost, -item[1].gpu_seconds, item[0]))
    return {
        "schema": SCHEMA, "source": source, "currency": currency,
        "from": _iso(start), "to": _iso(end),
        "rows": [{"tenant": t, "model": m, "pool": p, **asdict(u)} for (t, m, p), u in ordered],
        "by_tenant": [{"tenant": name, **asdict(usage), "cost_share": _share(usage.cost, totals.cost),
                       "gpu_share": _share(usage.gpu_seconds, totals.gpu_seconds)} for name, usage in tenants],
        "by_pool": [{"pool": name, **asdict(usage)} for name, usage in _grouped(rows, lambda key: key[2]).items()],
        "totals": asdict(totals),
    }


def to_csv(document: dict[str, Any]) -> str:
    """One line per row, then a ``total`` line."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in document["rows"]:
        writer.writerow([row[column] for column in COLUMNS])
    writer.writerow(["total", "", "", *(document["totals"][name] for name in FIGURES)])
    return out.getvalue()


def _money(value: float) -> str:
    return f"{value:,.4f}"


def to_markdown(document: dict[str, Any], plots: list[str]) -> str:
    """The report for people: totals, tenants with their share, pools, every row, the plots."""
    currency, totals = document["currency"], document["totals"]
    lines = [
        f"# Showback {document['from']} to {document['to']}", "",
        f"Source: {document['source']}. Costs in {currency}. GPU-seconds: vLLM's own prefill time plus decode time "
        "shared with the running batch (stat-logger plugin); of them "
        f"{totals['gpu_seconds_estimated']:,.1f} s are the token-based estimate (requests without the plugin).", "",
        f"**Total: {totals['requests']:,} requests, {totals['prompt_tokens']:,} prompt and "
        f"{totals['completion_tokens']:,} completion tokens ({totals['cached_prompt_tokens']:,} prompt tokens from the "
        f"prefix cache), {totals['gpu_seconds']:,.1f} GPU-seconds, cost {_money(totals['cost'])} {currency}.** "
        f"The prefix cache saved {_money(totals['prefix_cache_saved_cost'])} {currency}; "
        f"{totals['repeat_requests']:,} requests repeated a prompt answered in the answer-cache TTL, "
        f"{totals['repeat_saved_tokens']:,} tokens an answer cache would have saved.", "",
        "## By tenant", "",
        "| tenant | requests | prompt tokens | completion tokens | GPU-seconds | cost | cost share |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {t['tenant']} | {t['requests']:,} | {t['prompt_tokens']:,} | {t['completion_tokens']:,} | "
              f"{t['gpu_seconds']:,.2f} | {_money(t['cost'])} | {t['cost_share']:.1%} |" for t in document["by_tenant"]]
    lines += ["", "## By cost pool", "", "| pool | requests | GPU-seconds | cost |", "|---|---:|---:|---:|"]
    lines += [f"| {p['pool']} | {p['requests']:,} | {p['gpu_seconds']:,.2f} | {_money(p['cost'])} |"
              for p in document["by_pool"]]
    lines += ["", "## Every tenant, model and pool", "",
              "| tenant | model | pool | requests | prompt | completion | cached | GPU-s | cost | repeats |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['tenant']} | {r['model']} | {r['pool']} | {r['requests']:,} | {r['prompt_tokens']:,} | "
              f"{r['completion_tokens']:,} | {r['cached_prompt_tokens']:,} | {r['gpu_seconds']:,.2f} | "
              f"{_money(r['cost'])} | {r['repeat_requests']:,} |" for r in document["rows"]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def write_report(document: dict[str, Any], directory: Path, *, plots: bool = True) -> list[str]:
    """Write report.json, report.csv, report.md and (with matplotlib) the PNGs; the names written."""
    directory.mkdir(parents=True, exist_ok=True)
    drawn: list[str] = []
    if plots:
        from serving.showback.plots import draw_all  # matplotlib, only when plots are asked for

        drawn = draw_all(document, directory)
    document = {**document, "plots": drawn}
    write_atomic(directory / "report.json", json.dumps(document, indent=2) + "\n")
    write_atomic(directory / "report.csv", to_csv(document))
    write_atomic(directory / "report.md", to_markdown(document, drawn))
    return ["report.md", "report.csv", "report.json", *drawn]

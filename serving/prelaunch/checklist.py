"""The checklist's items (pass, fail or manual, with their evidence) and the report files they make."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERDICTS = ("pass", "fail", "manual")


@dataclass(frozen=True, slots=True)
class Item:
    """One line of the launch checklist: what it asks, the verdict, a one-sentence finding and the numbers."""

    key: str
    line: str
    verdict: str
    finding: str
    evidence: dict[str, Any] = field(default_factory=dict)
    trace_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"item {self.key}: verdict {self.verdict!r} is not one of {', '.join(VERDICTS)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"key": self.key, "line": self.line, "verdict": self.verdict, "finding": self.finding,
                "evidence": self.evidence, "trace_ids": list(self.trace_ids)}


def document(items: Sequence[Item], *, url: str, model: str, started_unix: float, wall_s: float,
             warnings: Sequence[str] = ()) -> dict[str, Any]:
    """The checklist as one JSON document (what checklist.json holds)."""
    counts = {verdict: sum(1 for i in items if i.verdict == verdict) for verdict in VERDICTS}
    return {"url": url, "model": model, "started_unix": started_unix, "wall_s": wall_s, "counts": counts,
            "warnings": list(warnings), "items": [i.to_dict() for i in items]}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(_cell(v) for v in value)
    return str(value)


def markdown(doc: dict[str, Any]) -> str:
    """checklist.md: readable on its own (the target, a summary table, then each item with its evidence)."""
    counts = doc["counts"]
    lines = [f"# Launch checklist: {doc['model']} at {doc['url']}", "",
             f"{counts['pass']} pass, {counts['fail']} fail, {counts['manual']} to check by hand "
             f"({doc['wall_s']:.0f} s). `pass`/`fail` were measured; `manual` says what to check and how.", ""]
    lines += [f"- warning: {w}" for w in doc["warnings"]]
    lines += ["", "| # | checklist line | verdict | finding |", "|---|---|---|---|"]
    for number, item in enumerate(doc["items"], 1):
        lines.append(f"| {number} | {item['line']} | **{item['verdict']}** | {item['finding']} |")
    for number, item in enumerate(doc["items"], 1):
        lines += ["", f"## {number}. {item['line']}: {item['verdict']}", "", item["finding"], ""]
        lines += [f"- {key}: {_cell(value)}" for key, value in item["evidence"].items()]
        if item["trace_ids"]:
            lines.append(f"- trace ids to look at (`inferwatch explain ID`): {', '.join(item['trace_ids'])}")
    return "\n".join(lines) + "\n"


def write(directory: Path, doc: dict[str, Any]) -> list[Path]:
    """Write checklist.json and checklist.md into ``directory`` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "checklist.json", directory / "checklist.md"]
    paths[0].write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    paths[1].write_text(markdown(doc))
    return paths


def exit_code(items: Sequence[Item]) -> int:
    """0 when no item failed, else 1."""
    return 1 if any(i.verdict == "fail" for i in items) else 0


__all__ = ["VERDICTS", "Item", "document", "exit_code", "markdown", "write"]

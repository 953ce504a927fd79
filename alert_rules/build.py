"""Write everything ``inferwatch rules build`` produces: rule files, alertmanager.yml, promtool tests, runbooks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alert_rules.alertmanager import alertmanager_config
from alert_rules.config import RulesConfig
from alert_rules.render import build_groups, rule_files, to_yaml
from alert_rules.runbooks import runbooks_markdown
from alert_rules.testgen import promtool_files
from exporters.files import write_atomic
from exporters.records import DEFAULT_LENGTH_EDGES


def _write(path: Path, text: str) -> Path:
    """Write atomically (see :func:`exporters.files.write_atomic`)."""
    write_atomic(path, text)
    return path


def outputs(rules: RulesConfig, length_edges: tuple[int, ...] = DEFAULT_LENGTH_EDGES) -> dict[str, str]:
    """Relative path -> file content of every output, without touching the disk."""
    groups = build_groups(rules, length_edges)
    files: dict[str, Any] = {f"rules/{name}.yml": data for name, data in rule_files(rules, length_edges).items()}
    files["alertmanager.yml"] = alertmanager_config(rules)
    for alert, data in promtool_files(rules, groups, length_edges, "../rules").items():
        files[f"tests/{alert}.yml"] = data
    out = {path: to_yaml(data) for path, data in files.items()}
    out["docs/runbooks.md"] = runbooks_markdown(rules, tuple(a for g in groups for a in g.alerts()))
    return out


def write_all(settings: Any, out_dir: Path) -> list[Path]:
    """Write every output under ``out_dir`` and return the paths written.

    ``settings`` is duck-typed: it needs ``.rules`` (RulesConfig) and ``.serve.length_bucket_edges``.
    """
    edges = tuple(settings.serve.length_bucket_edges)
    return [_write(Path(out_dir) / rel, text) for rel, text in outputs(settings.rules, edges).items()]


__all__ = ["outputs", "write_all"]

"""Promtool-format tests written beside the built rules, for the embedded evaluator and real promtool alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from alert_rules.build import outputs
from alert_rules.config import RulesConfig
from exporters.files import write_atomic


def write_rule_test(root: Path, config: RulesConfig, name: str, doc: dict[str, Any]) -> Path:
    """Write ``config``'s built rules under ``root`` and ``doc`` as ``root/tests/NAME``; return the test's path.

    ``doc`` refers to the rule files as ``../rules/*.yml``, as the generated tests do.
    """
    for rel, text in outputs(config).items():
        write_atomic(root / rel, text)
    path = root / "tests" / name
    write_atomic(path, yaml.safe_dump(doc, sort_keys=False, width=1000))
    return path

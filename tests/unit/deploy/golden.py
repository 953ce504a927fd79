"""Golden files under tests/data/kubernetes/: compared byte for byte, rewritten on request.

Regenerate with ``INFERWATCH_UPDATE_GOLDEN=1`` in the environment of the test run that compares
them (the tests that use a golden name the command in their docstring); review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "data" / "kubernetes"
UPDATE = os.environ.get("INFERWATCH_UPDATE_GOLDEN", "") == "1"


def assert_golden(name: str, text: str) -> None:
    """``text`` equals the golden file ``name``; with INFERWATCH_UPDATE_GOLDEN=1, it becomes it."""
    path = GOLDEN_DIR / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"{path} is missing: rerun with INFERWATCH_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden: rerun with INFERWATCH_UPDATE_GOLDEN=1 and review"


__all__ = ["GOLDEN_DIR", "UPDATE", "assert_golden"]

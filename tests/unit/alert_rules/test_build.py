"""write_all: every output file under the output folder, nothing printed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alert_rules.build import write_all
from serving.config import defaults


def test_write_all_writes_rules_alertmanager_tests_and_runbooks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The returned paths exist, cover the four kinds of output, and nothing is printed."""
    paths = write_all(defaults(), tmp_path)
    rel = {p.relative_to(tmp_path).as_posix() for p in paths}
    assert {"rules/slo.yml", "rules/intervene.yml", "alertmanager.yml", "docs/runbooks.md"} <= rel
    assert any(r.startswith("tests/") for r in rel)
    assert all(p.is_file() for p in paths)
    assert capsys.readouterr() == ("", "")


def test_test_files_point_at_the_written_rule_files(tmp_path: Path) -> None:
    """Each promtool file's rule_files resolve, relative to the test file, to written rule files."""
    write_all(defaults(), tmp_path)
    for test in (tmp_path / "tests").glob("*.yml"):
        for rule_file in yaml.safe_load(test.read_text())["rule_files"]:
            assert (test.parent / rule_file).resolve().is_file()


def test_write_all_is_repeatable(tmp_path: Path) -> None:
    """Writing twice gives identical bytes (generated files can be diffed)."""
    first = {p: p.read_bytes() for p in write_all(defaults(), tmp_path / "a")}
    second = {p: p.read_bytes() for p in write_all(defaults(), tmp_path / "b")}
    assert list(first.values()) == list(second.values())

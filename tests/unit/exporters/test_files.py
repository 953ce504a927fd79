"""Crash-safe writes leave files as readable as a plain open() would."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from exporters.files import FILE_MODE, write_atomic
from serving.cli import main


def test_the_mode_is_what_open_gives(tmp_path: Path) -> None:
    write_atomic(tmp_path / "atomic.yml", "a: 1\n")
    (tmp_path / "plain.yml").write_text("a: 1\n")
    modes = {stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in ("atomic.yml", "plain.yml")}
    assert modes == {FILE_MODE}


def test_built_rules_are_readable_by_other_users(tmp_path: Path) -> None:
    """Prometheus and Alertmanager run as nobody in their images and mount what `rules build` wrote."""
    old = os.umask(0o022)
    try:
        assert main(["rules", "build", "--out", str(tmp_path)]) == 0
    finally:
        os.umask(old)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    assert all(os.stat(p).st_mode & stat.S_IROTH for p in files), "a built file is not readable by others"

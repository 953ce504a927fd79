"""Segment file names and the listing of an archive directory.

A segment is written as ``<name>.izst.open`` and published, when finished, by an atomic rename
to ``<name>.izst`` after its index ``<name>.izsx`` was written. Names start with the UTC start
time, so sorting them sorts segments by age.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from log_pipeline.errors import ArchiveError

SEGMENT_SUFFIX = ".izst"
OPEN_SUFFIX = ".izst.open"
INDEX_SUFFIX = ".izsx"


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One segment of an archive: its path, whether it is finished, and its index path."""

    path: Path
    finished: bool

    @property
    def name(self) -> str:
        """The segment's name without suffixes."""
        suffix = SEGMENT_SUFFIX if self.finished else OPEN_SUFFIX
        return self.path.name[: -len(suffix)]

    @property
    def index_path(self) -> Path:
        """Where this segment's index lives (it exists only once the segment is finished)."""
        return self.path.with_name(self.name + INDEX_SUFFIX)


def archive_dir(directory: str | os.PathLike[str], *, create: bool = False) -> Path:
    """Resolve an archive directory; raises ArchiveError when it is missing or not a directory."""
    path = Path(directory)
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ArchiveError(str(path), f"cannot create the archive directory: {err.strerror}") from err
    if not path.exists():
        raise ArchiveError(str(path), "archive directory does not exist")
    if not path.is_dir():
        raise ArchiveError(str(path), "is not a directory")
    return path.resolve()


def inside(root: Path, path: Path) -> Path:
    """``path`` resolved, refusing one that leads outside ``root`` (a symlink, for instance)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ArchiveError(str(path), f"resolves to {resolved}, outside the archive directory {root}")
    return resolved


def list_segments(root: Path) -> list[SegmentFile]:
    """Every segment of an archive, oldest first (finished and open ones, by name)."""
    found: list[SegmentFile] = []
    for entry in os.scandir(root):
        if entry.name.endswith(SEGMENT_SUFFIX):
            found.append(SegmentFile(root / entry.name, True))
        elif entry.name.endswith(OPEN_SUFFIX):
            found.append(SegmentFile(root / entry.name, False))
    return sorted(found, key=lambda s: (s.name, s.finished))

"""Errors raised by the log archive."""

from __future__ import annotations

from exporters.errors import InferwatchError


class ArchiveError(InferwatchError, ValueError):
    """An archive directory or file cannot be used.

    Attributes:
        path: the file or directory concerned.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class CorruptFrameError(ArchiveError):
    """A frame of a segment is damaged: bad header, checksum mismatch or undecodable payload.

    Attributes:
        offset: byte offset of the frame in its segment file.
    """

    def __init__(self, path: str, offset: int, problem: str) -> None:
        self.offset = offset
        super().__init__(path, f"frame at byte {offset}: {problem}")

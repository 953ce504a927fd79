"""Reading one segment: frames in order, each checked, with a torn or damaged tail tolerated.

A killed writer leaves complete frames followed by at most one partial frame. The reader
reports the partial frame through ``on_problem`` and keeps everything before it. A frame
damaged in the middle (checksum mismatch) is reported and skipped; reading resumes at the
next frame whose header checksum holds, so no record is ever made up from damaged bytes.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from log_pipeline import frames
from log_pipeline.errors import ArchiveError, CorruptFrameError

Problem = Callable[[str], None]
_MAGIC = frames.SKIPPABLE_MAGIC.to_bytes(4, "little")


def _ignore(_message: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Frame:
    """One intact frame: where it starts, its header and its compressed payload."""

    offset: int
    header: frames.FrameHeader
    payload: bytes
    binary: bytes = b""

    @property
    def end(self) -> int:
        """Byte offset just past this frame."""
        return self.offset + frames.FRAME_OVERHEAD + self.header.comp_len + self.header.bin_len


class SegmentReader:
    """Random and sequential access to the frames of one segment file."""

    def __init__(self, path: Path, *, on_problem: Problem = _ignore) -> None:
        self.path = path
        self._on_problem = on_problem
        self._dicts: dict[int, zstandard.ZstdDecompressor] = {}
        self._plain = zstandard.ZstdDecompressor()
        try:
            with open(path, "rb") as handle:
                self.size = os.fstat(handle.fileno()).st_size
                self._data: mmap.mmap | bytes = (
                    mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if self.size else b""
                )
        except OSError as err:
            raise ArchiveError(str(path), f"cannot read segment: {err.strerror}") from err
        if self.size >= 4 and self._data[:4] != _MAGIC:
            self.close()
            raise ArchiveError(str(path), "not an inferwatch archive segment (no frame header at byte 0)")
        version = frames.header_version(self._data[:frames.FRAME_OVERHEAD])
        if version is not None and version != frames.VERSION:
            self.close()
            raise ArchiveError(
                str(path), f"archive segment format version {version}; this inferwatch reads version {frames.VERSION}"
            )

    def close(self) -> None:
        """Release the file mapping."""
        if isinstance(self._data, mmap.mmap):
            self._data.close()

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _read(self, offset: int) -> Frame:
        """The intact frame at ``offset``; raises CorruptFrameError (``truncated`` in its text at the end)."""
        head = self._data[offset:offset + frames.FRAME_OVERHEAD]
        if len(head) < frames.FRAME_OVERHEAD:
            raise CorruptFrameError(str(self.path), offset, f"truncated header ({len(head)} bytes)")
        try:
            header = frames.unpack_header(head)
        except ValueError as err:
            raise CorruptFrameError(str(self.path), offset, str(err)) from err
        start = offset + frames.FRAME_OVERHEAD
        size = header.comp_len + header.bin_len
        body = self._data[start:start + size]
        if len(body) < size:
            raise CorruptFrameError(str(self.path), offset, f"truncated payload ({len(body)} of {size} bytes)")
        if zlib.crc32(body) != header.payload_crc:
            raise CorruptFrameError(str(self.path), offset, "payload checksum mismatch")
        return Frame(offset, header, body[:header.comp_len], body[header.comp_len:])

    def _resync(self, offset: int) -> int | None:
        """The offset of the next frame after ``offset`` whose header is intact, or None."""
        position = offset
        while True:
            position = self._data.find(_MAGIC, position + 1)
            if position < 0:
                return None
            try:
                frames.unpack_header(self._data[position:position + frames.FRAME_OVERHEAD])
            except ValueError:
                continue
            return position

    def frames(self, start: int = 0) -> Iterator[Frame]:
        """Every intact frame from ``start``, in file order; damage is reported, never raised."""
        offset = start
        while offset < self.size:
            try:
                frame = self._read(offset)
            except CorruptFrameError as err:
                following = self._resync(offset)
                if following is None:
                    lost = self.size - offset
                    self._on_problem(f"{err}; ignoring the last {lost} bytes (torn tail: writer killed?)")
                    return
                self._on_problem(f"{err}; skipping {following - offset} bytes to the next intact frame")
                offset = following
                continue
            yield frame
            offset = frame.end

    def frame_at(self, offset: int) -> Frame:
        """The intact frame at ``offset`` (from an index); raises CorruptFrameError."""
        return self._read(offset)

    def _decompressor(self, dict_id: int, before: int) -> zstandard.ZstdDecompressor:
        if dict_id == 0:
            return self._plain
        found = self._dicts.get(dict_id)
        if found is None:
            for frame in self.frames():
                if frame.offset >= before:
                    break
                if frame.header.kind == frames.KIND_DICTIONARY and frame.header.dict_id == dict_id:
                    self.load_dictionary(frame)
                    found = self._dicts[dict_id]
                    break
            else:
                found = None
            if found is None:
                raise CorruptFrameError(str(self.path), before, f"its dictionary {dict_id} is missing")
        return found

    def load_dictionary(self, frame: Frame) -> None:
        """Remember the dictionary a dictionary frame carries."""
        try:
            data = self._plain.decompress(frame.payload, max_output_size=frame.header.raw_len)
        except zstandard.ZstdError as err:
            raise CorruptFrameError(str(self.path), frame.offset, f"undecodable dictionary: {err}") from err
        self._dicts[frame.header.dict_id] = zstandard.ZstdDecompressor(
            dict_data=zstandard.ZstdCompressionDict(data)
        )

    def records(self, frame: Frame) -> list[dict[str, Any]]:
        """Decode the records of a records frame; raises CorruptFrameError when it cannot."""
        if frame.header.kind != frames.KIND_RECORDS:
            return []
        decompressor = self._decompressor(frame.header.dict_id, frame.offset)
        try:
            raw = decompressor.decompress(frame.payload, max_output_size=frame.header.raw_len)
            rows = frames.decode_records(raw, frame.binary)
        except (zstandard.ZstdError, ValueError, UnicodeDecodeError) as err:
            raise CorruptFrameError(str(self.path), frame.offset, f"undecodable payload: {err}") from err
        if len(rows) != frame.header.n_records:
            raise CorruptFrameError(
                str(self.path), frame.offset, f"{len(rows)} records, header says {frame.header.n_records}"
            )
        return rows

    def may_hold(self, frame: Frame, key: bytes) -> bool:
        """False when the frame carries its trace ids raw and ``key`` (a 16-byte hex id) is not among them."""
        if not frame.header.flags & frames.FLAG_TRACE_IDS:
            return True
        ids = frame.binary[:frames.TRACE_ID_BYTES * frame.header.n_records]
        position = ids.find(key)
        while position >= 0 and position % frames.TRACE_ID_BYTES:
            position = ids.find(key, position + 1)
        return position >= 0

    def iter_records(self) -> Iterator[tuple[Frame, list[dict[str, Any]]]]:
        """Every decodable records frame with its records; undecodable frames are reported."""
        for frame in self.frames():
            try:
                if frame.header.kind == frames.KIND_DICTIONARY:
                    self.load_dictionary(frame)
                    continue
                rows = self.records(frame)
            except CorruptFrameError as err:
                self._on_problem(str(err))
                continue
            yield frame, rows

"""The per-segment trace_id index: sorted 32-bit trace id prefixes pointing at frames.

File layout (little-endian), written once when a segment is published::

    header  "IWIX", u8 version, 3 pad, u32 n_entries, u32 n_frames, i64 ts_min_ms, i64 ts_max_ms
    u32 keys[n_entries]          sorted
    u16 frames[n_entries]        frame number of each key
    u32 offsets[n_frames]        byte offset of each records frame in the segment
    u32 crc32 of all of the above

A lookup maps the file, bisects the keys and reads only the frames it names. A 32-bit prefix
can collide, so the reader still compares the whole trace id of each record it decodes.
"""

from __future__ import annotations

import array
import bisect
import hashlib
import mmap
import os
import struct
import sys
import zlib
from collections.abc import Iterable
from pathlib import Path

from exporters.files import write_atomic
from log_pipeline.errors import ArchiveError

_HEADER = struct.Struct("<4sB3xIIqq")
_TAG = b"IWIX"
_VERSION = 1
MAX_FRAMES = 65535
_HEX = frozenset("0123456789abcdefABCDEF")


def index_key(trace_id: str) -> int:
    """The 32-bit index key of a trace id: its first 8 hex digits, or a hash of a malformed id."""
    if len(trace_id) == 32 and _HEX.issuperset(trace_id):
        return int(trace_id[:8], 16)
    digest = hashlib.blake2b(trace_id.encode("utf-8", "surrogatepass"), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def _le_array(code: str, values: Iterable[int]) -> bytes:
    data = array.array(code, values)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes()


def write_index(
    path: Path, entries: list[tuple[int, int]], frame_offsets: list[int], ts_min_ms: int, ts_max_ms: int
) -> int:
    """Write an index file atomically (temp file, fsync, rename); returns its size in bytes."""
    if len(frame_offsets) > MAX_FRAMES:
        raise ValueError(f"a segment has at most {MAX_FRAMES} frames, got {len(frame_offsets)}")
    entries = sorted(entries)
    body = b"".join((
        _HEADER.pack(_TAG, _VERSION, len(entries), len(frame_offsets), ts_min_ms, ts_max_ms),
        _le_array("I", (key for key, _ in entries)),
        _le_array("H", (frame for _, frame in entries)),
        _le_array("I", frame_offsets),
    ))
    data = body + struct.pack("<I", zlib.crc32(body))
    return write_atomic(path, data, fsync=True)


class SegmentIndex:
    """A read-only view of one index file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < _HEADER.size + 4:
                raise ArchiveError(str(path), "index file is truncated")
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        tag, version, n, n_frames, self.ts_min_ms, self.ts_max_ms = _HEADER.unpack_from(self._map)
        if tag != _TAG or version != _VERSION:
            raise ArchiveError(str(path), "not an inferwatch index file (bad tag or version)")
        expected = _HEADER.size + 4 * n + 2 * n + 4 * n_frames + 4
        if size != expected:
            raise ArchiveError(str(path), f"index file has {size} bytes, its header implies {expected}")
        self.n_entries = n
        self.n_frames = n_frames
        self._views: list[memoryview] = []
        start = _HEADER.size
        self._keys = self._view(start, n, "I")
        self._frames = self._view(start + 4 * n, n, "H")
        self._offsets = self._view(start + 6 * n, n_frames, "I")

    def _view(self, start: int, count: int, code: str) -> memoryview | array.array[int]:
        whole = memoryview(self._map)
        raw = whole[start:start + count * array.array(code).itemsize]
        self._views += [whole, raw]
        if sys.byteorder == "little":
            cast = raw.cast(code)
            self._views.append(cast)
            return cast
        data = array.array(code, raw.tobytes())
        data.byteswap()
        return data

    def verify(self) -> None:
        """Check the index checksum; raises ArchiveError on a mismatch."""
        body = self._map[:-4]
        (crc,) = struct.unpack_from("<I", self._map, len(self._map) - 4)
        if zlib.crc32(body) != crc:
            raise ArchiveError(str(self.path), "index checksum mismatch")

    def frame_offsets_for(self, trace_id: str) -> list[int]:
        """Byte offsets of the frames that may hold records of ``trace_id``, in file order."""
        key = index_key(trace_id)
        found: set[int] = set()
        position = bisect.bisect_left(self._keys, key)
        while position < self.n_entries and self._keys[position] == key:
            frame = self._frames[position]
            if frame >= self.n_frames:
                raise ArchiveError(str(self.path), f"index entry names frame {frame} of {self.n_frames}")
            found.add(self._offsets[frame])
            position += 1
        return sorted(found)

    def close(self) -> None:
        """Release the mapping."""
        for view in reversed(self._views):
            view.release()
        self._map.close()

    def __enter__(self) -> SegmentIndex:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

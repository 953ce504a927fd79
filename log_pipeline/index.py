"""The per-segment trace_id index: one Bloom filter per group of consecutive frames.

A segment's frames are cut into groups of about ``GROUP_RECORDS`` records; each group gets a
Bloom filter of its trace ids (``HASHES`` partitions of ``2**bits`` bits, about
``BITS_PER_KEY`` bits per record: about 1 % false positives). A lookup tests every group's
filter (a few bit tests each) and reads only the frames of the groups that may hold the id;
in those, frames that carry their trace ids raw (``frames.FLAG_TRACE_IDS``) are tested without
decompressing, and only a frame that holds the id is decoded. The reader compares the whole
trace id of every record it returns, so a false positive costs time, never a wrong answer.

File layout (little-endian), written once when a segment is published::

    header  "IWIX", u8 version, u8 hashes, 2 pad, u32 n_records, u32 n_frames, u32 n_groups,
            i64 ts_min_ms, i64 ts_max_ms
    u32 offsets[n_frames]            byte offset of each records frame in the segment
    groups[n_groups]                 u32 first frame, u8 bits, 3 pad
    filters                          per group, ``hashes`` partitions of 2**bits bits each
    u32 crc32 of all of the above

The key of a trace id is its 16 bytes when it is 32 lowercase hex digits, else a 16-byte
BLAKE2b digest of its text; partition ``j`` sets bit ``u16(key[4j:4j+2]) mod 2**bits``.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import zlib
from collections import deque
from collections.abc import Iterable
from itertools import repeat
from pathlib import Path

from exporters.files import write_atomic
from log_pipeline.errors import ArchiveError

_HEADER = struct.Struct("<4sBBxxIIIqq")
_GROUP = struct.Struct("<IB3x")
_TAG = b"IWIX"
_VERSION = 2
MAX_FRAMES = 65535
HASHES = 4
BITS_PER_KEY = 10
GROUP_RECORDS = 6553
"""Records per group: about 4 * 2**14 / BITS_PER_KEY, so a full group's partitions are 2**14 bits."""
KEY_BYTES = 16
_LANE_BITS = 16
_LANE = 1 << _LANE_BITS
_MIN_BITS = 6
_TO_DIGITS = bytes.maketrans(b"\x00\x01", b"01")
_EMPTY_MAP = bytes(_LANE)
_LANES: dict[int, struct.Struct] = {}


def trace_key(trace_id: str) -> bytes:
    """The 16-byte key of a trace id: its bytes for 32 lowercase hex digits, else a digest of its text."""
    if len(trace_id) == 2 * KEY_BYTES:
        try:
            raw = bytes.fromhex(trace_id)
        except ValueError:
            raw = b""
        if len(raw) == KEY_BYTES and raw.hex() == trace_id:
            return raw
    return hashlib.blake2b(trace_id.encode("utf-8", "surrogatepass"), digest_size=KEY_BYTES).digest()


def _lanes(n: int) -> struct.Struct:
    """The struct reading, from ``n`` keys, the low u16 of each of their ``HASHES`` 4-byte lanes."""
    lanes = _LANES.get(n)
    if lanes is None:
        lanes = struct.Struct("<" + "H2x" * (HASHES * n))
        if len(_LANES) < 1024:
            _LANES[n] = lanes
    return lanes


def _bits_for(records: int) -> int:
    """Partition size (log2) giving at least BITS_PER_KEY bits per record over HASHES partitions."""
    bits = _MIN_BITS
    while bits < _LANE_BITS and HASHES << bits < BITS_PER_KEY * records:
        bits += 1
    return bits


class IndexBuilder:
    """Collects frame offsets and trace keys of a segment and writes its index file."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.records = 0
        self._groups: list[tuple[int, int]] = []
        self._filters: list[bytes] = []
        self._maps = [bytearray(_LANE) for _ in range(HASHES)]
        self._group_first = 0
        self._group_records = 0

    def add_frame(self, offset: int, keys: bytes) -> None:
        """Add a records frame at ``offset`` whose records have these concatenated 16-byte keys."""
        n = len(keys) // KEY_BYTES
        if self._group_records and self._group_records + n > GROUP_RECORDS:
            self._close_group()
        self.offsets.append(offset)
        self.records += n
        self._group_records += n
        if n:
            values = _lanes(n).unpack(keys)
            for j, bytemap in enumerate(self._maps):
                deque(map(bytemap.__setitem__, values[j::HASHES], repeat(1)), 0)

    def _close_group(self) -> None:
        """Fold the group's byte maps into its Bloom filter and start the next group."""
        bits = _bits_for(self._group_records)
        mask = (1 << (1 << bits)) - 1
        for bytemap in self._maps:
            whole = int(bytemap.translate(_TO_DIGITS)[::-1], 2)  # bit i = byte i
            folded = 0
            for shift in range(0, _LANE, 1 << bits):
                folded |= (whole >> shift) & mask
            self._filters.append(folded.to_bytes((1 << bits) // 8, "little"))
            bytemap[:] = _EMPTY_MAP
        self._groups.append((self._group_first, bits))
        self._group_first = len(self.offsets)
        self._group_records = 0

    def write(self, path: Path, ts_min_ms: int, ts_max_ms: int) -> int:
        """Write the index file atomically (temp file, fsync, rename); returns its size in bytes."""
        if len(self.offsets) > MAX_FRAMES:
            raise ValueError(f"a segment has at most {MAX_FRAMES} frames, got {len(self.offsets)}")
        if self._group_first < len(self.offsets):
            self._close_group()
        body = b"".join((
            _HEADER.pack(_TAG, _VERSION, HASHES, self.records, len(self.offsets), len(self._groups),
                         ts_min_ms, ts_max_ms),
            struct.pack(f"<{len(self.offsets)}I", *self.offsets),
            b"".join(_GROUP.pack(first, bits) for first, bits in self._groups),
            *self._filters,
        ))
        return write_atomic(path, body + struct.pack("<I", zlib.crc32(body)), fsync=True)


def write_index(
    path: Path, frames: Iterable[tuple[int, bytes]], ts_min_ms: int, ts_max_ms: int
) -> int:
    """Write the index of ``(frame offset, concatenated trace keys)`` pairs; returns its size."""
    builder = IndexBuilder()
    for offset, keys in frames:
        builder.add_frame(offset, keys)
    return builder.write(path, ts_min_ms, ts_max_ms)


class SegmentIndex:
    """A read-only view of one index file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < _HEADER.size + 4:
                raise ArchiveError(str(path), "index file is truncated")
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(size)
        except BaseException:
            self._map.close()
            raise

    def _parse(self, size: int) -> None:
        tag, version, hashes, n, n_frames, n_groups, self.ts_min_ms, self.ts_max_ms = _HEADER.unpack_from(self._map)
        if tag != _TAG:
            raise ArchiveError(str(self.path), "not an inferwatch index file (bad tag)")
        if version != _VERSION or hashes != HASHES:
            raise ArchiveError(str(self.path), f"index format version {version} is not the one this inferwatch "
                                               f"reads ({_VERSION})")
        position = _HEADER.size
        table_end = position + 4 * n_frames + _GROUP.size * n_groups
        if table_end + 4 > size:
            raise ArchiveError(str(self.path), f"index file has {size} bytes, its header implies more")
        self.n_entries = n
        self.n_frames = n_frames
        self.offsets = list(struct.unpack_from(f"<{n_frames}I", self._map, position))
        position += 4 * n_frames
        self._groups: list[tuple[int, int, int, int]] = []  # first frame, end frame, bits, filter start
        filter_at = table_end
        for g in range(n_groups):
            first, bits = _GROUP.unpack_from(self._map, position + g * _GROUP.size)
            self._groups.append((first, n_frames, bits, filter_at))
            filter_at += HASHES * (1 << bits) // 8
            if self._groups[-1][0] > n_frames or not _MIN_BITS <= bits <= _LANE_BITS:
                raise ArchiveError(str(self.path), f"index group {g} is malformed")
        for g in range(n_groups - 1):
            first, _end, bits, at = self._groups[g]
            self._groups[g] = (first, self._groups[g + 1][0], bits, at)
        if filter_at + 4 != size:
            raise ArchiveError(str(self.path), f"index file has {size} bytes, its header implies {filter_at + 4}")

    def verify(self) -> None:
        """Check the index checksum; raises ArchiveError on a mismatch."""
        body = self._map[:-4]
        (crc,) = struct.unpack_from("<I", self._map, len(self._map) - 4)
        if zlib.crc32(body) != crc:
            raise ArchiveError(str(self.path), "index checksum mismatch")

    def frame_offsets_for(self, trace_id: str) -> list[int]:
        """Byte offsets of the frames that may hold records of ``trace_id``, in file order."""
        lanes = _lanes(1).unpack(trace_key(trace_id))
        data = self._map
        found: list[int] = []
        for first, end, bits, at in self._groups:
            mask = (1 << bits) - 1
            size = (1 << bits) >> 3
            for j, lane in enumerate(lanes):
                bit = lane & mask
                if not data[at + j * size + (bit >> 3)] >> (bit & 7) & 1:
                    break
            else:
                found.extend(self.offsets[first:end])
        return found

    def close(self) -> None:
        """Release the mapping."""
        self._map.close()

    def __enter__(self) -> SegmentIndex:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

"""Value types of the evaluator: label sets, instant vectors, range vectors."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence

Labels = tuple[tuple[str, str], ...]
"""A label set: (name, value) pairs sorted by name; ``__name__`` is an ordinary label here."""

Sample = tuple[Labels, float]
Vector = list[Sample]

NAME = "__name__"

_STALE_BITS = 0x7FF0000000000002
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", _STALE_BITS))[0]
"""Prometheus' stale marker: a NaN with a payload of its own."""


def is_stale(value: float) -> bool:
    """True when ``value`` is the stale marker (not merely any NaN)."""
    return math.isnan(value) and struct.unpack("<Q", struct.pack("<d", value))[0] == _STALE_BITS


def labels_of(mapping: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """Build a label set; empty values are dropped, as Prometheus does."""
    items = mapping.items() if isinstance(mapping, Mapping) else mapping
    return tuple(sorted((k, v) for k, v in items if v != ""))


def get(labels: Labels, name: str) -> str:
    """The value of one label, '' when absent."""
    for key, value in labels:
        if key == name:
            return value
    return ""


def drop_name(labels: Labels) -> Labels:
    """The label set without ``__name__``."""
    if labels and labels[0][0] == NAME:
        return labels[1:]
    return tuple(p for p in labels if p[0] != NAME)


def keep_only(labels: Labels, names: Sequence[str] | frozenset[str]) -> Labels:
    """Only the labels named."""
    return tuple(p for p in labels if p[0] in names)


def without(labels: Labels, names: Sequence[str] | frozenset[str]) -> Labels:
    """Every label except those named."""
    return tuple(p for p in labels if p[0] not in names)


def format_labels(labels: Labels) -> str:
    """PromQL text of a label set, ``name{a="b"}``."""
    name = get(labels, NAME)
    rest = ", ".join(f'{k}="{_escape(v)}"' for k, v in labels if k != NAME)
    return f"{name}{{{rest}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

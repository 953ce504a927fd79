"""Tokenizer drift: a fingerprint of an upstream's tokenizer, and how far two tokenizers disagree on texts.

A new model or vLLM version can bring another tokenizer under the same model name. The sidecar asks the
upstream's ``/tokenize`` for the token ids of a fixed probe set (:data:`PROBE_TEXTS`: emoji, CJK, code,
whitespace runs, long numbers, combining marks, plain text) and hashes them (:func:`fingerprint`): the same
tokenizer always gives the same fingerprint, and a tokenizer that splits any probe differently another one.

The diff-score of one text (:func:`diff_score`) is the edit distance between the two token-id sequences
(insertions, deletions and substitutions of one token each) divided by the longer sequence's length: 0 when
both tokenizers give the same ids, 1 when they share nothing; 0 for two empty sequences. A report's score
is the mean of its texts' scores. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

PROBE_TEXTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Emoji: 😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘😗☺️😚😙🥲😋😛 👨‍👩‍👧‍👦 🇯🇵🇫🇷 👍🏽",
    "CJK: 東京は日本の首都です。これはテストです。한국어 문장도 있습니다. 中文分词测试。",
    "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text if c not in '{}[]']\n",
    "Whitespace runs:\t\t\tthree tabs,     five spaces,\n\n\n\nfour newlines,  \u00a0 a no-break space.",
    "Long numbers: 3141592653589793238462643383279502884197 and 0.000000000123456789 and 1,234,567,890.",
    "Combining marks: e\u0301 vs \u00e9, n\u0303 vs \u00f1; Zalgo: Z\u0351\u036b\u0343a\u0310l\u0352g\u0307o.",
    "URLs and ids: https://example.com/v1/chat?q=%F0%9F%98%80&id=550e8400-e29b-41d4-a716-446655440000",
)
"""The fixed probe set of the fingerprint (changing it changes every fingerprint)."""


def fingerprint(token_ids: Sequence[Sequence[int]]) -> str:
    """The first 16 hex digits of the SHA-256 of the probes' token ids: each probe's ids in decimal joined by
    ``,``, the probes joined by ``\\n``, in :data:`PROBE_TEXTS` order."""
    text = "\n".join(",".join(map(str, ids)) for ids in token_ids)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
    """Levenshtein distance between two token-id sequences (one token inserted, deleted or replaced = 1)."""
    start = 0
    while start < len(a) and start < len(b) and a[start] == b[start]:
        start += 1
    end_a, end_b = len(a), len(b)
    while end_a > start and end_b > start and a[end_a - 1] == b[end_b - 1]:
        end_a, end_b = end_a - 1, end_b - 1
    a, b = a[start:end_a], b[start:end_b]
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def diff_score(a: Sequence[int], b: Sequence[int]) -> float:
    """The diff-score of one text: edit distance over the longer sequence's length (0 for two empty ones)."""
    longest = max(len(a), len(b))
    return edit_distance(a, b) / longest if longest else 0.0


@dataclass(frozen=True, slots=True)
class TextDiff:
    """One text of a diff: its score and both token counts."""

    text: str
    score: float
    tokens_a: int
    tokens_b: int


@dataclass(frozen=True, slots=True)
class DiffReport:
    """Per-text diff-scores of two tokenizers and their summary."""

    texts: tuple[TextDiff, ...]

    @property
    def score(self) -> float:
        """The mean of the texts' diff-scores (0 for no texts)."""
        return sum(t.score for t in self.texts) / len(self.texts) if self.texts else 0.0

    @property
    def max_score(self) -> float:
        """The worst text's diff-score."""
        return max((t.score for t in self.texts), default=0.0)

    @property
    def differing(self) -> int:
        """Texts the two tokenizers split differently."""
        return sum(1 for t in self.texts if t.score > 0)

    def worst(self, n: int) -> tuple[TextDiff, ...]:
        """The ``n`` texts with the highest scores, worst first (ties in input order)."""
        return tuple(sorted(self.texts, key=lambda t: -t.score)[:n])


def compare(texts: Sequence[str], ids_a: Sequence[Sequence[int]], ids_b: Sequence[Sequence[int]]) -> DiffReport:
    """The report of two tokenizers' ids for the same ``texts``."""
    return DiffReport(tuple(
        TextDiff(text, diff_score(a, b), len(a), len(b)) for text, a, b in zip(texts, ids_a, ids_b, strict=True)
    ))


__all__ = ["PROBE_TEXTS", "DiffReport", "TextDiff", "compare", "diff_score", "edit_distance", "fingerprint"]

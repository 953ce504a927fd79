"""Tokenizer fingerprints and diff-scores, checked against hand-counted edits and hashlib."""

from __future__ import annotations

import hashlib

from exporters.tokenizer_drift import PROBE_TEXTS, compare, diff_score, edit_distance, fingerprint


def test_the_probe_set_covers_the_texts_tokenizers_break_on() -> None:
    """Emoji, CJK, code, whitespace runs and long numbers are all in the probe set."""
    joined = "".join(PROBE_TEXTS)
    for piece in ("\U0001f600", "\u6771\u4eac", "def ", "\t\t\t", "     ", "3141592653589793238462643383279502884197"):
        assert piece in joined


def test_fingerprint_is_the_documented_hash() -> None:
    """Ids in decimal joined by commas, probes by newlines, SHA-256, 16 hex digits."""
    assert fingerprint([[1, 22], [333]]) == hashlib.sha256(b"1,22\n333").hexdigest()[:16]
    assert fingerprint([[1, 22], [333]]) != fingerprint([[1, 2, 2], [333]])


def test_edit_distance_counts_single_token_edits() -> None:
    """kitten/sitting as ids is 3 edits; a common prefix and suffix cost nothing."""
    kitten, sitting = [ord(c) for c in "kitten"], [ord(c) for c in "sitting"]
    assert edit_distance(kitten, sitting) == 3
    assert edit_distance([1, 2, 3, 4], [1, 9, 4]) == 2
    assert edit_distance([], [5, 6]) == 2
    assert edit_distance([7, 8], [7, 8]) == 0


def test_diff_score_is_edits_over_the_longer_length() -> None:
    """0 for the same ids (or two empty lists), 1 for nothing in common, 3/7 for kitten/sitting."""
    assert diff_score([1, 2], [1, 2]) == 0.0
    assert diff_score([], []) == 0.0
    assert diff_score([1, 2], [3, 4, 5]) == 1.0
    assert diff_score([ord(c) for c in "kitten"], [ord(c) for c in "sitting"]) == 3 / 7


def test_a_report_sums_up_its_texts() -> None:
    """The score is the mean of the texts' scores; the worst text comes first."""
    report = compare(["same", "half", "other"], [[1, 2], [1, 2], [1]], [[1, 2], [1, 3], [2]])
    assert report.score == (0 + 0.5 + 1) / 3
    assert report.max_score == 1.0
    assert report.differing == 2
    assert [t.text for t in report.worst(2)] == ["other", "half"]

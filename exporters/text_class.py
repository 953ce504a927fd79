"""The text class of a request's prompt: ``plain``, ``emoji_dense`` or ``cjk`` (a bounded label).

Some text breaks a tokenizer or a model that ordinary text does not: a launch lost requests to a model that
crashed on prompts with more than 15 emoji. Counting requests and failures per class shows such a blind spot.

- ``emoji_dense``: more emoji than the threshold (``serve.emoji_dense_threshold``). An emoji is one code
  point of the pictographic blocks (U+1F000–U+1FAFF, U+2600–U+27BF, U+2B00–U+2BFF, U+2300–U+23FF, U+3030,
  U+303D, U+3297, U+3299, U+00A9, U+00AE, U+203C, U+2049, U+2122, U+2139), skin-tone modifiers
  (U+1F3FB–U+1F3FF) and regional indicators (U+1F1E6–U+1F1FF) excepted; a flag (two regional indicators)
  counts as one. A ZWJ sequence counts each pictograph it joins.
- ``cjk``: otherwise, when at least a third of the text's characters other than spaces and line breaks
  are Han, Hiragana, Katakana or Hangul.
- ``plain``: everything else (ASCII text is ``plain`` without being scanned).

Pure and fast: one regular-expression pass per non-ASCII string, none for ASCII text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PLAIN = "plain"
EMOJI_DENSE = "emoji_dense"
CJK = "cjk"
TEXT_CLASSES = (PLAIN, EMOJI_DENSE, CJK)
"""Every value of the ``text_class`` label."""

_EMOJI = re.compile(
    "[\U0001f000-\U0001f1e5\U0001f200-\U0001f3fa\U0001f400-\U0001faff\u2600-\u27bf\u2b00-\u2bff\u2300-\u23ff"
    "\u3030\u303d\u3297\u3299\u00a9\u00ae\u203c\u2049\u2122\u2139]"
)
_REGIONAL_INDICATOR = re.compile("[\U0001f1e6-\U0001f1ff]")
_CJK = re.compile(
    "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\u1100-\u11ff\uf900-\ufaff\U00020000-\U0002fa1f]"
)
CJK_SHARE = 1 / 3
"""Share of the characters other than spaces and line breaks that must be CJK for the ``cjk`` class."""


def emoji_count(text: str) -> int:
    """Emoji in ``text`` as defined above (a flag is one)."""
    if text.isascii():
        return 0
    return len(_EMOJI.findall(text)) + len(_REGIONAL_INDICATOR.findall(text)) // 2


def text_class(texts: Iterable[str], emoji_dense_threshold: int) -> str:
    """The class of a prompt made of ``texts`` (its prompt strings and message texts, together)."""
    emoji = cjk = visible = 0
    for text in texts:
        visible += len(text) - text.count(" ") - text.count("\n")
        if not text.isascii():
            emoji += emoji_count(text)
            cjk += len(_CJK.findall(text))
    if emoji > emoji_dense_threshold:
        return EMOJI_DENSE
    if cjk and cjk >= CJK_SHARE * visible:
        return CJK
    return PLAIN


__all__ = ["CJK", "CJK_SHARE", "EMOJI_DENSE", "PLAIN", "TEXT_CLASSES", "emoji_count", "text_class"]

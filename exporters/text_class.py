"""The text class of a request's prompt: ``plain``, ``emoji_dense`` or ``cjk`` (a bounded label).

Some text breaks a tokenizer or a model that ordinary text does not: a launch lost requests to a model that
crashed on prompts with more than 15 emoji. Counting requests and failures per class shows such a blind spot.

- ``emoji_dense``: more emoji than the threshold (``serve.emoji_dense_threshold``). An emoji is one code
  point of the pictographic blocks U+1F000–U+1FFFF, U+2300–U+23FF, U+2600–U+27BF and U+2B00–U+2BFF;
  skin-tone modifiers (U+1F3FB–U+1F3FF) are no emoji, and two regional indicators (U+1F1E6–U+1F1FF, a
  flag) are one.
  A ZWJ sequence counts each pictograph it joins.
- ``cjk``: otherwise, when at least a third of the text's characters other than spaces and line breaks
  are CJK: U+3000–U+D7FF (CJK punctuation, kana, ideographs, Yi, Hangul) or U+20000–U+2FFFF (ideographs).
- ``plain``: everything else (ASCII text is ``plain`` without being looked at further).

Pure and fast: a non-ASCII text is encoded to UTF-8 once and its code points counted by their UTF-8 lead
bytes (C loops over the bytes; Python steps only per emoji), ASCII text costs one ``isascii``.
"""

from __future__ import annotations

from collections.abc import Iterable

from exporters.catalog.cutover import CJK, EMOJI_DENSE, PLAIN, TEXT_CLASSES

CJK_SHARE = 1 / 3
"""Share of the characters other than spaces and line breaks that must be CJK for the ``cjk`` class."""

# A UTF-8 lead byte never occurs inside another character: the pieces of the encoded text split at a lead
# byte each start with the rest of one such character.
_BMP_PICTOGRAPH_SECONDS = frozenset((*range(0x8C, 0x90), *range(0x98, 0x9F), *range(0xAC, 0xB0)))
"""Second bytes after 0xE2 of U+2300–23FF, U+2600–27BF and U+2B00–2BFF."""
_CJK_LEADS = bytes(range(0xE3, 0xEE))
"""Lead bytes of U+3000–U+D7FF."""


def _emoji(data: bytes) -> int:
    count = flags = 0
    if b"\xe2" in data:
        count += sum(1 for piece in data.split(b"\xe2")[1:] if piece and piece[0] in _BMP_PICTOGRAPH_SECONDS)
    if b"\xf0" in data:
        for piece in data.split(b"\xf0\x9f")[1:]:  # U+1F000–U+1FFFF
            if len(piece) < 2:
                continue
            if piece[0] == 0x87 and piece[1] >= 0xA6:  # a regional indicator: two make a flag
                flags += 1
            elif not (piece[0] == 0x8F and piece[1] >= 0xBB):  # a skin tone is no emoji of its own
                count += 1
    return count + flags // 2


def _cjk(data: bytes) -> int:
    count = len(data) - len(data.translate(None, _CJK_LEADS))
    if b"\xf0" in data:  # U+20000–U+2FFFF
        count += sum(1 for piece in data.split(b"\xf0")[1:] if piece and 0xA0 <= piece[0] <= 0xAF)
    return count


def emoji_count(text: str) -> int:
    """Emoji in ``text`` as defined above (a flag is one)."""
    return 0 if text.isascii() else _emoji(text.encode("utf-8", "surrogatepass"))


def text_class(texts: Iterable[str], emoji_dense_threshold: int) -> str:
    """The class of a prompt made of ``texts`` (its prompt strings and message texts, together)."""
    texts = list(texts)
    emoji = cjk = 0
    for text in texts:
        if not text.isascii():
            data = text.encode("utf-8", "surrogatepass")
            emoji += _emoji(data)
            cjk += _cjk(data)
    if emoji > emoji_dense_threshold:
        return EMOJI_DENSE
    if cjk and cjk >= CJK_SHARE * sum(len(t) - t.count(" ") - t.count("\n") for t in texts):
        return CJK
    return PLAIN


__all__ = ["CJK", "CJK_SHARE", "EMOJI_DENSE", "PLAIN", "TEXT_CLASSES", "emoji_count", "text_class"]

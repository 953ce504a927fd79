"""Text classes of prompts: emoji counted as documented, CJK by share, ASCII plain without a scan."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporters.text_class import CJK, EMOJI_DENSE, PLAIN, emoji_count, text_class

GRINNING = "\U0001f600"
FLAG_JP = "\U0001f1ef\U0001f1f5"
THUMBS_UP_MEDIUM = "\U0001f44d\U0001f3fd"
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"


@pytest.mark.parametrize(
    ("text", "count"),
    [("plain ascii :-)", 0), (GRINNING * 3, 3), (FLAG_JP, 1), (THUMBS_UP_MEDIUM, 1), (FAMILY, 3),
     ("\u2764\ufe0f", 1), ("caf\u00e9 \u6771\u4eac", 0)],
    ids=["ascii", "three faces", "a flag is one", "a skin tone is no second emoji", "ZWJ family: each pictograph",
         "heart with variation selector", "accents and CJK are no emoji"],
)
def test_emoji_are_counted_as_documented(text: str, count: int) -> None:
    """Pictographs count one each, a flag one, modifiers and variation selectors nothing."""
    assert emoji_count(text) == count


def test_more_emoji_than_the_threshold_is_emoji_dense() -> None:
    """Exactly the threshold stays plain; one more, spread over several texts, is emoji_dense."""
    assert text_class(["hi " + GRINNING * 15], 15) == PLAIN
    assert text_class(["hi " + GRINNING * 8, GRINNING * 8], 15) == EMOJI_DENSE


def test_cjk_needs_a_third_of_the_visible_characters() -> None:
    """Mostly Japanese is cjk; one kanji in English text is plain; spaces do not count."""
    assert text_class(["\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059"], 15) == CJK
    assert text_class(["Tokyo is \u6771\u4eac in Japanese, the capital of the country"], 15) == PLAIN
    assert text_class(["ab      \u6771"], 15) == CJK


def test_emoji_dense_wins_over_cjk() -> None:
    """A CJK prompt full of emoji is emoji_dense: the class the crash story is about."""
    assert text_class(["\u6771\u4eac" + GRINNING * 16], 15) == EMOJI_DENSE


def _by_code_point(text: str) -> tuple[int, int]:
    """(emoji, cjk) counted one code point at a time from the documented ranges: the slow, obvious way."""
    pictographs = ((0x1F000, 0x1FFFF), (0x2300, 0x23FF), (0x2600, 0x27BF), (0x2B00, 0x2BFF))
    emoji = flags = cjk = 0
    for char in text:
        code = ord(char)
        if 0x1F1E6 <= code <= 0x1F1FF:
            flags += 1
        elif any(low <= code <= high for low, high in pictographs) and not 0x1F3FB <= code <= 0x1F3FF:
            emoji += 1
        cjk += 0x3000 <= code <= 0xD7FF or 0x20000 <= code <= 0x2FFFF
    return emoji + flags // 2, cjk


@given(st.text(alphabet=st.sampled_from(
    "ab \n\u00e9\u2026\u2014\u2300\u23ff\u2600\u27bf\u2b00\u2bff\u2c00\u2fff\u3000\u3042\ud7ff\ue000\uff01"
    "\U0001f000\U0001f1e5\U0001f1e6\U0001f1ff\U0001f3fa\U0001f3fb\U0001f3ff\U0001f600\U0001ffff\U0001efff"
    "\U00020000\U0002ffff\U00030000\U000e0001"), max_size=60))
def test_the_byte_counts_equal_a_count_by_code_point(text: str) -> None:
    """Emoji and CJK counted from UTF-8 lead bytes equal the documented ranges applied code point by code point,
    range edges and their neighbours included."""
    emoji, cjk = _by_code_point(text)
    assert emoji_count(text) == emoji
    visible = len(text) - text.count(" ") - text.count("\n")
    expected = EMOJI_DENSE if emoji > 3 else CJK if cjk and cjk >= visible / 3 else PLAIN
    assert text_class([text], 3) == expected

"""The default length classes against the README's table: edges inclusive at the top, 32k in a class of its own."""

from __future__ import annotations

import pytest

from alert_rules.config import RulesConfig
from exporters.configuring import from_mapping
from exporters.errors import ConfigError
from exporters.records import DEFAULT_LENGTH_EDGES, length_bucket, length_bucket_labels

README_TABLE = {  # prompt tokens -> class, as the README's "Length classes" table writes them
    1: "le512", 512: "le512", 513: "512-4k", 4096: "512-4k", 4097: "4k-16k", 8192: "4k-16k",
    16384: "4k-16k", 16385: "16k-32k", 32000: "16k-32k", 32768: "16k-32k", 32769: "gt32k", 131072: "gt32k",
}


@pytest.mark.parametrize(("tokens", "label"), README_TABLE.items(), ids=[f"{t} tokens" for t in README_TABLE])
def test_each_boundary_lands_where_the_readme_says(tokens: int, label: str) -> None:
    """Each edge belongs to the class below it (inclusive upper end); one token more is the next class."""
    assert length_bucket(tokens) == label


def test_a_32000_token_usage_has_a_class_of_its_own() -> None:
    """The launch guide's 512/8k/32k mix: each length in a different class, and no 8k request shares 32k's."""
    classes = {length_bucket(t) for t in (512, 8192, 32000)}
    assert len(classes) == 3
    assert all(length_bucket(t) != length_bucket(32000) for t in range(4096, 16385, 512))


def test_the_label_budget_is_unchanged() -> None:
    """Five classes (plus unknown), as many as the old edges (512, 2048, 8192, 32768) gave."""
    assert len(length_bucket_labels(DEFAULT_LENGTH_EDGES)) == len(length_bucket_labels((512, 2048, 8192, 32768))) == 5


@pytest.mark.parametrize(("value", "expected"), [(4096, (4096,)), ([16384, 4096], (4096, 16384))],
                         ids=["one number", "a list"])
def test_long_context_tokens_takes_one_threshold_or_several(value: object, expected: tuple[int, ...]) -> None:
    """rules.long_context_tokens reads as one number or a list; the rules see them sorted."""
    assert from_mapping(RulesConfig, {"long_context_tokens": value}, "rules").long_context_thresholds == expected


@pytest.mark.parametrize("value", [[], [0], -5], ids=["empty", "zero", "negative"])
def test_long_context_tokens_refuses_what_is_no_threshold(value: object) -> None:
    """No threshold, or a non-positive one, is a config error naming the key."""
    with pytest.raises(ConfigError) as err:
        from_mapping(RulesConfig, {"long_context_tokens": value}, "rules")
    assert err.value.key == "rules.long_context_tokens"

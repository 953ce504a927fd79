"""Tests of the Go-template subset; expected texts were printed by promtool 2.42."""

from __future__ import annotations

import pytest

from alert_rules.promql.template import TemplateData, TemplateError, check_template, expand

TEXT = ('{{ $value }}|{{ $value | humanize }}|{{ printf "%.3g %g %v %d" $value $value $value 3 }}'
        "|{{ $labels.nope }}|{{ humanizePercentage 0.5 }}")


@pytest.mark.parametrize(("value", "expected"), [
    (1234567.0, "1.234567e+06|1.235M|1.23e+06 1.234567e+06 1.234567e+06 3||50%"),
    (0.00001, "1e-05|10u|1e-05 1e-05 1e-05 3||50%"),
    (12345678901234567890123.0,
     "1.2345678901234568e+22|12.35Z|1.23e+22 1.2345678901234568e+22 1.2345678901234568e+22 3||50%"),
    (0.5, "0.5|500m|0.5 0.5 0.5 3||50%"),
])
def test_expansion_matches_prometheus(value: float, expected: str) -> None:
    """Values, humanize, printf and missing labels print as Prometheus prints them."""
    assert expand(TEXT, TemplateData({"i": "a"}, value, {})) == expected


def test_labels_and_duration() -> None:
    """Label references and humanizeDuration work."""
    data = TemplateData({"model_name": "llama"}, 3725.0, {})
    assert expand("{{ $labels.model_name }}: {{ $value | humanizeDuration }}", data) == "llama: 1h 2m 5s"


def test_unsupported_constructs_are_refused() -> None:
    """if/range and unknown functions are refused at build time."""
    with pytest.raises(TemplateError):
        check_template("{{ if $value }}x{{ end }}")
    with pytest.raises(TemplateError):
        check_template("{{ $value | query }}")

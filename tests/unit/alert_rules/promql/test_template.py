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
    """define and unknown functions are refused at build time."""
    with pytest.raises(TemplateError):
        check_template('{{ define "x" }}x{{ end }}')
    with pytest.raises(TemplateError):
        check_template("{{ $value | graphLink }}")


def _data(results: dict[str, list[tuple[dict[str, str], float]]], **labels: str) -> TemplateData:
    """Alert data whose ``query`` answers from a table (query text -> samples) and records what it was asked."""

    def query(text: str) -> list[tuple[tuple[tuple[str, str], ...], float]]:
        asked.append(text)
        return [(tuple(sorted(lab.items())), value) for lab, value in results.get(text, [])]

    asked: list[str] = []
    data = TemplateData(labels, 7.0, {}, query=query)
    _ASKED[id(data)] = asked
    return data


_ASKED: dict[int, list[str]] = {}
KV = {"kv": [({}, 0.973)]}


@pytest.mark.parametrize(("results", "expected"), [
    (KV, "KV 97.3%"), ({}, "KV no data"), ({"kv": [({}, 0.0)]}, "KV 0%"),
])
def test_with_else_follows_go_truth(results: dict[str, list[tuple[dict[str, str], float]]], expected: str) -> None:
    """with runs its body on a non-empty query result (even a sample of value 0), else on an empty one."""
    text = '{{ with query "kv" }}KV {{ . | first | value | humanizePercentage }}{{ else }}KV no data{{ end }}'
    assert expand(text, _data(results)) == expected


def test_with_on_zero_and_empty_string_takes_else() -> None:
    """Go's truth: 0 and "" are false, a non-empty string is true and becomes the dot."""
    text = "{{ with 0 }}a{{ else }}b{{ end }}{{ with \"\" }}c{{ else }}d{{ end }}{{ with \"x\" }}{{ . }}{{ end }}"
    assert expand(text, _data({})) == "bdx"


def test_first_of_an_empty_result_is_an_error() -> None:
    """first() on no samples fails the expansion, as Prometheus' first() does."""
    out = expand('{{ query "none" | first | value }}', _data({}))
    assert out.startswith("<error expanding template:")
    assert "first() called on vector with no elements" in out


def test_range_labels_value_sort_and_else() -> None:
    """range sets the dot to each sample (.Labels.X, .Value, label, value); else runs on no samples."""
    results = {"q": [({"reason": "deferred"}, 1.0), ({"reason": "capacity"}, 1234.0)]}
    text = ('{{ range query "q" | sortByLabel "reason" }} {{ .Labels.reason }}={{ .Value | humanize }}'
            '/{{ label "reason" . }}/{{ value . }}{{ else }} none{{ end }}')
    assert expand(text, _data(results)) == " capacity=1.234k/capacity/1234 deferred=1/deferred/1"
    assert expand(text, _data({})) == " none"


def test_printf_builds_the_query_from_the_alert_labels() -> None:
    """A query string built with printf and $labels reaches the evaluator verbatim, with Go's %q quoting."""
    data = _data({'sum(x{model_name="llama", instance=""})': [({}, 2.5)]}, model_name="llama")
    text = ('{{ with printf `sum(x{model_name=%q, instance=%q})` $labels.model_name $labels.instance | query }}'
            '{{ . | first | value }}{{ end }}')
    assert expand(text, data) == "2.5"
    assert _ASKED[id(data)] == ['sum(x{model_name="llama", instance=""})']


def test_top_level_dot_is_the_alert_and_braces_inside_strings_do_not_end_an_action() -> None:
    """.Labels/.Value at top level read the alert; "}}" inside a quoted string belongs to the string."""
    data = _data({"x{a=\"}}\"}": [({}, 1.0)]}, model_name="m")
    assert expand('{{ .Labels.model_name }} {{ .Value }} {{ with query "x{a=\\"}}\\"}" }}ok{{ end }}', data) == "m 7 ok"


def test_trim_markers_inside_blocks() -> None:
    """{{- and -}} trim the surrounding whitespace, inside with as outside."""
    assert expand('a  {{- with "v" -}}  [{{ . }}]  {{- end }}', _data({})) == "a[v]"


@pytest.mark.parametrize("text", [
    "{{ $x := 1 }}", '{{ with query "x" }}a', "{{ end }}", '{{ with query "x" }}a{{ else }}b{{ else }}c{{ end }}',
    '{{ label "a" }}', '{{ query ("x") }}', "{{ with $value }}{{ . | graphLink }}{{ else }}x{{ end }}",
    '{{ with query "x" }}a{{ else if 1 }}b{{ end }}', "{{ template \"x\" }}", "{{ $labels.a.b }}", "{{ len 1 }}",
])
def test_constructs_outside_the_subset_are_refused_in_every_branch(text: str) -> None:
    """Declarations, unbalanced blocks, wrong argument counts, parentheses, if/else-if, template, len are refused,
    even inside a branch no query would select."""
    with pytest.raises(TemplateError):
        check_template(text)


def test_the_context_constructs_pass_the_check() -> None:
    """with/else/range, query, first, value, label, sortByLabel and printf-built queries are accepted."""
    check_template('{{ with printf `max(x{m=%q})` $labels.m | query }}{{ . | first | value | humanize }}'
                   '{{ else }}no data{{ end }}{{ range query "y" | sortByLabel "r" }}{{ label "r" . }}{{ end }}')


@pytest.mark.parametrize(("value", "expected"), [(10.0, "raise 10"), (8.0, "lower 8"), (4.0, "lower 4")])
def test_if_with_gt_picks_a_branch_as_go_does(value: float, expected: str) -> None:
    """``if gt $value 8.0``: the body when strictly greater, else the else branch (Go's text/template)."""
    text = "{{ if gt $value 8.0 }}raise{{ else }}lower{{ end }} {{ $value }}"
    assert expand(text, TemplateData({}, value, {})) == expected


def test_gt_refuses_an_int_against_a_float() -> None:
    """As in Go, ``gt $value 8`` compares a float with an int: an expansion error, not a silent answer."""
    assert expand("{{ if gt $value 8 }}x{{ end }}", TemplateData({}, 10.0, {})).startswith(
        "<error expanding template")

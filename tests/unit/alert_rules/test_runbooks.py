"""docs/runbooks.md: an entry per alert with its meaning, first checks and interventions."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from alert_rules import render, runbooks
from alert_rules.build import outputs
from alert_rules.config import RulesConfig
from serving.cli import build_parser
from serving.config import defaults

EDGES = (512, 2048, 8192, 32768)
ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "docs" / "runbooks.md"
REGENERATE = "regenerate it with `make runbooks` (rules build with the default config, docs/runbooks.md copied)"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (fenced code skipped).

    GitHub's rule: lower-case the heading text, drop every character that is not a letter, digit,
    space, ``-`` or ``_``, turn spaces into ``-``; a repeated anchor gets ``-1``, ``-2``, ...
    """
    anchors: set[str] = set()
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} +(.*?) *#* *$", line)
        if fenced or heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def test_the_committed_runbooks_are_what_rules_build_writes() -> None:
    """docs/runbooks.md, where the default runbook links point, equals `rules build`'s with the default config."""
    settings = defaults()
    built = outputs(settings.rules, tuple(settings.serve.length_bucket_edges))["docs/runbooks.md"]
    assert COMMITTED.is_file(), f"docs/runbooks.md is missing: {REGENERATE}"
    assert COMMITTED.read_text() == built, f"docs/runbooks.md differs from what rules build writes: {REGENERATE}"


def test_every_default_runbook_link_opens_a_heading_of_the_committed_file() -> None:
    """Each alert's default runbook_url names docs/runbooks.md and an anchor GitHub gives one of its headings."""
    settings = defaults()
    anchors = github_anchors(COMMITTED.read_text())
    groups = render.build_groups(settings.rules, tuple(settings.serve.length_bucket_edges))
    alerts = [a for g in groups for a in g.alerts()]
    assert len(alerts) >= 20
    for alert in alerts:
        url = urlsplit(alert.annotations["runbook_url"])
        assert url.path.endswith("/blob/main/docs/runbooks.md"), url
        assert url.fragment in anchors, f"{alert.name}: no heading of docs/runbooks.md has the anchor {url.fragment}"


def test_github_anchors_follow_githubs_rule() -> None:
    """Punctuation dropped, spaces to dashes, repeats numbered, headings in code fences ignored."""
    text = "# Run books!\n## Run books!\n```\n# not a heading\n```\n## `a.b` (c)\n"
    assert github_anchors(text) == {"run-books", "run-books-1", "ab-c"}


def test_every_alert_has_a_runbook_entry() -> None:
    """The markdown has a heading per alert and the alert's runbook anchor resolves to it."""
    alerts = render.alerts(RulesConfig(), EDGES)
    text = runbooks.runbooks_markdown(RulesConfig(), alerts)
    for alert in alerts:
        assert f"\n## {alert.name}\n" in text
        assert f"(#{alert.runbook_anchor})" in text


def test_entries_name_the_interventions_of_the_issue() -> None:
    """Across the runbooks: lower max-num-seqs, fp8 KV cache, a separate queue, shed load, roll back."""
    text = runbooks.runbooks_markdown(RulesConfig(), render.alerts(RulesConfig(), EDGES))
    for phrase in ("--max-num-seqs", "fp8", "separate queue", "Shed load", "Roll back"):
        assert phrase in text


EXPLAIN_SLOWEST = "inferwatch explain --slowest 10 --since 15m"
SLOW_OR_QUEUED = ("InferwatchLatencyBudgetBurnPage", "InferwatchLatencyBudgetBurnTicket",
                  "InferwatchLatencyAboveSLA", "InferwatchQueueBacklog")


@pytest.mark.parametrize("name", SLOW_OR_QUEUED)
def test_the_slow_and_queued_request_runbooks_check_the_slowest_requests_explanations(name: str) -> None:
    """The latency and queue alerts' first checks run `inferwatch explain` on the slowest requests (issue 28)."""
    alert = next(a for a in render.alerts(RulesConfig(), EDGES) if a.name == name)
    assert any(f"`{EXPLAIN_SLOWEST}`" in check for check in alert.runbook.checks), alert.runbook.checks


def test_the_runbooks_explain_command_is_one_the_cli_takes() -> None:
    """The command the runbooks give parses as `inferwatch explain --slowest 10 --since 15m`."""
    args = build_parser().parse_args(EXPLAIN_SLOWEST.split()[1:])
    assert (args.slowest, args.since, args.trace_id) == (10, "15m", None)


@pytest.mark.parametrize(
    ("meaning", "checks", "interventions"),
    [("", ("a",), ("b",)), ("m", (), ("b",)), ("m", ("a",), ()), ("m", ("",), ("b",))],
    ids=["no meaning", "no check", "no intervention", "an empty check"],
)
def test_an_empty_runbook_is_refused(meaning: str, checks: tuple[str, ...], interventions: tuple[str, ...]) -> None:
    """A runbook without a meaning, a check or an intervention cannot be written down."""
    with pytest.raises(ValueError, match="runbook needs"):
        runbooks.Runbook(meaning, checks, interventions)


def test_an_alert_without_runbook_cannot_be_defined() -> None:
    """The runbook is a required field of the alert, so leaving it out fails where the alert is written."""
    alert = render.alerts(RulesConfig(), EDGES)[0]
    with pytest.raises(TypeError, match="runbook"):
        type(alert)(name="InferwatchStranger", expr="vector(1)", severity=alert.severity,  # type: ignore[call-arg]
                    summary="A stranger.", description="Nobody wrote its runbook.", scenario=alert.scenario)

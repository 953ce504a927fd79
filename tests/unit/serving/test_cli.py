"""The command line as the README states it: exit codes, short usage errors, and `logs` read back as written."""

from __future__ import annotations

import io
import json
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from serving.cli import main

START = datetime(2026, 8, 7, 12, 0, 0, tzinfo=UTC)


def _ingest(directory: Path, records: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """`logs ingest` with every record kept, fed as JSON lines on stdin."""
    lines = "".join(json.dumps(record) + "\n" for record in records).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines)))
    assert main(["logs", "ingest", "--dir", str(directory), "--logs-success-sample-ratio", "1"]) == 0


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _exit_code(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The exit code of a command argparse refuses (it raises SystemExit), with what was printed."""
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(stopped.value.code or 0), out, err


def test_a_missing_required_option_prints_the_error_and_a_pointer_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    """A missing option exits 2 with two lines on stderr: the problem and where --help is, not the usage."""
    code, out, err = _exit_code(capsys, "loadtest", "--model", "m")
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "inferwatch loadtest: error: the following arguments are required: --url",
        "Run 'inferwatch loadtest --help' for the options.",
    ]


def test_a_bad_value_in_a_nested_subcommand_is_short_too(capsys: pytest.CaptureFixture[str]) -> None:
    """The subcommands' own parsers (two levels down) answer a bad value the same way."""
    code, _, err = _exit_code(capsys, "logs", "cat", "--dir", "/tmp", "--since", "yesterday")
    assert code == 2
    assert len(err.splitlines()) == 2
    assert err.endswith("Run 'inferwatch logs cat --help' for the options.\n")


def test_search_with_an_id_that_is_not_hex_is_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`logs search --trace-id nothex` exits 2 (bad usage), naming what a trace id is."""
    code, _, err = _exit_code(capsys, "logs", "search", "--dir", str(tmp_path), "--trace-id", "nothex")
    assert code == 2
    assert "'nothex' is not a trace id: give its 32 hex digits" in err


def test_nothing_found_exits_1_for_search_and_cat_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No match is exit 1 for `logs search` and `logs cat`, with nothing on stdout and the reason on stderr."""
    _ingest(tmp_path, [{"ts": "2026-08-07T12:00:00.000Z", "trace_id": "a" * 32, "outcome": "ok"}], monkeypatch)
    assert _run(capsys, "logs", "search", "--dir", str(tmp_path), "--trace-id", "b" * 32)[:2] == (1, "")
    code, out, err = _run(capsys, "logs", "cat", "--dir", str(tmp_path), "--outcome", "timeout")
    assert (code, out) == (1, "")
    assert "no record" in err
    code, out, _ = _run(capsys, "logs", "cat", "--dir", str(tmp_path))
    assert (code, json.loads(out)["trace_id"]) == (0, "a" * 32)


def test_cat_compares_times_as_times_whatever_their_spelling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`logs cat --since/--until` keeps records whose ts has no milliseconds, microseconds or an offset
    when their time lies in the range, and only those."""
    plus_two = timezone(timedelta(hours=2))
    spellings = [
        lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ"),  # no milliseconds, as --since accepts it
        lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),  # microseconds
        lambda t: t.astimezone(plus_two).isoformat(),  # an offset
        lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z",  # the sidecar's own
    ]
    records = []
    for second in range(40):
        when = START + timedelta(seconds=second)
        records.append({"ts": spellings[second % 4](when), "trace_id": f"{second:032x}", "outcome": "ok",
                        "second": second})
    _ingest(tmp_path, records, monkeypatch)
    code, out, err = _run(capsys, "logs", "cat", "--dir", str(tmp_path),
                          "--since", "2026-08-07T12:00:10Z", "--until", "2026-08-07T14:00:29+02:00")
    assert code == 0, err
    assert [json.loads(line)["second"] for line in out.splitlines()] == list(range(10, 30))


def test_metrics_derive_names_an_unreadable_file_and_the_problem(capsys: pytest.CaptureFixture[str]) -> None:
    """`metrics derive /nonexistent` exits 2 naming the file and why it cannot be read, not a config key."""
    code, out, err = _run(capsys, "metrics", "derive", "/nonexistent")
    assert (code, out) == (2, "")
    assert err == "inferwatch: cannot read /nonexistent: No such file or directory\n"

"""The README stays true: its first lines, its configuration reference and its architecture."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving import config_doc
from serving.config import all_field_docs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_first_lines_give_the_two_commands() -> None:
    """The README opens with `make demo` and `make test`."""
    head = "\n".join(README.splitlines()[:6])
    assert "make demo" in head
    assert "make test" in head


def test_configuration_reference_is_current() -> None:
    """The generated configuration reference in the README equals what the code declares."""
    start = README.index(config_doc.BEGIN)
    end = README.index(config_doc.END) + len(config_doc.END)
    assert README[start:end] == config_doc.render(), "run `python -m serving.config_doc --write`"


def test_every_key_is_documented_with_its_default_and_flag() -> None:
    """Each config key appears in the README with its flag."""
    for doc in all_field_docs():
        assert f"`{doc.flag}`" in README, doc.key
        assert doc.doc, f"{doc.key} has no documentation"


def test_architecture_names_every_top_level_package() -> None:
    """The architecture section has a paragraph for each top-level folder."""
    section = README[README.index("## Architecture"):README.index("## Alerts and runbooks")]
    for folder in ("serving/", "exporters/", "alert_rules/", "dashboards/", "log_pipeline/", "tests/", "benchmarks/"):
        assert f"**`{folder}`**" in section, folder


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run calls `make test`, the README's test command."""
    assert "make test" in (ROOT / ".ci/run").read_text()


def _example_output(command: str) -> str:
    """The lines the README shows under ``    $ command`` (its indented block), unindented."""
    lines = README[README.index(f"    $ {command}\n"):].splitlines()[1:]
    block = []
    for line in lines:
        if not line.startswith("    ") or line.startswith("    $ "):
            break
        block.append(line[4:])
    return "\n".join(block) + "\n"


def test_the_metrics_derive_example_is_the_commands_output(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's `metrics derive` example is what the command prints today for the same capture."""
    from serving.cli import main

    capture = "tests/data/vllm_v1_engine_0.32.prom"
    command = f"inferwatch metrics derive {capture}"
    assert main(["metrics", "derive", str(ROOT / capture)]) == 0
    assert capsys.readouterr().out == _example_output(command)

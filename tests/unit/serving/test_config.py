"""Configuration: TOML plus flags, validated with errors that name the key; exit code 2 from the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.errors import ConfigError
from serving import config as cfg
from serving.cli import main


def test_defaults_are_valid() -> None:
    """Every default passes its own validation."""
    settings = cfg.defaults()
    assert settings.serve.listen == "127.0.0.1:9100"
    assert settings.serve.length_bucket_edges == [512, 4096, 16384, 32768]


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        ({"serve": {"read_timeout_s": "soon"}}, "serve.read_timeout_s", "must be a number"),
        ({"serve": {"read_timeout_s": -1}}, "serve.read_timeout_s", "greater than 0"),
        ({"serve": {"listen": "nowhere"}}, "serve.listen", "HOST:PORT"),
        ({"serve": {"length_bucket_edges": [10, 5]}}, "serve.length_bucket_edges", "increasing"),
        ({"serve": {"no_such_key": 1}}, "serve.no_such_key", "not a known key"),
        ({"nonsense": {}}, "nonsense", "not a known section"),
        ({"logs": {"success_sample_ratio": 2}}, "logs.success_sample_ratio", "between 0 and 1"),
        ({"gpu": {"enabled": "yes"}}, "gpu.enabled", "true or false"),
    ],
    ids=["a string for a number", "a negative timeout", "a listen address without a port",
         "decreasing bucket edges", "an unknown key", "an unknown section", "a ratio above 1",
         "a string for a boolean"],
)
def test_bad_values_name_the_key(data: dict[str, dict[str, object]], key: str, words: str) -> None:
    """A bad value raises ConfigError whose message names the dotted key and the problem."""
    with pytest.raises(ConfigError) as info:
        cfg.build_settings(data)
    assert info.value.key == key
    assert words in str(info.value)


def test_flags_override_the_file(tmp_path: Path) -> None:
    """A flag wins over the TOML file; values are read as TOML."""
    path = tmp_path / "inferwatch.toml"
    path.write_text('[serve]\nupstream = "http://10.0.0.1:8000"\nread_timeout_s = 30\n')
    import argparse

    parser = argparse.ArgumentParser()
    cfg.add_config_flags(parser)
    parser.add_argument("--upstream")
    args = parser.parse_args(["--config", str(path), "--serve-read-timeout-s", "7.5",
                              "--serve-length-bucket-edges", "100,200", "--upstream", "http://127.0.0.1:1"])
    settings = cfg.settings_from_args(args, {"upstream": "serve.upstream"})
    assert settings.serve.read_timeout_s == 7.5
    assert settings.serve.upstream == "http://127.0.0.1:1"
    assert settings.serve.length_bucket_edges == [100, 200]


def test_cli_exits_2_on_invalid_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`inferwatch serve` with an invalid config file prints the key and exits with 2."""
    path = tmp_path / "bad.toml"
    path.write_text("[serve]\nconnect_timeout_s = 0\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "serve.connect_timeout_s" in capsys.readouterr().err


def test_cli_exits_2_on_malformed_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that is not TOML is a configuration error naming the file."""
    path = tmp_path / "bad.toml"
    path.write_text("[serve\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    """A config path that does not exist is reported, exit 2."""
    assert main(["serve", "--config", "/nonexistent/inferwatch.toml"]) == 2
    assert "file not found" in capsys.readouterr().err

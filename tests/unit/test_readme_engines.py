"""The README's "Engines" table is the engine catalog (exporters/catalog/engines.py), row for row."""

from __future__ import annotations

from pathlib import Path

from exporters.catalog.engines import ENGINE_NAMES, SIGNALS, Engine

README = Path(__file__).resolve().parents[2] / "README.md"
ORDER = (Engine.VLLM, Engine.SGLANG, Engine.LLAMACPP, Engine.OLLAMA)


def engines_table() -> str:
    """The table as the README must show it."""
    lines = ["| signal | " + " | ".join(ENGINE_NAMES[e] for e in ORDER) + " |", "|---|" + "---|" * len(ORDER)]
    lines += [f"| {s.name} | " + " | ".join(f"{s.how[e][0]}: {s.how[e][1]}" for e in ORDER) + " |" for s in SIGNALS]
    return "\n".join(lines)


def test_the_engines_table_is_the_catalogs() -> None:
    """Every signal, and how each engine feeds it, as the catalog says (print engines_table() to update)."""
    assert engines_table() in README.read_text(), engines_table()


def test_every_engine_has_a_quick_start() -> None:
    """The section gives each engine its own paragraph with the command that starts it."""
    section = README.read_text().split("## Engines", 1)[1].split("\n## ", 1)[0]
    for name, start in (("SGLang", "--enable-metrics"), ("llama.cpp", "llama-server -m"), ("Ollama", "ollama serve")):
        assert f"**{name}**" in section
        assert start in section

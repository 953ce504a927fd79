"""The architecture's dependency rules, checked on the source (see CONTRIBUTING.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("serving", "exporters", "alert_rules", "dashboards", "log_pipeline")

# package -> packages of ours it may import
ALLOWED = {
    "exporters": set(),
    "log_pipeline": {"exporters"},
    "alert_rules": {"exporters"},
    "dashboards": {"exporters", "alert_rules"},
    "serving": {"exporters", "alert_rules", "dashboards", "log_pipeline"},
}
# package -> the modules of a lower package it may import (a module named here covers its submodules);
# a package not named imports any module of the packages ALLOWED gives it
MODULES = {
    package: {
        "exporters": {
            # the model: metric names, records, config helpers, errors, bucket bounds; and the
            # standard-library atomic file write that every builder and the log index share
            "exporters.catalog", "exporters.records", "exporters.configuring", "exporters.errors",
            "exporters.config", "exporters.buckets", "exporters.files",
        },
        # pure rule definitions, no evaluation, rendering or I/O
        "alert_rules": {"alert_rules.config", "alert_rules.spec", "alert_rules.slo", "alert_rules.windows"},
    }
    for package in ("alert_rules", "dashboards", "log_pipeline")
}
# third-party module -> the only places that may import it
HOMES = {
    "grafanalib": ("dashboards/",),
    "zstandard": ("log_pipeline/",),
    "pynvml": ("exporters/nvml.py",),
    "aiohttp": ("serving/",),
    "apscheduler": ("serving/",),
    "opentelemetry": ("serving/",),
    "vllm": ("exporters/vllm_plugin.py",),
}
# modules that may spell metric names as string literals
NAME_HOMES = ("exporters/catalog/",)
METRIC_LITERAL = re.compile(r"""["'](?:vllm:[a-z_]+|inferwatch_[a-z_]+|inferwatch:[a-z_:]+)""")


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, ``from package import module`` named as ``package.module``."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            names.update({name for name in submodules if _is_module(name)} or {node.module})
    return names


def _covered(name: str, allowed: set[str]) -> bool:
    return any(name == module or name.startswith(module + ".") for module in allowed)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path: Path) -> None:
    """A module imports only the inferwatch packages its layer allows, of those only the modules the layer
    allows, and third-party libraries stay home."""
    rel = str(path.relative_to(ROOT))
    package = rel.split("/", 1)[0]
    for name in _imports(path):
        top = name.split(".", 1)[0]
        if top in PACKAGES and top != package:
            assert top in ALLOWED[package], f"{rel} imports {name}: {package} may not import {top}"
            modules = MODULES.get(package, {}).get(top)
            assert modules is None or _covered(name, modules), \
                f"{rel} imports {name}: {package} may import only these of {top}: {', '.join(sorted(modules))}"
        if top in HOMES:
            assert rel.startswith(HOMES[top]), f"{rel} imports {top}, which lives only in {HOMES[top]}"


def test_no_stray_metric_names() -> None:
    """Outside the catalog, no module spells a vllm:, inferwatch_ or inferwatch: metric name as a literal."""
    offenders = []
    for path in _modules():
        rel = str(path.relative_to(ROOT))
        if rel.startswith(NAME_HOMES):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if METRIC_LITERAL.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == []


def test_the_vllm_plugin_imports_only_the_standard_library_vllm_and_its_wire_format() -> None:
    """The plugin runs inside vLLM's process, installed without our dependencies (pip --no-deps)."""
    import sys

    allowed = {"vllm", "exporters.engine_stats_wire", "__future__"}
    for rel in ("exporters/vllm_plugin.py", "exporters/engine_stats_wire.py"):
        for name in _imports(ROOT / rel):
            top = name.split(".", 1)[0]
            assert top in sys.stdlib_module_names or name in allowed or top == "vllm", f"{rel} imports {name}"

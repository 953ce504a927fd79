"""Helpers shared by the benchmark scripts: percentiles and writing a section of BENCHMARKS.md."""

from __future__ import annotations

import platform
import re
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def revision() -> str:
    """The current git revision (short), with +dirty when the tree has changes (BENCHMARKS.md aside: the scripts
    write it one after another, and its figures do not change what is measured)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":!{BENCHMARKS_MD.name}"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    """A one-line description of the machine."""
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def publish(heading: str, body: str, write: bool) -> None:
    """Print a benchmark's section; with ``write``, also put it under ``## heading`` in BENCHMARKS.md."""
    print(body)
    if write:
        write_section(heading, body)


def write_section(heading: str, body: str) -> None:
    """Replace the text under ``## heading`` in BENCHMARKS.md (up to the next ``## ``) with ``body``."""
    text = BENCHMARKS_MD.read_text()
    pattern = re.compile(rf"(^## {re.escape(heading)}\n)(.*?)(?=^## |\Z)", re.S | re.M)
    if not pattern.search(text):
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n"
    text = pattern.sub(lambda m: m.group(1) + "\n" + body.strip("\n") + "\n\n", text, count=1)
    BENCHMARKS_MD.write_text(text)


def interrupt_all(processes: Iterable[subprocess.Popen[bytes]], wait_s: float = 30.0) -> None:
    """SIGINT every process (a sidecar then shuts down cleanly), wait for each, kill any still running."""
    started = list(processes)
    for process in started:
        process.send_signal(signal.SIGINT)
    for process in started:
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            process.kill()

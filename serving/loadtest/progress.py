"""Progress of a run: a bar redrawn in place on a terminal, plain lines elsewhere (logs, CI, pipes)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

BAR_WIDTH = 30


@dataclass(frozen=True, slots=True)
class Progress:
    """A progress reading taken during a run (``step_number`` of ``steps``, counted from 1)."""

    elapsed_s: float
    done: int
    errors: int
    in_flight: int
    current_rps: float
    total: int | None
    duration_s: float | None
    step: str = ""
    step_number: int = 1
    steps: int = 1

    @property
    def fraction(self) -> float | None:
        """How much of the step is done (0-1), by count or by time, whichever is further; None when unknown."""
        parts = []
        if self.total:
            parts.append(self.done / self.total)
        if self.duration_s:
            parts.append(self.elapsed_s / self.duration_s)
        return min(1.0, max(parts)) if parts else None


def format_progress(progress: Progress) -> str:
    """One progress line: which step, how far, how fast right now, how many errors."""
    if progress.total is not None:
        where = f"{progress.done}/{progress.total} done"
    else:
        where = f"{progress.elapsed_s:.1f}/{progress.duration_s:g} s, {progress.done} done"
    step = f"step {progress.step_number}/{progress.steps} ({progress.step}): " if progress.steps > 1 else ""
    return (f"loadtest: {step}{where}, {progress.current_rps:.1f} req/s now, {progress.in_flight} in flight, "
            f"{progress.errors} errors")


def format_bar(progress: Progress) -> str:
    """A one-line bar: ``[#####.....]  40 % step 2/3 (concurrency 4)  40 done, 12.3 req/s, 0 errors``."""
    fraction = progress.fraction or 0.0
    filled = round(fraction * BAR_WIDTH)
    step = f" step {progress.step_number}/{progress.steps} ({progress.step})" if progress.steps > 1 else ""
    return (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction:4.0%}{step}  {progress.done} done, "
            f"{progress.current_rps:.1f} req/s, {progress.in_flight} in flight, {progress.errors} errors")


class ProgressPrinter:
    """Prints readings to ``stream``: a bar redrawn in place when it is a terminal, else one line each."""

    def __init__(self, stream: TextIO | None = None, *, bar: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.bar = self.stream.isatty() if bar is None else bar
        self._drawn = False

    def __call__(self, progress: Progress) -> None:
        """Show one reading."""
        if self.bar:
            self.stream.write("\r" + format_bar(progress) + "\033[K")
            self._drawn = True
        else:
            self.stream.write(format_progress(progress) + "\n")
        self.stream.flush()

    def say(self, line: str) -> None:
        """A message of its own (calibration, a cold start), on a line of its own below the bar."""
        self.end()
        self.stream.write(f"loadtest: {line}\n")
        self.stream.flush()

    def end(self) -> None:
        """Leave the bar's line, so that the next output starts on a new one."""
        if self._drawn:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()

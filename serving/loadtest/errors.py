"""Errors of a load test that are neither bad options nor failed requests (exit code 1)."""

from __future__ import annotations

from exporters.errors import InferwatchError


class LoadTestError(InferwatchError, RuntimeError):
    """The target could not be measured as asked (calibration failed, the context length is unknown, ...).

    Attributes:
        target: the URL that was being measured.
    """

    def __init__(self, target: str, problem: str) -> None:
        self.target = target
        super().__init__(f"{target}: {problem}")

"""Error types shared by every inferwatch package."""

from __future__ import annotations


class InferwatchError(Exception):
    """Base class of every error inferwatch raises on purpose."""


class ConfigError(InferwatchError, ValueError):
    """A configuration value is missing, of the wrong type or out of range.

    Attributes:
        key: the dotted key, e.g. ``proxy.read_timeout_s``.
        value: the offending value (or None when the key is missing).
        problem: what is wrong and what is allowed.
    """

    def __init__(self, key: str, problem: str, value: object = None) -> None:
        self.key = key
        self.value = value
        self.problem = problem
        shown = f" (got {value!r})" if value is not None else ""
        super().__init__(f"config key {key!r}: {problem}{shown}")


class ExpositionParseError(InferwatchError, ValueError):
    """A Prometheus exposition could not be parsed."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        where = f" at line {line}" if line is not None else ""
        super().__init__(f"{message}{where}")


class NvmlUnavailable(InferwatchError, RuntimeError):  # noqa: N818 - names the condition, as users read it
    """NVML cannot be loaded (no driver, no GPU, no library)."""

"""Typed, documented configuration sections built from plain mappings (TOML tables).

Each package declares one frozen dataclass per config section whose fields are made with
:func:`setting`. :func:`from_mapping` validates a mapping against it and raises
:class:`~exporters.errors.ConfigError` naming the dotted key, the value and what is allowed.
The same field metadata drives the CLI flags and the README's configuration reference.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

from exporters.errors import ConfigError

T = TypeVar("T")

Check = Callable[[Any], str | None]
"""A validator: returns None when the value is fine, else a sentence saying what is allowed."""


def setting(default: Any, doc: str, *, check: Check | None = None) -> Any:
    """Declare a config field with its default, its one-line documentation and a validator."""
    if isinstance(default, list | dict):
        frozen = default
        return dataclasses.field(
            default_factory=lambda: type(frozen)(frozen),
            metadata={"doc": doc, "check": check, "default": default},
        )
    return dataclasses.field(default=default, metadata={"doc": doc, "check": check, "default": default})


def positive(value: Any) -> str | None:
    """Validator: a number greater than zero."""
    return None if value > 0 else "must be greater than 0"


def non_negative(value: Any) -> str | None:
    """Validator: a number not below zero."""
    return None if value >= 0 else "must be 0 or greater"


def ratio(value: Any) -> str | None:
    """Validator: a number between 0 and 1 inclusive."""
    return None if 0 <= value <= 1 else "must be between 0 and 1"


HTTP_URL_RULE = "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000"


def http_url(value: Any) -> str | None:
    """Validator: an http:// or https:// URL with a host, and a port from 1 to 65535 when it names one.

    The one URL check of the code base: config keys, command-line URLs, webhook receivers and the
    upstream connection pool all use it.
    """
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or parts.port > 0  # .port raises ValueError outside 0-65535
    except ValueError:
        return HTTP_URL_RULE
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        return HTTP_URL_RULE
    return None


def optional_http_url(value: Any) -> str | None:
    """Validator: empty (the feature is off) or an http:// or https:// URL with a host."""
    return None if value == "" else http_url(value)


def one_of(*allowed: str) -> Check:
    """Validator factory: the value is one of ``allowed``."""

    def check(value: Any) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(map(repr, allowed))}"

    return check


def increasing(value: Any) -> str | None:
    """Validator: a non-empty, strictly increasing list of positive numbers."""
    if not value:
        return "must not be empty"
    if any(b <= a for a, b in itertools.pairwise(value)) or value[0] <= 0:
        return "must be positive and strictly increasing"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class FieldDoc:
    """Documentation of one config key, for the CLI and the README."""

    section: str
    name: str
    type_name: str
    default: Any
    doc: str

    @property
    def key(self) -> str:
        """The dotted key, e.g. ``serve.listen``."""
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str:
        """The CLI flag that sets this key, e.g. ``--serve-listen``."""
        return "--" + f"{self.section}-{self.name}".replace("_", "-")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        (arg, *_) = typing.get_args(tp)
        return f"list of {_type_name(arg)}"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"table of {_type_name(k)} to {_type_name(v)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "none"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def field_docs(cls: type, section: str) -> list[FieldDoc]:
    """Return the documentation of every key of a config section class."""
    hints = typing.get_type_hints(cls)
    return [
        FieldDoc(section, f.name, _type_name(hints[f.name]), f.metadata.get("default"), f.metadata.get("doc", ""))
        for f in dataclasses.fields(cls)
    ]


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (int -> float, list -> list)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(key, arg, value)
            except ConfigError as err:
                errors.append(err.problem)
        raise ConfigError(key, f"must be {_type_name(tp)}", value)
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(key, "must be empty", value)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"must be a {_type_name(tp)}", value)
        (arg, *_) = typing.get_args(tp)
        items = [_coerce(f"{key}[{i}]", arg, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"must be a {_type_name(tp)}", value)
        kt, vt = typing.get_args(tp)
        return {_coerce(key, kt, k): _coerce(f"{key}.{k}", vt, v) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, "must be true or false", value)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(key, "must be a number", value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(key, "must be an integer", value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(key, "must be a string", value)
    if tp is Any:
        return value
    raise ConfigError(key, f"has an unsupported type {tp!r}", value)


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, section: str) -> T:
    """Build a config section from a mapping, validating every key.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or one its validator refuses.
    """
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{section}.{unknown[0]}", f"is not a known key; known keys: {', '.join(sorted(fields))}"
        )
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{section}.{name}"
        coerced = _coerce(key, hints[name], value)
        check = fields[name].metadata.get("check")
        if check is not None and coerced is not None:
            problem = check(coerced)
            if problem:
                raise ConfigError(key, problem, value)
        values[name] = coerced
    return cls(**values)

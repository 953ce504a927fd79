"""The subset of Prometheus' Go alert templates used in labels and annotations.

Supported: ``{{ $labels.NAME }}``, ``{{ .Labels.NAME }}``, ``{{ $value }}``, ``{{ .Value }}``,
``{{ $externalLabels.NAME }}``, ``{{ $externalURL }}``, string and number literals, pipelines with
``|``, and the functions humanize, humanizePercentage, humanizeDuration, printf, toUpper, toLower
and title. Values print as Go prints them (``%v``). Anything else is refused by
:func:`check_template`, so a rule the evaluator cannot expand fails at build time.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from exporters.errors import InferwatchError

_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.DOTALL)


class TemplateError(InferwatchError, ValueError):
    """A template uses a construct outside the supported subset."""


@dataclass(frozen=True, slots=True)
class TemplateData:
    """What a template can refer to."""

    labels: Mapping[str, str]
    value: float
    external_labels: Mapping[str, str]
    external_url: str = ""


def go_value(value: object) -> str:
    """Print a value as Go's ``%v`` does (floats: shortest digits, exponent below 1e-4 or from 1e6)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float_g(value)
    return str(value)


def _go_float_g(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    point = len(digits) + exponent  # position of the decimal point in the digit string
    exp = point - 1
    prefix = "-" if sign else ""
    if exp < -4 or exp >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{prefix}{text}{'0' * (point - len(text))}"
    return f"{prefix}{text[:point]}.{text[point:]}"


def _g4(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return "%.4g" % value  # noqa: UP031 (Go's %.4g and Python's agree for finite values)


def _float(value: object) -> float:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError as err:
            raise TemplateError(f"cannot convert {value!r} to a number") from err
    if isinstance(value, int | float):
        return float(value)
    raise TemplateError(f"cannot convert {value!r} to a number")


def humanize(value: object) -> str:
    """Prometheus' humanize: SI prefixes, 4 significant digits."""
    v = _float(value)
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix = p
            v /= 1000
        return f"{_g4(v)}{prefix}"
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix = p
        v *= 1000
    return f"{_g4(v)}{prefix}"


def humanize_percentage(value: object) -> str:
    """Prometheus' humanizePercentage: a ratio as a percentage, 4 significant digits."""
    return f"{_g4(_float(value) * 100)}%"


def humanize_duration(value: object) -> str:
    """Prometheus' humanizeDuration: seconds as ``1d 2h 3m 4s`` or with a sub-second prefix."""
    v = _float(value)
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    if v == 0:
        return f"{_g4(v)}s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        whole = int(v)
        seconds, minutes = whole % 60, (whole // 60) % 60
        hours, days = (whole // 3600) % 24, whole // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix = p
        v *= 1000
    return f"{_g4(v)}{prefix}s"


_VERB = re.compile(r"%([-+# 0]*)(\d+)?(?:\.(\d+))?([vsdfgeqx%])")


def printf(fmt: object, *args: object) -> str:
    """Go's Sprintf for the verbs %v %s %d %f %g %e %q %x and %%."""
    queue = list(args)

    def one(match: re.Match[str]) -> str:
        flags, width, precision, verb = match.groups()
        if verb == "%":
            return "%"
        if not queue:
            return f"%!{verb}(MISSING)"
        arg = queue.pop(0)
        if verb in "vs":
            text = go_value(arg)
        elif verb == "q":
            text = '"' + str(arg).replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif verb == "d":
            if isinstance(arg, float):
                return f"%!d(float64={go_value(arg)})"
            text = str(arg)
        else:
            number = _float(arg)
            if math.isnan(number) or math.isinf(number):
                text = go_value(number)
            else:
                spec = f"{flags}{'.' + precision if precision is not None else ('.6' if verb in 'fe' else '')}"
                text = format(number, spec + verb) if verb != "g" or precision else _go_float_g(number)
        return text.rjust(int(width)) if width else text

    return _VERB.sub(one, str(fmt))


FUNCTIONS: dict[str, Callable[..., str]] = {
    "humanize": humanize,
    "humanizePercentage": humanize_percentage,
    "humanizeDuration": humanize_duration,
    "printf": printf,
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
    "title": lambda s: str(s).title(),
}


def _operand(token: str, data: TemplateData | None) -> object:
    """Resolve one operand: a variable, a field, or a literal."""
    for prefix, attr in (("$labels", "labels"), (".Labels", "labels"),
                         ("$externalLabels", "external_labels"), (".ExternalLabels", "external_labels")):
        if token == prefix:
            return dict(getattr(data, attr)) if data else {}
        if token.startswith(prefix + "."):
            key = token[len(prefix) + 1:]
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise TemplateError(f"unsupported field reference {token!r}")
            if data is None:
                return ""
            mapping = getattr(data, attr)
            return mapping.get(key, "")
    if token in ("$value", ".Value"):
        return data.value if data else 0.0
    if token in ("$externalURL", ".ExternalURL"):
        return data.external_url if data else ""
    if token.startswith('"') or token.startswith("`"):
        return token[1:-1].encode().decode("unicode_escape") if token[0] == '"' else token[1:-1]
    try:
        return int(token)
    except ValueError:
        pass
    try:
        return float(token)
    except ValueError:
        raise TemplateError(f"unsupported template operand {token!r}") from None


def _split(pipeline: str) -> list[list[str]]:
    lexer = shlex.shlex(pipeline, posix=False, punctuation_chars="|")
    lexer.whitespace_split = True
    lexer.quotes = '"`'
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token == "|":
            commands.append([])
        else:
            commands[-1].append(token)
    if any(not c for c in commands):
        raise TemplateError(f"empty command in pipeline {pipeline!r}")
    return commands


def _run(pipeline: str, data: TemplateData | None) -> str:
    if pipeline.startswith("/*"):
        return ""
    previous: object = None
    for index, words in enumerate(_split(pipeline)):
        head, rest = words[0], words[1:]
        if head in FUNCTIONS:
            args = [_operand(w, data) for w in rest]
            if index > 0:
                args.append(previous)
            previous = FUNCTIONS[head](*args)
        else:
            if rest or index > 0:
                raise TemplateError(f"{head!r} is not a supported function (in {pipeline!r})")
            previous = _operand(head, data)
    return go_value(previous)


def expand(text: str, data: TemplateData) -> str:
    """Expand a template; an error yields Prometheus-style ``<error expanding template: ...>``."""
    try:
        return _expand(text, data)
    except (TemplateError, TypeError, ValueError) as err:
        return f"<error expanding template: {err}>"


def _expand(text: str, data: TemplateData | None) -> str:
    out: list[str] = []
    pos = 0
    for match in _ACTION.finditer(text):
        literal = text[pos:match.start()]
        if match.group(1):
            literal = literal.rstrip()
        out.append(literal)
        out.append(_run(match.group(2), data))
        pos = match.end()
        if match.group(3):
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip())
    out.append(text[pos:])
    return "".join(out)


def check_template(text: str) -> None:
    """Raise TemplateError when ``text`` uses anything outside the supported subset."""
    if text.count("{{") != text.count("}}"):
        raise TemplateError(f"unbalanced braces in template {text!r}")
    _expand(text, None)

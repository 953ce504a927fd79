"""The subset of Prometheus' Go alert templates used in labels and annotations.

Supported: ``{{ $labels.NAME }}``, ``{{ .Labels.NAME }}``, ``{{ $value }}``, ``{{ .Value }}``,
``{{ $externalLabels.NAME }}``, ``{{ $externalURL }}``, ``{{ . }}``, string (``"..."``, raw
```...```) and number literals, pipelines with ``|``, the actions ``with``/``else``/``end`` and
``range``/``else``/``end`` (the dot becomes the pipeline's value: a query result, one sample of it,
a number or a string; Go's truth: empty results, 0 and "" are false), and the functions humanize,
humanizePercentage, humanizeDuration, printf, toUpper, toLower, title, and Prometheus' query
functions ``query`` (an instant query at the alert's evaluation time), ``first``, ``value``,
``label`` and ``sortByLabel``; a sample's fields are ``.Labels.NAME`` and ``.Value``. Values print
as Go prints them (``%v``). Anything else (``if``, variables, parentheses, other functions) is
refused by :func:`check_template`, so a rule the evaluator cannot expand fails at build time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from alert_rules.promql.gofloat import format_float
from exporters.errors import InferwatchError


class TemplateError(InferwatchError, ValueError):
    """A template uses a construct outside the supported subset."""


@dataclass(frozen=True, slots=True)
class TemplateData:
    """What a template can refer to."""

    labels: Mapping[str, str]
    value: float
    external_labels: Mapping[str, str]
    external_url: str = ""
    query: QueryFunc | None = field(default=None, compare=False)
    """Runs an instant query at the alert's evaluation time: (labels, value) pairs (``query``)."""


QueryFunc = Callable[[str], Sequence[tuple[Sequence[tuple[str, str]], float]]]


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of a query result, as Prometheus' template ``sample``: ``.Labels`` and ``.Value``."""

    labels: Mapping[str, str]
    value: float


def go_value(value: object) -> str:
    """Print a value as Go's ``%v`` does (floats: shortest digits, exponent below 1e-4 or from 1e6)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_float(value, "g")
    return str(value)


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
                text = format(number, spec + verb) if verb != "g" or precision else format_float(number, "g")
        return text.rjust(int(width)) if width else text

    return _VERB.sub(one, str(fmt))


def _first(result: object) -> Sample:
    if not isinstance(result, list):
        raise TemplateError(f"first() needs a query result, got {go_value(result)!r}")
    if not result:
        raise TemplateError("first() called on vector with no elements")
    return cast(Sample, result[0])


def _sample(value: object, where: str) -> Sample:
    if not isinstance(value, Sample):
        raise TemplateError(f"{where} needs a sample (e.g. query ... | first)")
    return value


def _sort_by_label(name: object, result: object) -> list[Sample]:
    if not isinstance(result, list):
        raise TemplateError("sortByLabel needs a query result")
    return sorted(result, key=lambda s: s.labels.get(str(name), ""))


def _greater(a: object, b: object) -> bool:
    """Go's ``gt`` on two numbers of one kind (``gt $value 8.0``; an int against a float is an error there)."""
    if type(a) is not type(b) or not isinstance(a, int | float) or not isinstance(b, int | float):
        raise TemplateError(f"incompatible types for comparison: {go_value(a)} and {go_value(b)}")
    return a > b


FUNCTIONS: dict[str, Callable[..., object]] = {
    "humanize": humanize,
    "humanizePercentage": humanize_percentage,
    "humanizeDuration": humanize_duration,
    "printf": printf,
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
    "title": lambda s: str(s).title(),
    "first": _first,
    "value": lambda s: _sample(s, "value").value,
    "label": lambda name, s: _sample(s, "label").labels.get(str(name), ""),
    "sortByLabel": _sort_by_label,
    "gt": _greater,
    "query": None,  # type: ignore[dict-item]  # needs the evaluator: see _call
}
ARITY = {"printf": None, "label": 2, "sortByLabel": 2, "gt": 2}
"""How many arguments each function takes (None: any number, at least one); the others take one."""

_KEYWORDS = frozenset({"if", "else", "end", "with", "range", "define", "template", "block", "break",
                       "continue", "nil", "and", "or", "not", "len", "index", "slice", "call", "html",
                       "js", "urlquery", "print", "println", "eq", "ne", "lt", "le", "gt", "ge"})
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|0[xX][0-9a-fA-F]+)")
_ROOT_FIELDS = {"Labels": "labels", "ExternalLabels": "external_labels"}


def _field(base: object, name: str, token: str) -> object:
    if isinstance(base, Mapping):
        return base.get(name, "")
    if isinstance(base, Sample):
        if name == "Labels":
            return dict(base.labels)
        if name == "Value":
            return base.value
    if isinstance(base, TemplateData):
        if name in _ROOT_FIELDS:
            return dict(getattr(base, _ROOT_FIELDS[name]))
        if name == "Value":
            return base.value
        if name == "ExternalURL":
            return base.external_url
    if base is None:  # checking only: no data
        return ""
    raise TemplateError(f"can't evaluate field {name} in {token!r}")


def _check_operand(token: str) -> None:
    """Refuse an operand outside the subset (without evaluating it)."""
    if token[0] in '"`':
        return
    if _NUMBER.fullmatch(token):
        return
    if token == ".":  # noqa: S105 - a template token, not a secret
        return
    if token.startswith("."):
        parts = token[1:].split(".")
    elif token.startswith("$"):
        var, *parts = token[1:].split(".")
        if var not in ("labels", "value", "externalLabels", "externalURL"):
            raise TemplateError(f"unsupported template variable {token!r}")
        if var in ("value", "externalURL") and parts:
            raise TemplateError(f"unsupported field reference {token!r}")
        if var in ("labels", "externalLabels") and len(parts) > 1:
            raise TemplateError(f"unsupported field reference {token!r}")
    else:
        raise TemplateError(f"unsupported template operand {token!r}")
    if any(not _FIELD.fullmatch(p) for p in parts) or len(parts) > 2:
        raise TemplateError(f"unsupported field reference {token!r}")


def _operand(token: str, dot: object, data: TemplateData | None) -> object:
    """Resolve one operand: a variable, a field of the dot, or a literal."""
    _check_operand(token)
    if token[0] == '"':
        return token[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    if token[0] == "`":
        return token[1:-1]
    if _NUMBER.fullmatch(token):
        try:
            return int(token, 0)
        except ValueError:
            return float(token)
    if token == ".":  # noqa: S105 - a template token, not a secret
        return dot
    if token.startswith("$"):
        var, *parts = token[1:].split(".")
        base: object = {
            "labels": dict(data.labels) if data else {},
            "externalLabels": dict(data.external_labels) if data else {},
            "value": data.value if data else 0.0,
            "externalURL": data.external_url if data else "",
        }[var]
    else:
        base, parts = dot, token[1:].split(".")
    for part in parts:
        base = _field(base, part, token)
    return base


def _lex_pipeline(text: str) -> list[list[str]]:
    """Words of a pipeline, split into commands at ``|`` outside quotes."""
    commands: list[list[str]] = [[]]
    pos = 0
    while pos < len(text):
        ch = text[pos]
        if ch.isspace():
            pos += 1
        elif ch == "|":
            commands.append([])
            pos += 1
        elif ch in '"`':
            end = pos + 1
            while end < len(text) and text[end] != ch:
                end += 2 if ch == '"' and text[end] == "\\" else 1
            if end >= len(text):
                raise TemplateError(f"unterminated string in {text!r}")
            commands[-1].append(text[pos:end + 1])
            pos = end + 1
        elif ch in "()":
            raise TemplateError(f"parentheses are not supported (in {text!r})")
        else:
            end = pos
            while end < len(text) and not text[end].isspace() and text[end] not in '|"`()':
                end += 1
            word = text[pos:end]
            if ":=" in word or word == "=":
                raise TemplateError(f"variable declarations are not supported (in {text!r})")
            commands[-1].append(word)
            pos = end
    if any(not c for c in commands):
        raise TemplateError(f"empty command in pipeline {text!r}")
    return commands


def _check_pipeline(text: str) -> list[list[str]]:
    commands = _lex_pipeline(text)
    for index, words in enumerate(commands):
        head, rest = words[0], words[1:]
        if head in FUNCTIONS:
            count = len(rest) + (1 if index > 0 else 0)
            arity = ARITY.get(head, 1)
            if (arity is None and count < 1) or (arity is not None and count != arity):
                raise TemplateError(f"wrong number of arguments for {head} (in {text!r})")
        elif rest or index > 0 or head in _KEYWORDS or not (head[0] in '"`.$' or _NUMBER.fullmatch(head)):
            raise TemplateError(f"{head!r} is not a supported function (in {text!r})")
        for word in rest if head in FUNCTIONS else words:
            _check_operand(word)
    return commands


def _call(name: str, args: list[object], data: TemplateData | None) -> object:
    if name != "query":
        function = FUNCTIONS[name]
        return function(*args)
    if data is None or data.query is None:
        return []
    (text,) = args
    if not isinstance(text, str):
        raise TemplateError(f"query needs a string, got {go_value(text)!r}")
    try:
        result = data.query(text)
    except (TemplateError, ValueError, RuntimeError, ArithmeticError) as err:
        raise TemplateError(f"error executing query: {err}") from err
    if isinstance(result, float):  # a scalar: Prometheus' template query gives one sample without labels
        return [Sample({}, result)]
    return [Sample(dict(labels), value) for labels, value in result]


def _pipeline(text: str, dot: object, data: TemplateData | None) -> object:
    previous: object = None
    for index, words in enumerate(_check_pipeline(text)):
        head, rest = words[0], words[1:]
        if head in FUNCTIONS:
            args = [_operand(w, dot, data) for w in rest]
            if index > 0:
                args.append(previous)
            previous = _call(head, args, data)
        else:
            previous = _operand(head, dot, data)
    return previous


def _truth(value: object) -> bool:
    """Go's template truth: false, 0, "", nil and empty collections are false."""
    if isinstance(value, Sample):
        return True
    if isinstance(value, float):
        return value != 0
    return bool(value)


def _print(value: object) -> str:
    if isinstance(value, Sample | list | dict):
        raise TemplateError("printing a query result, a sample or a map is not supported (pipe it to "
                            "first, value or label)")
    return go_value(value)


@dataclass(slots=True)
class _Block:
    kind: str  # "if" | "with" | "range"
    pipeline: str
    body: list[_Node] = field(default_factory=list)
    otherwise: list[_Node] | None = None


@dataclass(frozen=True, slots=True)
class _Action:
    pipeline: str


_Node = str | _Action | _Block


def _actions(text: str) -> list[str | tuple[str]]:
    """Split a template into literal text and action bodies (``(body,)``), applying trim markers."""
    out: list[str | tuple[str]] = []
    pos = 0
    while True:
        start = text.find("{{", pos)
        if start < 0:
            out.append(text[pos:])
            return out
        literal = text[pos:start]
        inner = start + 2
        if text.startswith("- ", inner) or text.startswith("-\t", inner) or text.startswith("-\n", inner):
            literal = literal.rstrip()
            inner += 1
        out.append(literal)
        end = inner
        while True:
            if end >= len(text):
                raise TemplateError(f"unclosed action in template {text!r}")
            ch = text[end]
            if ch in '"`':
                close = end + 1
                while close < len(text) and text[close] != ch:
                    close += 2 if ch == '"' and text[close] == "\\" else 1
                end = close + 1
                continue
            if text.startswith("}}", end):
                break
            end += 1
        body, pos = text[inner:end], end + 2
        if body.rstrip().endswith(" -") or body.strip() == "-" or body.rstrip().endswith("\t-"):
            body = body.rstrip()[:-1]
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip())
        out.append((body.strip(),))


def _parse(text: str) -> list[_Node]:
    root: list[_Node] = []
    stack: list[_Block] = []

    def current() -> list[_Node]:
        if not stack:
            return root
        block = stack[-1]
        return block.otherwise if block.otherwise is not None else block.body

    for part in _actions(text):
        if isinstance(part, str):
            if part:
                current().append(part)
            continue
        (body,) = part
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError(f"unclosed comment in template {text!r}")
            continue
        keyword = body.split(None, 1)[0] if body else ""
        if keyword in ("if", "with", "range"):
            rest = body[len(keyword):].strip()
            if not rest:
                raise TemplateError(f"missing pipeline after {keyword!r}")
            _check_pipeline(rest)
            block = _Block(keyword, rest)
            current().append(block)
            stack.append(block)
        elif keyword == "else":
            if body != "else":
                raise TemplateError(f"{body!r}: only a plain else is supported")
            if not stack or stack[-1].otherwise is not None:
                raise TemplateError(f"unexpected else in template {text!r}")
            stack[-1].otherwise = []
        elif keyword == "end":
            if body != "end" or not stack:
                raise TemplateError(f"unexpected end in template {text!r}")
            stack.pop()
        elif keyword in _KEYWORDS:
            raise TemplateError(f"the action {keyword!r} is not supported (in {body!r})")
        else:
            _check_pipeline(body)
            current().append(_Action(body))
    if stack:
        raise TemplateError(f"unexpected EOF: {stack[-1].kind} without end in template {text!r}")
    return root


def _execute(nodes: list[_Node], dot: object, data: TemplateData | None, out: list[str]) -> None:
    for node in nodes:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, _Action):
            out.append(_print(_pipeline(node.pipeline, dot, data)))
        else:
            value = _pipeline(node.pipeline, dot, data)
            if node.kind == "if":
                branch = node.body if _truth(value) else node.otherwise
                _execute(branch or [], dot, data, out)
                continue
            if node.kind == "with":
                if _truth(value):
                    _execute(node.body, value, data, out)
                elif node.otherwise is not None:
                    _execute(node.otherwise, dot, data, out)
                continue
            items = list(value.values()) if isinstance(value, dict) else value
            if not isinstance(items, list):
                raise TemplateError(f"range can't iterate over {go_value(value)}")
            for item in items:
                _execute(node.body, item, data, out)
            if not items and node.otherwise is not None:
                _execute(node.otherwise, dot, data, out)


def _expand(text: str, data: TemplateData | None) -> str:
    out: list[str] = []
    _execute(_parse(text), data, data, out)
    return "".join(out)


def expand(text: str, data: TemplateData) -> str:
    """Expand a template; an error yields Prometheus-style ``<error expanding template: ...>``."""
    try:
        return _expand(text, data)
    except (TemplateError, TypeError, ValueError) as err:
        return f"<error expanding template: {err}>"


def check_template(text: str) -> None:
    """Raise TemplateError when ``text`` uses anything outside the supported subset.

    Every branch is checked (each action's words, functions and their argument counts), whichever
    a query would select at run time.
    """
    _parse(text)

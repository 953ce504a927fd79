"""label_replace and label_join as Prometheus 2.42 computes them, with Go's ``Regexp.Expand`` rules.

The regex is anchored at both ends (``^(?:regex)$``); ``$1``, ``${1}``, ``$name`` and ``${name}`` take the
longest run of letters, digits and ``_`` as the group's name, so ``$1x`` names group ``1x`` (there is
none: it expands to nothing), ``$$`` is a ``$``, and a malformed reference stays as it is written.
"""

from __future__ import annotations

import re

from alert_rules.promql.values import Labels, Vector, get


def compile_anchored(regex: str) -> re.Pattern[str]:
    """The pattern label_replace matches with: the whole source value must match."""
    return re.compile(f"^(?:{regex})$", re.DOTALL)


def _reference(template: str) -> tuple[str, str] | None:
    """(name, rest of the template) of a ``$`` reference at the start of ``template``, None if malformed."""
    brace = template.startswith("{")
    body = template[1:] if brace else template
    i = 0
    while i < len(body) and (body[i].isalnum() or body[i] == "_"):
        i += 1
    if i == 0:
        return None
    name = body[:i]
    if brace:
        if i >= len(body) or body[i] != "}":
            return None
        i += 1
    return name, body[i:]


def _group(match: re.Match[str], name: str) -> str:
    if name.isdigit() and name.isascii():
        if len(name) > 1 and name[0] == "0":  # Go refuses leading zeros: a name, never a number
            return ""
        number = int(name)
        if number > match.re.groups:
            return ""
        return match.group(number) or ""
    if name in match.re.groupindex:
        return match.group(name) or ""
    return ""


def expand(template: str, match: re.Match[str]) -> str:
    """Go's ``Regexp.ExpandString`` of ``template`` with the groups of ``match``."""
    out: list[str] = []
    while True:
        before, dollar, after = template.partition("$")
        out.append(before)
        if not dollar:
            return "".join(out)
        if after.startswith("$"):
            out.append("$")
            template = after[1:]
            continue
        found = _reference(after)
        if found is None:
            out.append("$")
            template = after
            continue
        name, template = found
        out.append(_group(match, name))


def _with(labels: Labels, name: str, value: str) -> Labels:
    kept = [p for p in labels if p[0] != name]
    if value:
        kept.append((name, value))
    return tuple(sorted(kept))


def label_replace(vec: Vector, dst: str, replacement: str, src: str, pattern: re.Pattern[str]) -> Vector:
    """Each sample with ``dst`` set from the expansion, when the source label matches; as it is otherwise."""
    out: Vector = []
    done: dict[Labels, Labels] = {}
    for labels, value in vec:
        result = done.get(labels)
        if result is None:
            match = pattern.match(get(labels, src))
            result = labels if match is None else _with(labels, dst, expand(replacement, match))
            done[labels] = result
        out.append((result, value))
    return out


def label_join(vec: Vector, dst: str, separator: str, sources: tuple[str, ...]) -> Vector:
    """Each sample with ``dst`` set to the source labels' values joined (removed when that is empty)."""
    return [(_with(labels, dst, separator.join(get(labels, s) for s in sources)), value) for labels, value in vec]

"""Wrong-model answers: an answer from another model than the one asked for, or a request for a retired model.

After a cut-over, stale clients keep asking for the old name, and a stale gateway route can send a request
to another model; the answer's ``model`` field says which model answered. It is compared with the request's
``model`` up to the names that mean the same model:

- aliases the upstream serves: the ``/v1/models`` entries with the same ``root`` (vLLM lists every
  ``--served-model-name`` as its own entry and answers under the first one), learnt by the sidecar;
- a configured rename map (``serve.model_renames``, requested name -> the name it is answered under), for
  a gateway that rewrites names on the way.

Pure: the sidecar builds a new :class:`ModelNames` whenever it learns the upstream's models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporters.catalog.cutover import OTHER_MODEL, RETIRED_MODEL


def aliases_from_models(payload: Any) -> dict[str, frozenset[str]]:
    """Model name -> every name of the same model (itself included), from an upstream's ``/v1/models`` answer.

    Entries group by ``root`` (the model's path or repository); an entry without one stands alone. A LoRA
    adapter (an entry with a ``parent``) is a model of its own. Anything that is not such a list reads as none.
    """
    data = payload.get("data") if isinstance(payload, dict) else None
    groups: dict[str, set[str]] = {}
    for entry in data if isinstance(data, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        root = entry.get("root")
        key = root if isinstance(root, str) and root and not entry.get("parent") else f"id:{entry['id']}"
        groups.setdefault(key, set()).add(entry["id"])
    return {name: frozenset(names) for names in groups.values() for name in names}


@dataclass(frozen=True, slots=True)
class ModelNames:
    """The names that mean the same model, and the retired ones."""

    aliases: Mapping[str, frozenset[str]] = field(default_factory=dict)
    renames: Mapping[str, str] = field(default_factory=dict)
    retired: frozenset[str] = frozenset()

    def with_aliases(self, aliases: Mapping[str, frozenset[str]]) -> ModelNames:
        """The same names with the upstream's aliases replaced by ``aliases``."""
        return ModelNames(dict(aliases), self.renames, self.retired)

    def same_model(self, requested: str, answered: str) -> bool:
        """Whether an answer under ``answered`` is an answer from the model ``requested`` names."""
        if answered == requested:
            return True
        expected = self.renames.get(requested, requested)
        return answered == expected or answered in self.aliases.get(expected, ())

    def wrong_model(self, requested: str | None, answered: str | None) -> str | None:
        """The reason a request counts as a wrong-model request, or None when it does not.

        A request for a retired model counts whatever the answer; otherwise only an answer that names
        its model (successful answers do) can differ from the request.
        """
        if requested is None:
            return None
        if requested in self.retired:
            return RETIRED_MODEL
        if answered is None or self.same_model(requested, answered):
            return None
        return OTHER_MODEL


def model_names(renames: Mapping[str, str], retired: Iterable[str]) -> ModelNames:
    """The configured part of :class:`ModelNames` (``serve.model_renames``, ``serve.retired_models``)."""
    return ModelNames({}, dict(renames), frozenset(retired))


__all__ = ["OTHER_MODEL", "RETIRED_MODEL", "ModelNames", "aliases_from_models", "model_names"]

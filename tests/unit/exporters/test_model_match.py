"""Wrong-model decisions: aliases from /v1/models, the rename map and retired names."""

from __future__ import annotations

from exporters.model_match import OTHER_MODEL, RETIRED_MODEL, aliases_from_models, model_names

VLLM_MODELS = {"object": "list", "data": [
    {"id": "llama", "object": "model", "root": "/models/llama-3", "parent": None},
    {"id": "llama-latest", "object": "model", "root": "/models/llama-3", "parent": None},
    {"id": "qwen", "object": "model", "root": "/models/qwen", "parent": None},
    {"id": "sql-lora", "object": "model", "root": "/adapters/sql", "parent": "llama"},
]}


def test_aliases_group_by_root_and_adapters_stand_alone() -> None:
    """Served names with one root are aliases; a LoRA adapter is its own model; junk reads as none."""
    aliases = aliases_from_models(VLLM_MODELS)
    assert aliases["llama-latest"] == frozenset({"llama", "llama-latest"})
    assert aliases["qwen"] == frozenset({"qwen"})
    assert aliases["sql-lora"] == frozenset({"sql-lora"})
    assert aliases_from_models({"data": "nope"}) == {}
    assert aliases_from_models(None) == {}


def test_an_alias_or_a_rename_is_the_same_model() -> None:
    """An answer under an alias or under the configured rename is right; under another served model, wrong."""
    names = model_names({"gpt-4o": "llama"}, []).with_aliases(aliases_from_models(VLLM_MODELS))
    assert names.wrong_model("llama-latest", "llama") is None
    assert names.wrong_model("gpt-4o", "llama") is None
    assert names.wrong_model("gpt-4o", "llama-latest") is None
    assert names.wrong_model("llama", "qwen") == OTHER_MODEL
    assert model_names({}, []).wrong_model("llama-latest", "llama") == OTHER_MODEL  # nothing learnt yet


def test_a_retired_name_counts_whatever_the_answer() -> None:
    """A request for a retired model is a wrong-model request, answered or refused; no model, no decision."""
    names = model_names({}, ["llama-2"])
    assert names.wrong_model("llama-2", None) == RETIRED_MODEL
    assert names.wrong_model("llama-2", "llama-2") == RETIRED_MODEL
    assert names.wrong_model(None, "llama") is None
    assert names.wrong_model("llama", None) is None

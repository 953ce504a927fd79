"""What a model cut-over breaks: wrong-model answers, tokenizer drift, and text classes that fail."""

from __future__ import annotations

from exporters.catalog.spec import MetricSpec, MetricType

OTHER_MODEL = "other_model"
"""``reason``: the answer's ``model`` is neither the requested one nor one of its aliases or renames."""
RETIRED_MODEL = "retired_model"
"""``reason``: the request names a model on ``serve.retired_models``."""
WRONG_MODEL_REASONS = (OTHER_MODEL, RETIRED_MODEL)
"""Every value of the ``reason`` label of the wrong-model family."""
PLAIN, EMOJI_DENSE, CJK = "plain", "emoji_dense", "cjk"
TEXT_CLASSES = (PLAIN, EMOJI_DENSE, CJK)
"""Every value of the ``text_class`` label (exporters/text_class.py decides which)."""

WRONG_MODEL_REQUESTS = MetricSpec(
    "inferwatch_wrong_model_requests", MetricType.COUNTER,
    "Requests answered by another model than the one they asked for (reason other_model: the answer's model is "
    "neither the requested one nor an alias from the upstream's /v1/models or serve.model_renames) or asking for "
    "a model on serve.retired_models (reason retired_model), by the requested model (a served or retired name, "
    "else other).",
    ("model_name", "reason"),
)
TEXT_CLASS_REQUESTS = MetricSpec(
    "inferwatch_text_class_requests", MetricType.COUNTER,
    "Generation requests by model, the prompt's text class (plain; emoji_dense: more emoji than "
    "serve.emoji_dense_threshold; cjk: at least a third CJK characters) and outcome class.",
    ("model_name", "text_class", "outcome"),
)
UPSTREAM_TOKENIZER = MetricSpec(
    "inferwatch_upstream_tokenizer_info", MetricType.GAUGE,
    "Value 1; fingerprint = the fingerprint of an upstream's tokenizer for a model: a hash of its /tokenize "
    "over a fixed probe set, taken whenever the upstream becomes ready.",
    ("upstream", "model_name", "fingerprint"),
)
UPSTREAM_TOKENIZER_CHANGES = MetricSpec(
    "inferwatch_upstream_tokenizer_changes", MetricType.COUNTER,
    "Times an upstream's tokenizer fingerprint changed under the same model name (0 from its first fingerprint).",
    ("upstream", "model_name"),
)

SPECS: tuple[MetricSpec, ...] = (WRONG_MODEL_REQUESTS, TEXT_CLASS_REQUESTS, UPSTREAM_TOKENIZER,
                                 UPSTREAM_TOKENIZER_CHANGES)

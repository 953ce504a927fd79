"""The batch-size advice: suggestions within their bounds, two directions that never fire together."""

from __future__ import annotations

import pytest

from alert_rules.config import RulesConfig
from alert_rules.intervene import BatchAdvice, batch_advice
from alert_rules.promql.evaluate import Evaluator
from alert_rules.promtool_runner import load_series
from alert_rules.store import SeriesStore
from exporters.configuring import field_docs
from exporters.errors import ConfigError


def _advice(**overrides: object) -> BatchAdvice:
    return BatchAdvice.of(RulesConfig(**overrides))  # type: ignore[arg-type]


@pytest.mark.parametrize("max_num_seqs", [1, 2, 4, 5, 8, 12, 13, 15, 16, 17, 64, 256])
@pytest.mark.parametrize(("batch_min", "batch_max"), [(1, 16), (2, 8), (6, 6), (1, 3)])
def test_every_suggestion_lies_within_the_bounds(max_num_seqs: int, batch_min: int, batch_max: int) -> None:
    """Whatever the limit, a suggestion lies in [batch_min, batch_max] and moves the limit the way it says."""
    advice = _advice(max_num_seqs=max_num_seqs, batch_min=batch_min, batch_max=batch_max)
    if advice.raise_to is not None:
        assert batch_min <= advice.raise_to <= batch_max
        assert advice.raise_to > max_num_seqs
    if advice.lower_to is not None:
        assert batch_min <= advice.lower_to <= min(4, batch_max) or advice.lower_to == batch_min
        assert advice.lower_to < max_num_seqs


def test_the_raise_is_the_factor_capped_at_batch_max() -> None:
    """8 x 1.25 = 10; 14 x 1.25 = 17.5 is capped at 16; at 16 there is nothing left to raise."""
    assert _advice(max_num_seqs=8).raise_to == 10
    assert _advice(max_num_seqs=14).raise_to == 16
    assert _advice(max_num_seqs=16).raise_to is None
    assert _advice(max_num_seqs=256).raise_to is None


def test_the_lower_suggests_four_and_never_below_batch_min() -> None:
    """Lowering suggests 4 by default, batch_min when that is higher, and nothing at a limit of 4 or less."""
    assert _advice(max_num_seqs=256).lower_to == 4
    assert _advice(max_num_seqs=256, batch_min=6).lower_to == 6
    assert _advice(max_num_seqs=4).lower_to is None


@pytest.mark.parametrize(("overrides", "key"), [
    ({"batch_min": 8, "batch_max": 4}, "rules.batch_min"),
    ({"batch_raise_factor": 1.0}, "rules.batch_raise_factor"),
], ids=["bounds crossed", "a factor that does not raise"])
def test_inconsistent_settings_are_refused(overrides: dict[str, object], key: str) -> None:
    """A config where the bounds cross or the raise does not raise fails where the rule is built."""
    with pytest.raises(ConfigError) as err:
        batch_advice(RulesConfig(**overrides), ())  # type: ignore[arg-type]
    assert err.value.key == key


def test_the_two_directions_never_fire_together() -> None:
    """Over every input of the advice's scenario, both directions' inputs together, at every step: at most one
    suggestion per model, and each fires somewhere (the evaluator, not the builder, decides)."""
    config = RulesConfig(max_num_seqs=8)
    alert = batch_advice(config, ())[0]
    scenario = alert.scenario(config, alert, ())
    raise_inputs = next(c.inputs for c in scenario.cases if c.fires_with and c.fires_with["direction"] == "lower")
    seen: set[float] = set()
    for inputs in (scenario.firing, raise_inputs, *(c.inputs for c in scenario.cases)):
        store = SeriesStore()
        load_series(store, [s.to_dict() for s in inputs], scenario.step_s * 1000)
        evaluator = Evaluator(store)
        for t in range(0, 6000, scenario.step_s):
            result = evaluator.query(alert.expr, t * 1000)
            assert isinstance(result, list)
            assert len(result) <= 1
            seen.update(v for _, v in result)
    assert seen == {10.0, 4.0}


def test_the_labels_name_the_direction_from_the_suggestion() -> None:
    """direction and suggested_max_num_seqs are read from the expression's value, against the current limit."""
    alert = batch_advice(RulesConfig(max_num_seqs=8), ())[0]
    assert alert.labels["suggested_max_num_seqs"] == "{{ $value }}"
    assert alert.labels["direction"] == "{{ if gt $value 8.0 }}raise{{ else }}lower{{ end }}"
    assert alert.severity == "info"


def test_each_advice_setting_has_its_flag() -> None:
    """Every advice setting is a documented key with its --rules-... flag."""
    flags = {doc.flag for doc in field_docs(RulesConfig, "rules")}
    for key in ("batch_low_qps", "batch_min", "batch_max", "batch_low_traffic_max", "batch_p99_rise", "batch_for_s"):
        assert f"--rules-{key.replace('_', '-')}" in flags

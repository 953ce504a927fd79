"""The kill drill's findings: restarts counted by the sidecar, recovery, and how they are told."""

from __future__ import annotations

from serving.commands.drill import format_drill
from serving.loadtest.client import RequestResult
from serving.loadtest.coldstart import ColdStart
from serving.loadtest.drill import DrillResult


def _result(**changes: object) -> DrillResult:
    result = DrillResult(42, "VLLM::EngineCore")
    result.recovery = ColdStart(1, 4.0, command_done_s=30.0, down_s=4.1, ready_s=31.0, first_token_s=31.2)
    result.results = [RequestResult(index=0, status=200), RequestResult(index=1, error="stream_error")]
    for key, value in changes.items():
        setattr(result, key, value)
    return result


def test_restarts_counted_are_the_increase_per_reason() -> None:
    """A reason missing before counts from zero; without the sidecar's numbers there is no count."""
    result = _result(restarts_before={"readiness": 2.0}, restarts_after={"readiness": 3.0, "pid_change": 1.0})
    assert result.restarts_counted == {"pid_change": 1.0, "readiness": 1.0}
    assert _result().restarts_counted is None


def test_recovered_needs_ready_and_a_token() -> None:
    """Ready without a first token, or an error, is not a recovery."""
    assert _result().recovered
    assert not _result(recovery=ColdStart(1, 4.0, ready_s=31.0)).recovered
    assert not _result(recovery=ColdStart(1, 4.0, ready_s=31.0, first_token_s=32.0, error="boom")).recovered


def test_the_findings_as_lines() -> None:
    """Times after the kill, failures, the sidecar's count and the alerts seen."""
    text = format_drill(_result(restarts_before={"readiness": 0.0}, restarts_after={"readiness": 1.0},
                                alerts={"InferwatchUpstreamDown": "firing"}))
    assert "ready       27.0 s after the kill" in text
    assert "first token 27.2 s after the kill" in text
    assert "2 sent, 1 failed" in text
    assert "readiness +1" in text
    assert "InferwatchUpstreamDown (firing)" in text
    assert text.endswith("verdict     recovered")

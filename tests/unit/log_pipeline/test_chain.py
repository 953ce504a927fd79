"""Tests of the structlog processors and the request logger."""

from __future__ import annotations

import io
import json
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry

from log_pipeline.chain import REDACTED, add_schema_version, configure_logging, redact, request_logger
from log_pipeline.config import LogConfig
from log_pipeline.query import Archive
from log_pipeline.records import SCHEMA_VERSION
from log_pipeline.sink import RecordSink


class TestProcessors:
    def test_redact_masks_secrets_and_drops_text_at_any_depth(self) -> None:
        """Authorization is masked, prompt text removed, nested headers scrubbed, the rest kept."""
        event = {
            "event": "x", "Authorization": "Bearer s3cret", "prompt": "my secret prompt",
            "headers": {"cookie": "a=b", "accept": "json", "messages": [{"content": "hi"}]}, "n": 1,
        }
        out = redact(None, "info", event)
        assert out == {"event": "x", "Authorization": REDACTED, "headers": {"cookie": REDACTED, "accept": "json"},
                       "n": 1}

    def test_schema_version_is_added_unless_present(self) -> None:
        """An event gets the current schema version; an explicit one is left alone."""
        assert add_schema_version(None, "info", {})["schema_version"] == SCHEMA_VERSION
        assert add_schema_version(None, "info", {"schema_version": 0})["schema_version"] == 0


class TestLoggers:
    def test_request_logger_sends_redacted_events_to_the_sink(self, tmp_path: Path) -> None:
        """An error logged through the request logger is archived without its Authorization value."""
        sink = RecordSink(LogConfig(dir=str(tmp_path)), CollectorRegistry())
        sink.start()
        request_logger(sink).info("request", trace_id="1" * 32, outcome="timeout", authorization="Bearer x")
        sink.close(5.0)
        (record,) = Archive(tmp_path).records()
        assert record == {"event": "request", "trace_id": "1" * 32, "outcome": "timeout",
                          "authorization": REDACTED, "schema_version": SCHEMA_VERSION}

    def test_configure_logging_writes_json_lines_without_secrets(self) -> None:
        """Diagnostics become one JSON object per line with level, timestamp and no secret."""
        stream = io.StringIO()
        configure_logging("info", stream=stream)
        try:
            structlog.get_logger("t").warning("upstream slow", authorization="Bearer x")
            structlog.get_logger("t").debug("hidden")
        finally:
            structlog.reset_defaults()
        (line,) = stream.getvalue().splitlines()
        record = json.loads(line)
        assert (record["level"], record["event"], record["authorization"]) == ("warning", "upstream slow", REDACTED)
        assert "timestamp" in record

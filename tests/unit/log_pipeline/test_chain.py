"""Tests of the structlog processors and the diagnostics set-up."""

from __future__ import annotations

import io
import json
import logging

import structlog

from log_pipeline.chain import REDACTED, add_schema_version, configure_logging, redact
from log_pipeline.records import SCHEMA_VERSION


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

    def test_standard_library_logs_join_the_same_json_lines_with_the_trace_id(self) -> None:
        """A stdlib logger's warning (the rule engine's) comes out as redacted JSON with the bound trace id."""
        stream = io.StringIO()
        root = logging.getLogger()
        saved = (root.handlers[:], root.level)
        configure_logging("info", stream=stream)
        try:
            structlog.contextvars.bind_contextvars(trace_id="ab" * 16)
            logging.getLogger("serving.rule_engine").warning("sending %d alerts failed", 3,
                                                             extra={"authorization": "Bearer x"})
            logging.getLogger("serving.rule_engine").debug("hidden")
        finally:
            structlog.contextvars.clear_contextvars()
            structlog.reset_defaults()
            root.handlers[:], root.level = saved
        (line,) = stream.getvalue().splitlines()
        record = json.loads(line)
        assert record["event"] == "sending 3 alerts failed"
        assert (record["level"], record["logger"], record["trace_id"]) == ("warning", "serving.rule_engine", "ab" * 16)
        assert record["authorization"] == REDACTED

    def test_chatty_loggers_speak_from_warning_up_unless_debug_is_asked(self) -> None:
        """A scheduler's per-job info lines stay out at the info level and come back at debug; its warnings stay."""
        root = logging.getLogger()
        saved = (root.handlers[:], root.level)
        chatty = logging.getLogger("apscheduler.executors.default")
        try:
            seen = {}
            for level in ("info", "debug"):
                stream = io.StringIO()
                configure_logging(level, stream=stream, cache=False, chatty=("apscheduler",))
                chatty.info("Running job %s", "probe")
                chatty.warning("Run time of job %s was missed", "probe")
                seen[level] = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
        finally:
            structlog.reset_defaults()
            root.handlers[:], root.level = saved
            logging.getLogger("apscheduler").setLevel(logging.NOTSET)
        assert seen == {"info": ["Run time of job probe was missed"],
                        "debug": ["Running job probe", "Run time of job probe was missed"]}

"""What a load test sends: generated prompts, mixes, prompt files and replays of an archive."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from exporters.errors import ConfigError
from exporters.records import Outcome, RequestRecord
from log_pipeline.archive import ArchiveWriter
from log_pipeline.config import LogConfig
from log_pipeline.records import event_from_record
from serving.loadtest.prompts import (
    GeneratedSource,
    Length,
    build_payload,
    load_prompts,
    parse_mix,
    prompt_text,
    replay_records,
)


class TestGeneratedText:
    """Generated prompts keep their token count while no two share a prefix."""

    def test_every_shuffle_has_the_same_words_and_first_word(self) -> None:
        """Two requests' prompts hold the same multiset of words, start alike and differ in order."""
        first, second = prompt_text(300, 1).split(), prompt_text(300, 2).split()
        assert len(first) == len(second) == 300
        assert Counter(first) == Counter(second)
        assert first[0] == second[0]
        assert first[1:20] != second[1:20]

    def test_the_same_index_gives_the_same_prompt(self) -> None:
        """Prompts are deterministic per index."""
        assert prompt_text(50, 7) == prompt_text(50, 7)
        assert prompt_text(1, 3) == prompt_text(1, 4)


class TestMix:
    """--mix is parsed and drawn in its proportions."""

    def test_parse(self) -> None:
        """Lengths with weights, a bare length weighing 1."""
        assert parse_mix("512:7, 8192:2,32768") == ((512, 7.0), (8192, 2.0), (32768, 1.0))

    @pytest.mark.parametrize("text", [
        pytest.param("512:x", id="a weight that is not a number"),
        pytest.param("0:1", id="a zero length"),
        pytest.param("512:0", id="a zero weight"),
        pytest.param("512:1,512:2", id="a length given twice"),
        pytest.param("", id="nothing at all"),
    ])
    def test_bad_mix(self, text: str) -> None:
        """A malformed mix is a ConfigError naming --mix."""
        with pytest.raises(ConfigError) as caught:
            parse_mix(text)
        assert caught.value.key == "--mix"

    def test_draws_follow_the_seed_and_the_weights(self) -> None:
        """Request i's length is the weighted draw of ``random.Random(seed * 1_000_003 + i)``, as docs/loadtest.md
        says: at 7:2:1 with seed 3, the 4000 draws are exactly 2854, 776 and 370."""
        labels, weights = ("10", "20", "30"), (7.0, 2.0, 1.0)
        source = GeneratedSource((Length(10, 9, 10, "10"), Length(20, 19, 20, "20"), Length(30, 29, 30, "30")),
                                 weights, max_tokens=4, seed=3)
        drawn = [source.plan(i).bucket for i in range(4000)]
        assert drawn == [random.Random(3 * 1_000_003 + i).choices(labels, weights)[0] for i in range(4000)]
        assert Counter(drawn) == {"10": 2854, "20": 776, "30": 370}

    def test_another_seed_sends_other_prompts_of_the_same_words(self) -> None:
        """Two runs with other seeds (two prelaunch lines) never send the same prompt, yet the same words."""
        length = (Length(40, 40, 40, "40"),)
        first = [GeneratedSource(length, (1.0,), max_tokens=4, seed=1).plan(i).prompt for i in range(50)]
        second = [GeneratedSource(length, (1.0,), max_tokens=4, seed=2).plan(i).prompt for i in range(50)]
        assert not set(first) & set(second)
        assert {tuple(sorted(str(p).split())) for p in first + second} == {tuple(sorted(str(first[0]).split()))}

    def test_chat_plans_carry_messages(self) -> None:
        """A chat source sends the prompt as one user message to the chat endpoint."""
        plan = GeneratedSource((Length(5, 5),), (1.0,), max_tokens=3, chat=True).plan(0)
        assert plan.chat
        body = build_payload("m", plan, stream=True, ignore_eos=True)
        assert body["messages"][0]["role"] == "user"
        assert len(body["messages"][0]["content"].split()) == 5
        assert body["stream_options"] == {"include_usage": True}


class TestPromptsFile:
    """--prompts reads JSONL prompts and chat messages."""

    def test_reads_strings_prompts_and_messages(self, tmp_path: Path) -> None:
        """Each line's kind and max_tokens are kept; the file is cycled."""
        path = tmp_path / "p.jsonl"
        path.write_text("\n".join([json.dumps("plain"), json.dumps({"prompt": "p", "max_tokens": 5}), "",
                                   json.dumps({"messages": [{"role": "user", "content": "hi"}]})]) + "\n")
        source = load_prompts(str(path), max_tokens=9)
        plans = [source.plan(i) for i in range(4)]
        assert [(p.prompt, p.chat, p.max_tokens) for p in plans] == [
            ("plain", False, 9), ("p", False, 5), (None, True, 9), ("plain", False, 9)]
        assert source.describe()["prompts"] == 3

    @pytest.mark.parametrize(("line", "why"), [
        pytest.param("{", "not JSON", id="broken JSON"),
        pytest.param("3", "must be a string or an object", id="a number"),
        pytest.param('{"messages": []}', "non-empty list", id="empty messages"),
        pytest.param('{"prompt": "x", "max_tokens": 0}', "max_tokens", id="a zero max_tokens"),
        pytest.param('{"text": "x"}', "needs a prompt", id="neither prompt nor messages"),
    ])
    def test_bad_lines_name_their_number(self, tmp_path: Path, line: str, why: str) -> None:
        """A bad line is a ConfigError naming --prompts and the line number."""
        path = tmp_path / "p.jsonl"
        path.write_text('"ok"\n' + line + "\n")
        with pytest.raises(ConfigError, match=f"line 2: .*{why}") as caught:
            load_prompts(str(path), max_tokens=4)
        assert caught.value.key == "--prompts"


def _record(start: float, e2e: float, route: str, prompt: int | None, completion: int | None) -> RequestRecord:
    return RequestRecord(trace_id=f"{int(start * 1000):032x}", span_id="0" * 16, route=route, model="m1",
                         stream=True, http_status=200, outcome=Outcome.OK, prompt_tokens=prompt,
                         completion_tokens=completion, e2e_s=e2e, start_unix=start)


class TestReplay:
    """--replay reads the shape of archived traffic."""

    def test_arrivals_models_and_lengths_come_from_the_records(self, tmp_path: Path) -> None:
        """Arrival = end - e2e, oldest first; other routes and records without a prompt length are skipped."""
        records = [
            _record(1_700_000_010.0, 2.0, "/v1/completions", 100, 20),
            _record(1_700_000_000.0, 5.0, "/v1/chat/completions", 300, None),
            _record(1_700_000_004.5, 0.5, "/v1/completions", 50, 8),
            _record(1_700_000_006.0, 0.1, "/v1/models", None, None),
            _record(1_700_000_007.0, 0.1, "/v1/completions", None, None),
        ]
        writer = ArchiveWriter(LogConfig(dir=str(tmp_path)))
        for record in records:
            writer.append(event_from_record(record, sla_s=None))
        writer.close()
        shaped, skipped = replay_records(str(tmp_path), default_max_tokens=16)
        assert skipped == 2
        assert [(r.offset_s, r.prompt_tokens, r.completion_tokens, r.chat) for r in shaped] == [
            (0.0, 300, 16, True), (pytest.approx(4.5), 50, 8, False), (pytest.approx(10.0), 100, 20, False)]
        assert {r.model for r in shaped} == {"m1"}

    def test_a_missing_archive_is_a_config_error(self, tmp_path: Path) -> None:
        """A directory that is not an archive names --replay."""
        with pytest.raises(ConfigError) as caught:
            replay_records(str(tmp_path / "nope"), default_max_tokens=4)
        assert caught.value.key == "--replay"

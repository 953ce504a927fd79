"""What a load test sends: one :class:`RequestPlan` per request index, from a :class:`Source`.

Generated prompts are common English words: a fixed first word, then the same multiset of words
shuffled per request. Tokenizers split text at spaces before merging, so every shuffle has the
same token count (calibrated once per length, see ``calibrate``), while no two requests share a
prefix that vLLM's prefix cache could serve. Sources: :class:`GeneratedSource` (one length, or a
weighted mix of lengths), :class:`FileSource` (a JSONL file of prompts or chat messages, cycled)
and :class:`ReplaySource` (the arrival times, models and lengths of archived request records).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from exporters.errors import ConfigError
from log_pipeline.frames import ts_to_ms
from log_pipeline.query import Archive

_WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "was", "for", "on", "are", "with", "as", "his",
    "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what", "some", "we",
    "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an", "each", "she",
    "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like",
    "so", "these", "her", "long", "make", "thing", "see", "him", "two"
)
CHAT_ROUTE = "/v1/chat/completions"
COMPLETION_ROUTE = "/v1/completions"


def prompt_text(words: int, index: int) -> str:
    """``words`` common words: always the same first word and word multiset, in an order chosen by ``index``."""
    body = [_WORDS[1 + k % (len(_WORDS) - 1)] for k in range(max(0, words - 1))]
    random.Random(index).shuffle(body)  # noqa: S311 - seeded prompt text, not a secret
    return " ".join([_WORDS[0], *body])


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """One request to send: a prompt (or chat messages), its output budget and how to file it.

    ``model`` None means the run's model; ``bucket`` "" means the length bucket of the answer's
    usage; ``asked_prompt_tokens`` is the calibrated length of a generated prompt.
    """

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int = 64
    model: str | None = None
    bucket: str = ""
    asked_prompt_tokens: int | None = None

    @property
    def chat(self) -> bool:
        """Whether it goes to the chat completions endpoint."""
        return self.messages is not None


def build_payload(model: str, plan: RequestPlan, *, stream: bool, ignore_eos: bool) -> dict[str, Any]:
    """The JSON body of a planned request; streamed requests ask for the final usage chunk."""
    body: dict[str, Any] = {"model": plan.model or model, "max_tokens": plan.max_tokens, "stream": stream}
    if plan.messages is not None:
        body["messages"] = plan.messages
    else:
        body["prompt"] = plan.prompt or ""
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


class Source(Protocol):
    """Where the requests of a run come from."""

    def plan(self, index: int) -> RequestPlan:
        """The request with this index (0, 1, ...)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the source is, for the report."""
        ...


@dataclass(frozen=True, slots=True)
class Length:
    """A prompt length: as asked (tokens, or words when not calibrated), the words sent and their token count."""

    asked: int
    words: int
    tokens: int | None = None
    label: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"asked_tokens": self.asked, "words": self.words, "tokens": self.tokens, "bucket": self.label}


@dataclass(frozen=True, slots=True)
class GeneratedSource:
    """Generated prompts at one or more lengths, picked per request with the given weights (seeded)."""

    lengths: tuple[Length, ...]
    weights: tuple[float, ...]
    max_tokens: int
    chat: bool = False
    seed: int = 0
    name: str = "generated"

    def plan(self, index: int) -> RequestPlan:
        """A prompt of a length drawn for ``index``, its words shuffled for ``index`` and the seed (two runs with other
        seeds send no identical request, which a sidecar would count as a client's fast retry)."""
        if len(self.lengths) == 1:
            length = self.lengths[0]
        else:
            length = random.Random(self.seed * 1_000_003 + index).choices(self.lengths, self.weights)[0]  # noqa: S311 - seeded prompt lengths, not a secret
        text = prompt_text(length.words, self.seed * 1_000_003 + index)
        messages = [{"role": "user", "content": text}] if self.chat else None
        return RequestPlan(None if self.chat else text, messages, self.max_tokens, None, length.label, length.tokens)

    def describe(self) -> dict[str, Any]:
        """The lengths, their weights and what calibration found."""
        total = sum(self.weights)
        return {"kind": self.name, "chat": self.chat, "max_tokens": self.max_tokens, "seed": self.seed,
                "lengths": [{**length.to_dict(), "weight": weight, "share": weight / total}
                            for length, weight in zip(self.lengths, self.weights, strict=True)]}


@dataclass(frozen=True, slots=True)
class FileSource:
    """Prompts read from a file, sent in order and cycled."""

    path: str
    plans: tuple[RequestPlan, ...]

    def plan(self, index: int) -> RequestPlan:
        """The file's prompt number ``index`` modulo their count."""
        return self.plans[index % len(self.plans)]

    def describe(self) -> dict[str, Any]:
        """The file and how many prompts it holds."""
        return {"kind": "prompts_file", "path": self.path, "prompts": len(self.plans),
                "chat": sum(1 for p in self.plans if p.chat)}


@dataclass(frozen=True, slots=True)
class ReplayRecord:
    """The shape of one archived request: when it arrived (seconds after the first) and its lengths."""

    offset_s: float
    model: str
    prompt_tokens: int
    completion_tokens: int
    chat: bool


@dataclass(frozen=True, slots=True)
class ReplaySource:
    """Archived traffic replayed: request ``i`` is record ``i`` at its calibrated prompt length.

    Every request goes to the completions endpoint: the archive holds no text, and a chat
    request's recorded prompt length already includes its chat template's tokens.
    """

    directory: str
    records: tuple[ReplayRecord, ...]
    words: dict[int, Length]
    skipped: int = 0

    def plan(self, index: int) -> RequestPlan:
        """Record ``index``'s model, output length and a generated prompt of its prompt length."""
        record = self.records[index]
        length = self.words[record.prompt_tokens]
        return RequestPlan(prompt_text(length.words, index), None, record.completion_tokens, record.model, "",
                           length.tokens)

    def offsets(self) -> list[float]:
        """The arrival offsets of the records, in seconds after the first."""
        return [r.offset_s for r in self.records]

    def describe(self) -> dict[str, Any]:
        """The archive, how much traffic it held and over how long."""
        models: dict[str, int] = {}
        for record in self.records:
            models[record.model] = models.get(record.model, 0) + 1
        span = self.records[-1].offset_s if self.records else 0.0
        return {"kind": "replay", "directory": self.directory, "requests": len(self.records), "span_s": span,
                "models": models, "chat_records": sum(1 for r in self.records if r.chat),
                "skipped_records": self.skipped,
                "distinct_prompt_lengths": len(self.words)}


def parse_mix(text: str) -> tuple[tuple[int, float], ...]:
    """``"512:7,8192:2,32768:1"`` -> ``((512, 7.0), (8192, 2.0), (32768, 1.0))``; a bare length weighs 1."""
    entries: list[tuple[int, float]] = []
    for part in text.split(","):
        length, _, weight = part.strip().partition(":")
        try:
            tokens, share = int(length), float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError("--mix", f"{part.strip()!r} is not TOKENS:WEIGHT, e.g. 512:7", text) from None
        if tokens < 1 or not share > 0 or share == float("inf"):
            raise ConfigError("--mix", f"{part.strip()!r}: the length must be >= 1 and the weight > 0", text)
        if any(tokens == seen for seen, _ in entries):
            raise ConfigError("--mix", f"the length {tokens} is given twice", text)
        entries.append((tokens, share))
    return tuple(entries)


def load_prompts(path: str, *, max_tokens: int) -> FileSource:
    """Read a JSONL file: per line a string, ``{"prompt": ...}`` or ``{"messages": [...]}`` (+ ``max_tokens``)."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as err:
        raise ConfigError("--prompts", f"cannot read the file: {err.strerror}", path) from err
    plans = [_plan_of(number, line, path, max_tokens) for number, line in enumerate(lines, 1) if line.strip()]
    if not plans:
        raise ConfigError("--prompts", "the file holds no prompts", path)
    return FileSource(path, tuple(plans))


def _plan_of(number: int, line: bytes, path: str, max_tokens: int) -> RequestPlan:
    def bad(why: str) -> ConfigError:
        return ConfigError("--prompts", f"line {number}: {why}", path)

    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise bad(f"not JSON ({err})") from None
    if isinstance(item, str):
        return RequestPlan(prompt=item, max_tokens=max_tokens)
    if not isinstance(item, dict):
        raise bad("must be a string or an object with prompt or messages")
    budget = item.get("max_tokens", max_tokens)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise bad("max_tokens must be a whole number >= 1")
    messages = item.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise bad("messages must be a non-empty list of {role, content} strings")
        return RequestPlan(messages=messages, max_tokens=budget)
    prompt = item.get("prompt")
    if not isinstance(prompt, str):
        raise bad("needs a prompt string or a messages list")
    return RequestPlan(prompt=prompt, max_tokens=budget)


def replay_records(directory: str, *, default_max_tokens: int) -> tuple[list[ReplayRecord], int]:
    """The generation requests of an archive, oldest arrival first, and how many records were skipped.

    A record's arrival is its ``ts`` (the end of the request) minus ``e2e_ms``. Records of other
    routes, and records without a timestamp or a prompt length, are skipped; a record without a
    completion length gets ``default_max_tokens``.
    """
    try:
        found = list(Archive(directory).records())
    except (OSError, ValueError) as err:
        raise ConfigError("--replay", f"cannot read the archive: {err}", directory) from err
    return _shape(found, default_max_tokens)


def _shape(found: Iterable[dict[str, Any]], default_max_tokens: int) -> tuple[list[ReplayRecord], int]:
    arrivals: list[tuple[float, dict[str, Any]]] = []
    skipped = 0
    for record in found:
        end_ms = ts_to_ms(record.get("ts"))
        prompt = record.get("prompt_tokens")
        if record.get("route") not in (CHAT_ROUTE, COMPLETION_ROUTE) or end_ms is None or not isinstance(prompt, int) \
                or prompt < 1:
            skipped += 1
            continue
        arrivals.append(((end_ms - float(record.get("e2e_ms") or 0.0)) / 1000.0, record))
    arrivals.sort(key=lambda pair: pair[0])
    first = arrivals[0][0] if arrivals else 0.0
    records = [ReplayRecord(at - first, str(r.get("model") or ""), int(r["prompt_tokens"]),
                            _completion(r.get("completion_tokens"), default_max_tokens), r["route"] == CHAT_ROUTE)
               for at, r in arrivals]
    return records, skipped


def _completion(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


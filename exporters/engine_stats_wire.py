"""The datagrams the vLLM stat-logger plugin sends the sidecar: one format, encoded and decoded here.

Standard library only: the plugin (:mod:`exporters.vllm_plugin`) runs inside vLLM's process and
imports this module and vLLM, nothing else of ours. A datagram is compact JSON::

    {"v": 1, "s": [kv_cache_usage, running, waiting, deferred, dropped, max_num_seqs] | null,
     "r": [[request_id, queued_s, prefill_s, decode_s, inference_s, e2e_s,
            preemptions, cached_tokens, prompt_tokens, generation_tokens, finish_reason], ...]}

``s`` is the scheduler's state after the step (``dropped``: datagrams the plugin could not send
so far; ``max_num_seqs``: vLLM's own setting, absent from plugins older than it), ``r`` the
requests that finished in it; a step with many finished requests is split over several datagrams
of at most :data:`MAX_DATAGRAM_BYTES`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

VERSION = 1
MAX_DATAGRAM_BYTES = 8192
"""Below every loopback MTU's datagram limit; about 60 finished requests fit in one."""
_TRACE_ID = re.compile(r"[0-9a-f]{32}")


class EngineRequestStats(NamedTuple):
    """What vLLM's engine measured about one finished request (seconds; tokens).

    A tuple, so that it is its own row of the datagram: encoding costs no conversion in vLLM's process.
    """

    request_id: str
    queued_s: float
    prefill_s: float
    decode_s: float
    inference_s: float
    e2e_s: float
    preemptions: int
    cached_tokens: int
    prompt_tokens: int
    generation_tokens: int
    finish_reason: str

    @property
    def trace_id(self) -> str | None:
        """The sidecar's trace id inside vLLM's request id (``cmpl-<X-Request-Id>-0-<suffix>``), if any."""
        match = _TRACE_ID.search(self.request_id)
        return match.group(0) if match else None


class EngineStepStats(NamedTuple):
    """The scheduler's state after one engine step, and the plugin's own drop count (a tuple, as above)."""

    kv_cache_usage: float
    running: int
    waiting: int
    deferred: int
    dropped: int
    max_num_seqs: int = 0
    """vLLM's ``--max-num-seqs`` (its scheduler's limit on the running batch); 0: a plugin that does not send it."""


def encode(step: EngineStepStats | None, requests: Sequence[EngineRequestStats]) -> Iterator[bytes]:
    """The datagrams of one step: the step state in the first, the finished requests spread over all."""
    state: EngineStepStats | None = step
    rows = list(requests)
    while True:
        take = len(rows)
        while True:
            data = json.dumps({"v": VERSION, "s": state, "r": rows[:take]}, separators=(",", ":")).encode()
            if len(data) <= MAX_DATAGRAM_BYTES or take <= 1:
                break
            take //= 2
        yield data
        rows, state = rows[take:], None
        if not rows:
            return


def decode(datagram: bytes) -> tuple[EngineStepStats | None, list[EngineRequestStats]]:
    """Parse one datagram; ValueError naming the problem when it is not one of ours."""
    try:
        message = json.loads(datagram)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"not JSON: {err}") from err
    if not isinstance(message, dict) or message.get("v") != VERSION:
        raise ValueError(f"not an inferwatch engine-stats datagram of version {VERSION}")
    try:
        state = message.get("s")
        step = EngineStepStats(float(state[0]), *(int(x) for x in state[1:6])) if state is not None else None
        requests = [
            EngineRequestStats._make((str(r[0]), *(float(x) for x in r[1:6]), *(int(x) for x in r[6:10]), str(r[10])))
            for r in message.get("r", ())
        ]
    except (TypeError, ValueError, IndexError) as err:
        raise ValueError(f"malformed engine-stats datagram: {err}") from err
    return step, requests

"""Optional HMAC-SHA256 verification of client requests: only holders of the shared key, and no replays.

A client signs ``f"{timestamp}\\n{METHOD}\\n{path_with_query}\\n{sha256_hex(body)}"`` with the key and
sends ``X-Inferwatch-Timestamp: <integer Unix seconds>`` and ``X-Inferwatch-Signature: v1=<hex HMAC>``.
The sidecar refuses a timestamp further than the window from its clock (either side), a signature that
does not match, and a signature it has already accepted within the window (a replay).

Identical requests (same method, path, query and body) signed in the same second carry the same
signature, so the second is refused as a replay; a client that sends such requests adds a nonce to the
body or the query string.

Pure apart from ``load_key``, which reads the key from a file or an environment variable.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from exporters.errors import ConfigError

TIMESTAMP_HEADER = "X-Inferwatch-Timestamp"
SIGNATURE_HEADER = "X-Inferwatch-Signature"
SCHEME = "v1"
MIN_KEY_BYTES = 16
MEMORY_FULL = "too many signed requests in the window"
"""How a refusal for a full replay memory begins: a capacity problem of the sidecar, not a bad request."""

_TIMESTAMP = re.compile(r"[0-9]{1,20}")
_SIGNATURE = re.compile(rf"{SCHEME}=([0-9a-fA-F]{{64}})")


def _digest(key: bytes, method: str, path: str, timestamp: str, body: bytes) -> str:
    """The lowercase hex HMAC-SHA256 of one request; ``path`` as sent, query string included.

    ``surrogateescape`` gives back the exact bytes of a path the HTTP parser could not decode as UTF-8.
    """
    message = f"{timestamp}\n{method.upper()}\n{path}\n{hashlib.sha256(body).hexdigest()}"
    return hmac.new(key, message.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def sign(key: bytes, method: str, path: str, timestamp: int, body: bytes) -> str:
    """The ``X-Inferwatch-Signature`` value for a request sent with ``X-Inferwatch-Timestamp: timestamp``."""
    return f"{SCHEME}={_digest(key, method, path, str(timestamp), body)}"


class SignatureVerifier:
    """Checks request signatures and refuses stale timestamps and replays.

    Bounded memory: an accepted signature is remembered until ``timestamp + window_s``, when its
    timestamp turns stale and it can no longer be replayed; expired ones are dropped oldest first (a
    heap) on each call. While ``max_remembered`` are live, a new signed request is refused ("too many
    signed requests in the window") rather than one being forgotten early, which would open it to
    replay. Size it above the peak signed-request rate times ``window_s`` (the default covers 333
    requests/s over 300 s, at about 250 bytes per remembered signature). Only signatures that match
    are remembered, so a client without the key cannot fill the memory. Not thread-safe: one event loop.
    """

    def __init__(
        self,
        key: bytes,
        window_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        max_remembered: int = 100_000,
    ) -> None:
        self._key = key
        self._window_s = window_s
        self._clock = clock
        self._max_remembered = max_remembered
        self._seen: set[str] = set()
        self._expiries: list[tuple[float, str]] = []

    def verify(
        self, method: str, path: str, timestamp: str | None, signature: str | None, body: bytes
    ) -> str | None:
        """None when the request is signed, fresh and new (it is then remembered), else the problem.

        ``path`` is the request target as sent (aiohttp's ``request.raw_path``, query included) and
        ``timestamp`` must be ASCII digits (at most 20), signed exactly as sent.
        """
        if signature is None:
            return f"missing {SIGNATURE_HEADER} header"
        if timestamp is None:
            return f"missing {TIMESTAMP_HEADER} header"
        if not _TIMESTAMP.fullmatch(timestamp):
            return "timestamp is not an integer"
        now = self._clock()
        skew = int(timestamp) - now
        if abs(skew) > self._window_s:
            side = "ahead of" if skew > 0 else "behind"
            return (
                f"timestamp is {math.ceil(abs(skew))} s {side} the sidecar's clock "
                f"(window {self._window_s:g} s)"
            )
        given = _SIGNATURE.fullmatch(signature)
        if given is None:
            return f"signature is not of the form {SCHEME}=<64 hex digits>"
        expected = _digest(self._key, method, path, timestamp, body)
        if not hmac.compare_digest(given.group(1).lower(), expected):
            return "signature does not match"
        return self._remember(expected, int(timestamp) + self._window_s, now)

    def _remember(self, signature: str, expires: float, now: float) -> str | None:
        """Record an accepted signature until ``expires``; the problem when it is a replay or memory is full."""
        while self._expiries and self._expiries[0][0] < now:
            self._seen.discard(heapq.heappop(self._expiries)[1])
        if signature in self._seen:
            return "signature already used (replay)"
        if len(self._seen) >= self._max_remembered:
            return f"{MEMORY_FULL} ({self._max_remembered} accepted within {self._window_s:g} s)"
        self._seen.add(signature)
        heapq.heappush(self._expiries, (expires, signature))
        return None


def load_key(key_file: str, key_env: str) -> bytes | None:
    """The shared key from ``key_file`` or the environment variable named ``key_env``; None when both are empty.

    The whole content is the key, surrounding whitespace stripped. The key is never taken from the
    command line, where other users of the machine can read it.

    Raises:
        ConfigError: both are set, the file cannot be read, the variable is unset, or the key is empty
            or shorter than ``MIN_KEY_BYTES``.
    """
    if key_file and key_env:
        raise ConfigError("serve.hmac_key_file", "set serve.hmac_key_file or serve.hmac_key_env, not both")
    if key_file:
        return read_secret_file(key_file, "serve.hmac_key_file")
    if key_env:
        config_key, source = "serve.hmac_key_env", "the environment variable"
        value = os.environ.get(key_env)
        if value is None:
            raise ConfigError(config_key, "the environment variable is not set", key_env)
        raw = os.fsencode(value)
        return _checked_secret(raw, config_key, source, key_env)
    return None


def read_secret_file(path: str, config_key: str, what: str = "key") -> bytes:
    """A secret (a key, a token) that is the whole content of ``path``, whitespace stripped.

    Raises:
        ConfigError: naming ``config_key``: the file cannot be read, is empty, or holds fewer than
            ``MIN_KEY_BYTES`` bytes.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(config_key, f"cannot read the {what} file: {err.strerror}", path) from err
    return _checked_secret(raw, config_key, f"the {what} file", path, what)


def _checked_secret(raw: bytes, config_key: str, source: str, shown: str, what: str = "key") -> bytes:
    secret = raw.strip()
    if not secret:
        raise ConfigError(config_key, f"{source} is empty", shown)
    if len(secret) < MIN_KEY_BYTES:
        raise ConfigError(
            config_key, f"the {what} in {source} is {len(secret)} bytes; at least {MIN_KEY_BYTES} are required", shown
        )
    return secret

"""Who a request is accounted to, computed on the request path with one call (everything else is off it).

The tenant comes from ``serve.tenant_header`` (default ``x-tenant``) or, with
``serve.tenant_key_map_file``, from the SHA-256 of the request's ``Authorization: Bearer KEY``
looked up in that file: the key is hashed and dropped, never stored, logged or exported. A tenant
name is cut to :data:`MAX_TENANT_CHARS` characters of ``[A-Za-z0-9._:@-]`` (anything else
makes it ``invalid``); the label cap is applied later, off the request path (exporters/tenants.py).
The request class (``cost.request_class_header``) picks the special cost pool, and a salted
64-bit hash of the model and prompt feeds the repeat-prompt estimate (exporters/repeats.py).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from exporters.cost import CostConfig
from exporters.errors import ConfigError
from exporters.records import RequestRecord
from exporters.tenants import UNKNOWN
from serving.config import ServeConfig

MAX_TENANT_CHARS = 64
INVALID = "invalid"
_TENANT = re.compile(r"[A-Za-z0-9._:@-]{1,64}")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def load_key_map(path: str) -> dict[str, str]:
    """The API-key-hash -> tenant map of ``serve.tenant_key_map_file``.

    Raises:
        ConfigError: the file cannot be read, or a line is not 'SHA256-HEX TENANT'.
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError("serve.tenant_key_map_file", f"cannot be read: {err.strerror}", path) from err
    mapping: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        parts = raw.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) != 2 or not _SHA256_HEX.fullmatch(parts[0].lower()) or not _TENANT.fullmatch(parts[1]):
            raise ConfigError("serve.tenant_key_map_file", f"line {number} is not 'SHA256-HEX-OF-THE-KEY TENANT' "
                              f"(64 hex digits, a tenant of up to {MAX_TENANT_CHARS} of A-Z a-z 0-9 . _ : @ -)",
                              path)
        mapping[parts[0].lower()] = parts[1]
    return mapping


class Tenancy:
    """Tags each request's record with its tenant, request class and repeat key."""

    def __init__(self, serve: ServeConfig, cost: CostConfig) -> None:
        self._header = serve.tenant_header
        self._key_map = load_key_map(serve.tenant_key_map_file) if serve.tenant_key_map_file else None
        self._class_header = cost.request_class_header
        # per process: the hashes mean nothing outside it. The salt is taken into a BLAKE2b state once and
        # that state copied per hash: the same digests as hashing with key=salt, without keying twice a request.
        self._salted = hashlib.blake2b(digest_size=8, key=os.urandom(16))

    def tag(self, headers: Mapping[str, str], record: RequestRecord) -> None:
        """Set ``record.tenant`` and ``record.request_class`` from the request's headers."""
        record.tenant = self._tenant(headers)
        request_class = headers.get(self._class_header)
        if request_class is not None:
            record.request_class = request_class[:MAX_TENANT_CHARS]

    def key_prompt(self, payload: dict[str, Any], model: str | None, record: RequestRecord) -> None:
        """Set ``record.repeat_key``: a salted hash of the model and prompt (or messages), never the text."""
        prompt = payload.get("messages", payload.get("prompt"))
        if prompt is not None:
            record.repeat_key = self._salted_hash(orjson.dumps([model, prompt]))

    def key_body(self, body: bytes, record: RequestRecord) -> None:
        """Set ``record.body_key``: a salted hash of the request body as the client sent it (fast retries)."""
        record.body_key = self._salted_hash(body)

    def _salted_hash(self, data: bytes) -> int:
        hasher = self._salted.copy()
        hasher.update(data)
        return int.from_bytes(hasher.digest(), "big")

    def _tenant(self, headers: Mapping[str, str]) -> str:
        if self._key_map is None:
            name = headers.get(self._header)
        else:
            scheme, _, key = headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                return UNKNOWN
            name = self._key_map.get(hashlib.sha256(key.strip().encode()).hexdigest())
        if name is None or name == "":
            return UNKNOWN
        return name if _TENANT.fullmatch(name) else INVALID

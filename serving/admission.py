"""What a request must pass before the sidecar forwards it: capacity, body, signature, shedding.

Each check either returns or raises :class:`Refusal`, which the proxy turns into a JSON error
answer (with ``x-trace-id``) without contacting the upstream. The checks run in the order a
request reaches them: the in-flight limit (nothing read yet), the body (size, time to arrive),
the HMAC signature (over the raw body), then, once the JSON is decoded, load shedding by model
and priority.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from exporters.records import Outcome
from serving.config import ServeConfig
from serving.exchange import BodyTooLargeError, Exchange
from serving.signing import MEMORY_FULL, SIGNATURE_HEADER, TIMESTAMP_HEADER, SignatureVerifier


@dataclass(slots=True)
class Refusal(Exception):  # noqa: N818 - a refusal is an answer, not an error of the sidecar
    """The request is answered by the sidecar itself with ``status`` and a JSON error of type ``kind``."""

    status: int
    outcome: Outcome
    kind: str
    message: str
    retry_after_s: int | None = None


def request_priority(headers: Mapping[str, str], header: str) -> int:
    """The client's integer priority from ``header``; missing or not an integer counts as 0."""
    raw = headers.get(header)
    if raw is None:
        return 0
    try:
        return int(raw.strip())
    except ValueError:
        return 0


class Admission:
    """The checks of one proxy, configured once from ``[serve]``."""

    def __init__(
        self,
        config: ServeConfig,
        degraded_models: Callable[[], frozenset[str]],
        verifier: SignatureVerifier | None = None,
    ) -> None:
        self._config = config
        self._degraded_models = degraded_models
        self._verifier = verifier

    def check_capacity(self, active: int) -> None:
        """Refuse with 503 when ``active`` requests (this one included) exceed ``serve.max_inflight``."""
        limit = self._config.max_inflight
        if active > limit:
            raise Refusal(503, Outcome.OVERLOADED, "sidecar_overloaded",
                          f"the sidecar is already proxying its limit of {limit} requests (serve.max_inflight); "
                          "retry with exponential backoff", self._config.retry_after_s)

    async def read_body(self, request: Exchange) -> bytes:
        """The whole body, within ``serve.max_body_bytes`` (else 413) and ``serve.client_body_timeout_s`` (408)."""
        length = request.content_length
        if length is not None and length > self._config.max_body_bytes:
            raise self._too_large()
        try:
            return await request.read_body(self._config.max_body_bytes, self._config.client_body_timeout_s)
        except BodyTooLargeError:
            raise self._too_large() from None
        except TimeoutError:
            raise Refusal(408, Outcome.CLIENT_ERROR, "request_timeout",
                          f"request body did not arrive within {self._config.client_body_timeout_s:g} s "
                          "(serve.client_body_timeout_s)") from None

    def _too_large(self) -> Refusal:
        return Refusal(413, Outcome.CLIENT_ERROR, "request_too_large",
                       f"request body is larger than {self._config.max_body_bytes} bytes (serve.max_body_bytes)")

    def check_signature(self, request: Exchange, body: bytes) -> None:
        """With a key configured, refuse with 401 a request whose HMAC signature is missing, wrong or stale."""
        if self._verifier is None:
            return
        # raw_path: the target exactly as the client sent and signed it, query string included
        problem = self._verifier.verify(request.method, request.raw_path, request.headers.get(TIMESTAMP_HEADER),
                                        request.headers.get(SIGNATURE_HEADER), body)
        if problem is None:
            return
        if problem.startswith(MEMORY_FULL):  # the replay memory is full: a capacity problem, not the client's
            raise Refusal(503, Outcome.OVERLOADED, "sidecar_overloaded", f"cannot verify more signatures now: "
                          f"{problem}", self._config.retry_after_s)
        raise Refusal(401, Outcome.CLIENT_ERROR, "unauthorized", f"request signature refused: {problem}")

    def check_shedding(self, model: str | None, headers: Mapping[str, str]) -> None:
        """While ``model`` is degraded (its degrade alert fires), refuse low-priority requests with 503."""
        config = self._config
        if not config.shed_on_degrade or model is None or model not in self._degraded_models():
            return
        if request_priority(headers, config.priority_header) < config.shed_below_priority:
            raise Refusal(503, Outcome.OVERLOADED, "load_shed",
                          f"model {model!r} is degraded and sheds requests with {config.priority_header} below "
                          f"{config.shed_below_priority}; retry with exponential backoff", config.retry_after_s)

"""HMAC request signing: problem strings, the timestamp window, replays, bounded memory and key loading."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest

from exporters.errors import ConfigError
from serving.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, SignatureVerifier, load_key, sign

KEY = b"0123456789abcdef0123456789abcdef"
NOW = 1_700_000_000
PATH = "/v1/completions?trace=1"
BODY = b'{"model": "m", "prompt": "hello"}'


class Clock:
    """A settable clock."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _verifier(clock: Clock | None = None, max_remembered: int = 100_000) -> SignatureVerifier:
    return SignatureVerifier(KEY, window_s=300.0, clock=clock or Clock(), max_remembered=max_remembered)


def _verify(
    verifier: SignatureVerifier, signed_at: int = NOW, body: bytes = BODY, sent: dict[str, str | None] | None = None
) -> str | None:
    """Verify a request signed at ``signed_at``; ``sent`` replaces the timestamp or signature header sent."""
    signature = sign(KEY, "POST", PATH, signed_at, body)
    headers: dict[str, str | None] = {"timestamp": str(signed_at), "signature": signature, **(sent or {})}
    return verifier.verify("POST", PATH, headers["timestamp"], headers["signature"], body)


def test_header_names_are_the_documented_ones() -> None:
    """Clients send the two documented headers."""
    assert (TIMESTAMP_HEADER, SIGNATURE_HEADER) == ("X-Inferwatch-Timestamp", "X-Inferwatch-Signature")


def test_sign_is_the_documented_hmac_of_the_canonical_message() -> None:
    """The signature is v1= and the HMAC-SHA256 of timestamp, method, path and body hash, one per line."""
    message = f"{NOW}\nPOST\n{PATH}\n{hashlib.sha256(BODY).hexdigest()}".encode()
    assert sign(KEY, "post", PATH, NOW, BODY) == "v1=" + hmac.new(KEY, message, hashlib.sha256).hexdigest()


def test_a_correctly_signed_request_is_accepted() -> None:
    """A fresh request signed with the key verifies."""
    assert _verify(_verifier()) is None


def test_uppercase_hex_signature_is_accepted() -> None:
    """Hex digits are compared without regard to case."""
    signature = sign(KEY, "POST", PATH, NOW, BODY)
    assert _verify(_verifier(), sent={"signature": "v1=" + signature[3:].upper()}) is None


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"signature": None}, "missing X-Inferwatch-Signature header"),
        ({"signature": None, "timestamp": None}, "missing X-Inferwatch-Signature header"),
        ({"timestamp": None}, "missing X-Inferwatch-Timestamp header"),
        ({"timestamp": "1700000000.5"}, "timestamp is not an integer"),
        ({"timestamp": " 1700000000"}, "timestamp is not an integer"),
        ({"timestamp": "-5"}, "timestamp is not an integer"),
        ({"timestamp": "١٧٠٠٠٠٠٠٠٠"}, "timestamp is not an integer"),
        ({"timestamp": ""}, "timestamp is not an integer"),
        ({"signature": "v2=" + "0" * 64}, "signature is not of the form v1=<64 hex digits>"),
        ({"signature": "v1=" + "0" * 63}, "signature is not of the form v1=<64 hex digits>"),
        ({"signature": "v1=" + "é" * 64}, "signature is not of the form v1=<64 hex digits>"),
        ({"signature": "v1=" + "0" * 64}, "signature does not match"),
    ],
    ids=["no signature", "no headers at all", "no timestamp", "a fractional timestamp",
         "a padded timestamp", "a negative timestamp", "non-ASCII digits", "an empty timestamp",
         "another scheme", "a short signature", "non-ASCII signature", "a wrong signature"],
)
def test_bad_headers_are_named(given: dict[str, str | None], problem: str) -> None:
    """Each malformed or missing header gives its own problem string."""
    assert _verify(_verifier(), sent=given) == problem


@pytest.mark.parametrize(
    ("method", "path", "body", "key"),
    [("GET", PATH, BODY, KEY), ("POST", "/v1/completions?trace=2", BODY, KEY),
     ("POST", PATH, BODY + b" ", KEY), ("POST", PATH, BODY, b"another key of 16+ bytes")],
    ids=["another method", "another query", "another body", "another key"],
)
def test_any_change_to_the_signed_request_breaks_the_signature(method: str, path: str, body: bytes, key: bytes) -> None:
    """Method, path with query, body and key are all covered by the signature."""
    signature = sign(key, method, path, NOW, body)
    assert _verifier().verify("POST", PATH, str(NOW), signature, BODY) == "signature does not match"


def test_a_signature_for_another_timestamp_does_not_match() -> None:
    """The timestamp is signed: moving it within the window breaks the signature."""
    signature = sign(KEY, "POST", PATH, NOW, BODY)
    assert _verify(_verifier(), sent={"signature": signature, "timestamp": str(NOW + 1)}) == "signature does not match"


def test_a_path_the_parser_could_not_decode_is_signed_as_its_raw_bytes() -> None:
    """A path holding surrogate escapes (undecodable bytes) verifies against the client's raw bytes."""
    raw_path = b"/v1/completions?q=\xff".decode("utf-8", "surrogateescape")
    message = f"{NOW}\nPOST\n".encode() + b"/v1/completions?q=\xff\n" + hashlib.sha256(BODY).hexdigest().encode()
    signature = "v1=" + hmac.new(KEY, message, hashlib.sha256).hexdigest()
    assert _verifier().verify("POST", raw_path, str(NOW), signature, BODY) is None


@pytest.mark.parametrize(
    ("offset", "problem"),
    [
        (-300, None),
        (300, None),
        (-301, "timestamp is 301 s behind the sidecar's clock (window 300 s)"),
        (301, "timestamp is 301 s ahead of the sidecar's clock (window 300 s)"),
        (-412, "timestamp is 412 s behind the sidecar's clock (window 300 s)"),
    ],
    ids=["exactly the window behind", "exactly the window ahead", "one second too old",
         "one second too far ahead", "far too old"],
)
def test_the_window_is_inclusive_on_both_sides(offset: int, problem: str | None) -> None:
    """A timestamp exactly window_s from the clock is accepted; one second further either side is stale."""
    assert _verify(_verifier(), signed_at=NOW + offset) == problem


def test_a_fraction_of_a_second_past_the_window_is_stale() -> None:
    """The clock is fractional: 300.25 s away is stale, and reported rounded up."""
    assert _verify(_verifier(Clock(NOW + 300.25))) == "timestamp is 301 s behind the sidecar's clock (window 300 s)"


def test_a_stale_request_with_a_bad_signature_reports_staleness() -> None:
    """Staleness is checked before the signature, so an old captured request is named as old."""
    assert _verify(_verifier(), signed_at=NOW - 1000, sent={"signature": "v1=" + "0" * 64}) == (
        "timestamp is 1000 s behind the sidecar's clock (window 300 s)"
    )


def test_a_replayed_signature_is_refused() -> None:
    """The same signed request sent twice within the window is refused the second time."""
    verifier = _verifier()
    assert _verify(verifier) is None
    assert _verify(verifier) == "signature already used (replay)"


def test_a_replay_at_the_last_second_of_the_window_is_refused() -> None:
    """The signature is still remembered when its timestamp is exactly window_s old."""
    clock = Clock()
    verifier = _verifier(clock)
    assert _verify(verifier) is None
    clock.now = NOW + 300
    assert _verify(verifier) == "signature already used (replay)"


def test_a_replay_after_the_window_is_refused_as_stale() -> None:
    """Once forgotten, a replayed request is still refused: its timestamp has left the window."""
    clock = Clock()
    verifier = _verifier(clock)
    assert _verify(verifier) is None
    clock.now = NOW + 301
    assert _verify(verifier) == "timestamp is 301 s behind the sidecar's clock (window 300 s)"


def test_a_refused_signature_is_not_remembered() -> None:
    """A request refused for its signature leaves no trace; the correct one is then accepted."""
    verifier = _verifier()
    assert _verify(verifier, sent={"signature": "v1=" + "0" * 64}) == "signature does not match"
    assert _verify(verifier) is None


def test_new_requests_are_refused_while_memory_is_full() -> None:
    """With max_remembered live signatures, a new request is refused rather than one being forgotten."""
    verifier = _verifier(max_remembered=2)
    assert _verify(verifier, body=b"1") is None
    assert _verify(verifier, body=b"2") is None
    assert _verify(verifier, body=b"3") == "too many signed requests in the window (2 accepted within 300 s)"
    assert _verify(verifier, body=b"1") == "signature already used (replay)"


def test_expired_signatures_free_their_place() -> None:
    """A signature whose timestamp has left the window is dropped, making room for a new request."""
    clock = Clock()
    verifier = _verifier(clock, max_remembered=2)
    assert _verify(verifier, signed_at=NOW - 100, body=b"1") is None
    assert _verify(verifier, signed_at=NOW, body=b"2") is None
    clock.now = NOW + 201
    assert _verify(verifier, signed_at=NOW + 201, body=b"3") is None
    assert _verify(verifier, signed_at=NOW + 201, body=b"4") == (
        "too many signed requests in the window (2 accepted within 300 s)"
    )
    assert _verify(verifier, signed_at=NOW, body=b"2") == "signature already used (replay)"


def test_the_memory_expires_by_timestamp_not_by_arrival() -> None:
    """A later-arriving request with an older timestamp is forgotten first."""
    clock = Clock()
    verifier = _verifier(clock, max_remembered=2)
    assert _verify(verifier, signed_at=NOW + 200, body=b"late") is None
    assert _verify(verifier, signed_at=NOW - 200, body=b"early") is None
    clock.now = NOW + 101
    assert _verify(verifier, signed_at=NOW + 101, body=b"new") is None
    assert _verify(verifier, signed_at=NOW + 200, body=b"late") == "signature already used (replay)"


def test_no_key_configured_means_no_verification() -> None:
    """Neither a key file nor a key variable: verification is off."""
    assert load_key("", "") is None


def test_key_file_content_is_the_key_with_whitespace_stripped(tmp_path: Path) -> None:
    """The whole file, without the surrounding whitespace an editor adds, is the key."""
    key_file = tmp_path / "key"
    key_file.write_bytes(b"  " + KEY + b"\n")
    assert load_key(str(key_file), "") == KEY


def test_key_variable_content_is_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable named by key_env holds the key."""
    monkeypatch.setenv("IW_TEST_KEY", KEY.decode() + "\n")
    assert load_key("", "IW_TEST_KEY") == KEY


def _config_error(key_file: str, key_env: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_key(key_file, key_env)
    return info.value


def test_both_key_sources_set_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key file and a key variable together are ambiguous and refused."""
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    monkeypatch.setenv("IW_TEST_KEY", KEY.decode())
    err = _config_error(str(key_file), "IW_TEST_KEY")
    assert err.key == "serve.hmac_key_file"
    assert err.problem == "set serve.hmac_key_file or serve.hmac_key_env, not both"


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "cannot read the key file: No such file or directory"), (b" \n", "the key file is empty"),
     (b"short key\n", "the key in the key file is 9 bytes; at least 16 are required")],
    ids=["a missing file", "a blank file", "a short key"],
)
def test_key_file_problems_name_the_key(tmp_path: Path, content: bytes | None, problem: str) -> None:
    """An unreadable, empty or short key file raises ConfigError naming serve.hmac_key_file and its path."""
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_bytes(content)
    err = _config_error(str(key_file), "")
    assert (err.key, err.problem, err.value) == ("serve.hmac_key_file", problem, str(key_file))


def test_a_directory_as_key_file_is_refused(tmp_path: Path) -> None:
    """A path that is not a readable file is refused with the operating system's reason."""
    assert _config_error(str(tmp_path), "").problem == "cannot read the key file: Is a directory"


@pytest.mark.parametrize(
    ("value", "problem"),
    [(None, "the environment variable is not set"), ("", "the environment variable is empty"),
     ("short key", "the key in the environment variable is 9 bytes; at least 16 are required")],
    ids=["an unset variable", "an empty variable", "a short key"],
)
def test_key_variable_problems_name_the_key(monkeypatch: pytest.MonkeyPatch, value: str | None, problem: str) -> None:
    """An unset, empty or short key variable raises ConfigError naming serve.hmac_key_env and the variable."""
    monkeypatch.delenv("IW_TEST_KEY", raising=False)
    if value is not None:
        monkeypatch.setenv("IW_TEST_KEY", value)
    err = _config_error("", "IW_TEST_KEY")
    assert (err.key, err.problem, err.value) == ("serve.hmac_key_env", problem, "IW_TEST_KEY")


def test_the_key_never_appears_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused key is not echoed into logs through the error message."""
    monkeypatch.setenv("IW_TEST_KEY", "tooshort-secret")
    assert "tooshort-secret" not in str(_config_error("", "IW_TEST_KEY"))

"""One settings object for the sidecar: a TOML file, then CLI flags, validated section by section."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alert_rules.config import RulesConfig
from alert_rules.engine_config import EngineConfig
from dashboards.config import DashboardConfig
from exporters.catalog.engines import ENGINE_CHOICES
from exporters.config import GpuConfig, ProcessConfig, ScrapeConfig
from exporters.configuring import (
    FieldDoc,
    field_docs,
    from_mapping,
    http_url,
    increasing,
    non_negative,
    one_of,
    optional_http_url,
    positive,
    ratio,
    setting,
)
from exporters.cost import CostConfig
from exporters.errors import ConfigError
from exporters.records import DEFAULT_LENGTH_EDGES
from log_pipeline.config import LogConfig


def _host_port(value: Any) -> str | None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return "must be HOST:PORT, e.g. 127.0.0.1:9100"
    return None


def _udp_address(value: Any) -> str | None:
    if value == "" or _host_port(value.removeprefix("udp://")) is None:
        return None
    return "must be empty or udp://HOST:PORT, e.g. udp://127.0.0.1:9101"


def _cron(value: Any) -> str | None:
    from serving.background import cron_trigger  # apscheduler, only when a schedule is given

    if value == "":
        return None
    try:
        cron_trigger(value)
    except ValueError as err:
        return f"must be empty or a crontab expression of 5 fields (or 6, seconds first): {err}"
    return None


def _header_name(value: Any) -> str | None:
    if not value or not all(c.isalnum() or c in "-_" for c in value):
        return "must be an HTTP header name of letters, digits, '-' and '_', e.g. x-priority"
    return None


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Section ``[serve]``: the proxy."""

    upstream: str = setting("http://127.0.0.1:8000", "Base URL of the vLLM OpenAI server.", check=http_url)
    engine: str = setting(
        "auto", "The engine behind the upstream URL: vllm, sglang, ollama, llamacpp, or auto (recognized from its "
        "/metrics names and endpoints, logged at start and exported as an info metric). It picks how "
        "/metrics is read; with ollama the sidecar polls /api/tags and /api/ps and probes readiness on / (unless "
        "readiness_path is set).", check=one_of(*ENGINE_CHOICES),
    )
    listen: str = setting("127.0.0.1:9100", "HOST:PORT the sidecar listens on.", check=_host_port)
    connect_timeout_s: float = setting(
        5.0, "Seconds to wait for a TCP connection to the upstream.", check=positive
    )
    read_timeout_s: float = setting(
        300.0, "Seconds the upstream may stay silent (before the status line or between chunks).",
        check=positive,
    )
    request_timeout_s: float = setting(
        0.0, "Longest a proxied request may take in all, in seconds, however steadily the upstream answers "
        "(a slow drip that never ends); 0 = no limit.", check=non_negative,
    )
    client_header_timeout_s: float = setting(
        30.0, "Seconds a client connection may stay idle or take to send a request's headers before the "
        "sidecar closes it (slow-header protection; also the keep-alive idle limit).", check=positive,
    )
    client_body_timeout_s: float = setting(
        60.0, "Seconds a client may take to send a request body; past it the answer is 408.", check=positive,
    )
    max_body_bytes: int = setting(
        32 * 1024 * 1024, "Largest request body accepted from a client, in bytes (larger: 413).", check=positive
    )
    max_json_depth: int = setting(
        64, "Deepest nesting of arrays and objects accepted in a JSON request body (deeper: 400).",
        check=positive,
    )
    max_event_bytes: int = setting(
        4 * 1024 * 1024, "Largest single SSE event accepted from the upstream, in bytes; a larger one ends "
        "the stream with an error event.", check=positive,
    )
    max_inflight: int = setting(
        1024, "Requests proxied at once; past it new requests get 503 with Retry-After (outcome overloaded).",
        check=positive,
    )
    shed_on_degrade: bool = setting(
        False, "Load shedding: while the embedded engine's InferwatchCircuitBreakerDegrade alert fires for a "
        "model, answer 503 with Retry-After to its requests whose priority is below shed_below_priority.",
    )
    priority_header: str = setting(
        "x-priority", "Request header carrying a client's integer priority (missing or not an integer = 0).",
        check=_header_name,
    )
    shed_below_priority: int = setting(
        1, "Requests with a priority below this are shed while their model is degraded.",
    )
    retry_after_s: int = setting(
        1, "Retry-After, in seconds, on the sidecar's own 503 answers (in-flight limit, shedding).",
        check=positive,
    )
    hmac_key_file: str = setting(
        "", "File holding the shared key for HMAC-SHA256 request signatures, at least 16 bytes (surrounding "
        "whitespace stripped); empty = no verification.",
    )
    hmac_key_env: str = setting(
        "", "Name of an environment variable holding the HMAC key, at least 16 bytes (instead of hmac_key_file).",
    )
    hmac_window_s: float = setting(
        300.0, "Seconds a signed request's timestamp may be off the sidecar's clock (replay window).",
        check=positive,
    )
    normalize_unicode: bool = setting(
        False, "Normalize prompt and message text to Unicode NFC before it reaches the tokenizer.",
    )
    admin_token_file: str = setting(
        "", "File holding the bearer token of the admin endpoints (/admin/*) for non-loopback clients, at least "
        "16 bytes (surrounding whitespace stripped); empty = admin endpoints answer loopback clients only.",
    )
    fast_retry_window_ms: float = setting(
        500.0, "A request the same client sends again (same model and prompt) less than this many milliseconds "
        "after the previous one ended counts in inferwatch_fast_retries_total.", check=positive,
    )
    length_bucket_edges: list[int] = setting(
        list(DEFAULT_LENGTH_EDGES), "Prompt-token edges of the length buckets (the label length_bucket); each edge "
        "is the inclusive upper end of its bucket (512 tokens is le512, 513 is 512-4k). Every bucket multiplies the "
        "request series: see the README's length classes.", check=increasing,
    )
    live_token_counts: bool = setting(
        True, "Track each in-flight request's tokens for the KV fragmentation estimate, at no cost to vLLM: the "
        "prompt estimated from its characters (a tokens-per-character ratio calibrated on finished requests' "
        "usage) plus one token per content chunk streamed.",
    )
    exact_live_token_counts: bool = setting(
        False, "Track them exactly instead: ask vLLM for usage on every streamed chunk and call its /tokenize "
        "for non-streamed prompts (costs vLLM's API server CPU on every request).",
    )
    engine_stats_listen: str = setting(
        "", "UDP address (udp://HOST:PORT) where the sidecar receives vLLM's per-request numbers from inferwatch's "
        "stat-logger plugin (set INFERWATCH_ENGINE_STATS to the same address in vLLM's environment); the sidecar "
        "then sends X-Request-Id: <trace id> to vLLM. Empty = off.", check=_udp_address,
    )
    engine_stats_wait_ms: float = setting(
        200.0, "How long a finished request's metrics, log record and span wait for its engine numbers when "
        "they have not arrived yet (the client's answer never waits).", check=positive,
    )
    explain_ring_size: int = setting(
        10_000, "Finished requests the sidecar keeps for `inferwatch explain` and /admin/requests (the newest; "
        "each keeps its request record alive: BENCHMARKS.md has the bytes per entry).",
        check=positive,
    )
    genai_metrics: bool = setting(
        False, "Also expose OpenTelemetry's GenAI server histograms (gen_ai_server_request_duration_seconds, "
        "gen_ai_server_time_to_first_token_seconds, gen_ai_server_time_per_output_token_seconds) with the "
        "conventions' labels, for dashboards made for those conventions.",
    )
    log_level: str = setting(
        "info", "Level of the sidecar's own diagnostics (JSON lines on stderr).",
        check=one_of("debug", "info", "warning", "error"),
    )
    workers: int = setting(
        1, "Processes answering on the listen port (SO_REUSEPORT), to use more than one core. The first keeps "
        "the metrics, logs, scraper and rule engine; the others send it their request records. max_inflight is "
        "shared out among them.", check=positive,
    )
    readiness_path: str = setting("/health", "Upstream path that answers 200 when vLLM is ready.")
    readiness_interval_s: float = setting(
        5.0, "Seconds between readiness probes of the upstream.", check=positive
    )
    tenant_header: str = setting(
        "x-tenant", "Request header naming the tenant a request is accounted to (usage, cost, per-tenant SLOs); "
        "ignored when tenant_key_map_file is set.", check=_header_name,
    )
    tenant_key_map_file: str = setting(
        "", "File mapping API keys to tenants, one 'SHA256-HEX-OF-THE-KEY TENANT' per line (# comments): the tenant "
        "comes from the hash of the request's 'Authorization: Bearer KEY', never stored; an unmapped key is "
        "'unknown'. Empty = tenant_header.",
    )
    max_tenants: int = setting(
        64, "Tenants labelled by name in the usage families; the rest are 'other'. Chosen by traffic and stable "
        "for tenant_window_s (see the README, Usage and cost).", check=positive,
    )
    tenant_window_s: float = setting(
        3600.0, "Seconds the named tenants stay the same; after each window they become the max_tenants tenants "
        "with the most requests in it.", check=positive,
    )
    showback_schedule: str = setting(
        "", "When to write a showback report into showback_dir: a crontab expression (5 fields, e.g. '0 9 * * 1', "
        "Monday 09:00) or 6 with seconds first; empty = never.", check=_cron,
    )
    showback_dir: str = setting(
        "showback", "Directory the scheduled showback reports are written into, one subdirectory per report.",
    )
    showback_period_days: float = setting(
        7.0, "Days a scheduled showback report covers, ending when it runs.", check=positive,
    )
    retired_models: list[str] = setting(
        [], "Model names retired by a cut-over: a request naming one counts as a wrong-model request (reason "
        "retired_model), so the stale clients still asking for it show, by their serve.client_header or User-Agent.",
    )
    model_renames: dict[str, str] = setting(
        {}, "Requested model name -> the name its answers carry, for a gateway that rewrites names: such an answer "
        "is not a wrong-model answer (aliases the upstream lists in /v1/models with the same root are learnt).",
    )
    client_header: str = setting(
        "x-client-id", "Request header naming the client: the client in request records (how stale clients are "
        "found), else its User-Agent; and the canary's sticky key, else the client's address.", check=_header_name,
    )
    emoji_dense_threshold: int = setting(
        15, "A prompt with more emoji than this is of text class emoji_dense (inferwatch_text_class_requests_total).",
        check=non_negative,
    )
    long_prompt_upstream: str = setting(
        "", "Base URL of a second vLLM for long prompts (the long lane): a generation request whose prompt is "
        "estimated above long_prompt_tokens goes there; empty = one lane.", check=optional_http_url,
    )
    long_prompt_tokens: int = setting(
        4096, "Estimated prompt tokens above which a request takes the long lane (the estimate: characters times "
        "the tokens-per-character ratio learnt from finished requests' usage).", check=positive,
    )
    long_prompt_fallback: str = setting(
        "main", "What a long prompt gets while the long lane is down (its last readiness probe failed, or it "
        "refused the connection): main = the main upstream serves it, refuse = a 503 with Retry-After; either "
        "is counted by reason.", check=one_of("main", "refuse"),
    )
    pass_priority: bool = setting(
        False, "Send the priority header's value to vLLM's `priority` field, negated (the header: higher = more "
        "important; vLLM: lower = earlier), for vLLM started with --scheduling-policy priority (any other vLLM "
        "refuses a priority other than 0).",
    )
    shadow_upstream: str = setting(
        "", "Base URL of a shadow upstream: a copy of a sampled generation request also goes there, never awaited "
        "on the client's path; its answer is compared with the client's and thrown away. Empty = off.",
        check=optional_http_url,
    )
    shadow_ratio: float = setting(
        0.0, "Share of generation requests copied to the shadow, chosen by trace id (the high 64 bits), so every "
        "process picks the same requests.", check=ratio,
    )
    shadow_max_inflight: int = setting(
        16, "Shadow copies in flight at once; a copy beyond it is dropped (counted, reason full).", check=positive,
    )
    shadow_timeout_s: float = setting(
        30.0, "Longest a shadow copy may take; past it the copy is dropped (counted, reason slow). The request's "
        "metrics and record wait for its shadow up to this long; its client never does.", check=positive,
    )
    canary_upstream: str = setting(
        "", "Base URL of a canary upstream taking canary_weight of the clients (sticky per client); its requests "
        "carry role=canary on their metrics, records and spans. Empty = off.", check=optional_http_url,
    )
    canary_weight: float = setting(
        0.0, "Share of clients sent to the canary, by a hash of the client's key (serve.client_header, else its "
        "address): a client stays on its side while the weight stays.", check=ratio,
    )


@dataclass(frozen=True, slots=True)
class TracingConfig:
    """Section ``[tracing]``: OpenTelemetry spans of the sidecar."""

    otlp_endpoint: str = setting(
        "", "OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces; empty = export nothing.",
        check=optional_http_url,
    )
    service_name: str = setting("inferwatch", "service.name resource attribute of the sidecar's spans.")


SECTIONS: dict[str, type] = {
    "serve": ServeConfig,
    "tracing": TracingConfig,
    "scrape": ScrapeConfig,
    "gpu": GpuConfig,
    "upstream_process": ProcessConfig,
    "logs": LogConfig,
    "rules": RulesConfig,
    "rule_engine": EngineConfig,
    "dashboards": DashboardConfig,
    "cost": CostConfig,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Every section of the configuration, validated."""

    serve: ServeConfig
    tracing: TracingConfig
    scrape: ScrapeConfig
    gpu: GpuConfig
    upstream_process: ProcessConfig
    logs: LogConfig
    rules: RulesConfig
    rule_engine: EngineConfig
    dashboards: DashboardConfig
    cost: CostConfig


def all_field_docs() -> list[FieldDoc]:
    """Documentation of every configuration key, section by section."""
    return [doc for section, cls in SECTIONS.items() for doc in field_docs(cls, section)]


def read_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file; a missing or malformed file is a ConfigError."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as err:
        raise ConfigError("--config", "file not found", str(path)) from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("--config", f"is not valid TOML: {err}", str(path)) from err


def build_settings(data: dict[str, Any] | None = None) -> Settings:
    """Validate a nested mapping (as read from TOML) into :class:`Settings`."""
    data = dict(data or {})
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise ConfigError(unknown[0], f"is not a known section; known sections: {', '.join(SECTIONS)}")
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(name, "must be a table", table)
        sections[name] = from_mapping(cls, table, name)
    return Settings(**sections)


def _parse_flag_value(doc: FieldDoc, raw: str) -> Any:
    """Parse a flag's text as a TOML value; fall back to the raw string or a comma list."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if doc.type_name.startswith("list of"):
        items = [item.strip() for item in raw.split(",") if item.strip()]
        parsed: list[Any] = []
        for item in items:
            try:
                parsed.append(tomllib.loads(f"v = {item}")["v"])
            except tomllib.TOMLDecodeError:
                parsed.append(item)
        return parsed
    return raw


CONFIG_FLAG_DEST = "cfg:"
"""The argparse destination of a configuration key's flag is this prefix and the dotted key."""


def section_summary(section: str) -> str:
    """What a configuration section is for: the first line of its class's docstring, capitalised."""
    summary = (SECTIONS[section].__doc__ or "").strip().splitlines()[0].split(": ", 1)[-1]
    return summary[0].upper() + summary[1:]


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--config`` and one ``--SECTION-KEY`` flag per configuration key, in one help group per section.

    :class:`serving.cli.Parser` leaves these flags out of the usage line (``[--SECTION-KEY VALUE]`` stands
    for them); ``--help`` lists them by section.
    """
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file. Every key is also a flag "
                        "--SECTION-KEY (listed below by section, each overriding the file); the README's "
                        "'Configuration reference' has them all with types and defaults.")
    docs = all_field_docs()
    for section in SECTIONS:
        group = parser.add_argument_group(f"[{section}] keys", section_summary(section))
        for doc in (d for d in docs if d.section == section):
            group.add_argument(
                doc.flag, dest=f"{CONFIG_FLAG_DEST}{doc.key}", metavar="VALUE", default=None,
                help=f"{doc.doc} [{doc.key}, {doc.type_name}, default {doc.default!r}]".replace("%", "%%"),
            )


def settings_from_args(args: argparse.Namespace, shortcuts: dict[str, str] | None = None) -> Settings:
    """Merge the TOML file named by ``--config`` with the flags given on the command line.

    ``shortcuts`` maps argparse destinations (e.g. ``upstream``) to dotted keys (``serve.upstream``).
    """
    data: dict[str, Any] = read_toml(args.config) if getattr(args, "config", None) else {}
    docs = {doc.key: doc for doc in all_field_docs()}
    overrides: dict[str, str] = {}
    for dest, value in vars(args).items():
        if dest.startswith(CONFIG_FLAG_DEST) and value is not None:
            overrides[dest.removeprefix(CONFIG_FLAG_DEST)] = value
    for dest, key in (shortcuts or {}).items():
        value = getattr(args, dest, None)
        if value is not None:
            overrides[key] = value
    for key, raw in overrides.items():
        section, name = key.split(".", 1)
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table", table)
        table[name] = _parse_flag_value(docs[key], raw) if isinstance(raw, str) else raw
    return build_settings(data)


def defaults() -> Settings:
    """Settings with every default."""
    return build_settings({})


def replace(settings: Settings, section: str, **changes: Any) -> Settings:
    """Return settings with some keys of one section changed (for tests and tools)."""
    current = getattr(settings, section)
    return dataclasses.replace(settings, **{section: dataclasses.replace(current, **changes)})


__all__ = [
    "CONFIG_FLAG_DEST", "SECTIONS", "ServeConfig", "Settings", "TracingConfig", "add_config_flags",
    "all_field_docs", "build_settings", "defaults", "read_toml", "replace", "section_summary", "settings_from_args",
]

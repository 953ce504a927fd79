"""Configuration section ``[rule_engine]``: the embedded evaluator inside the sidecar."""

from __future__ import annotations

from dataclasses import dataclass

from exporters.configuring import non_negative, optional_http_url, positive, setting


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Section ``[rule_engine]``: evaluation, storage bounds, notification targets."""

    enabled: bool = setting(True, "Run the embedded rule engine inside the sidecar.")
    retention_s: float = setting(
        3 * 3600.0, "Seconds of raw samples kept per scraped series (covers the longest raw range "
        "a rule reads).", check=positive,
    )
    recorded_retention_s: float = setting(
        3 * 86400.0 + 3600.0, "Seconds kept per recording-rule output and ALERTS series (long SLO "
        "windows read these, not raw samples).", check=positive,
    )
    max_series: int = setting(100_000, "Most series held in memory; new series beyond are dropped "
                              "and counted.", check=positive)
    lookback_s: float = setting(300.0, "Instant-vector lookback delta, seconds (Prometheus' default "
                                "5m).", check=positive)
    alertmanager_url: str = setting(
        "", "Alertmanager base URL (alerts go to POST <url>/api/v2/alerts); empty = none.",
        check=optional_http_url,
    )
    webhook_url: str = setting("", "Also POST alerts, webhook-style, to this URL; empty = none.",
                               check=optional_http_url)
    stdout: bool = setting(False, "Also print each notification as one JSON line on stdout.")
    resend_delay_s: float = setting(60.0, "Seconds before a firing alert is sent again.", check=positive)
    send_timeout_s: float = setting(5.0, "Timeout of one notification POST, seconds.", check=positive)
    state_file: str = setting("", "JSON file keeping pending and firing alerts across restarts; "
                              "empty = no persistence.")
    state_max_age_s: float = setting(3600.0, "A saved alert older than this is not restored.",
                                     check=non_negative)
    external_url: str = setting("http://127.0.0.1:9100", "Base of each alert's generatorURL.",
                                check=optional_http_url)

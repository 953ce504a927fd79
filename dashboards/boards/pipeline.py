"""Observability pipeline: the log pipeline, the sidecar's scrape, rule evaluation and notifications."""

from __future__ import annotations

from grafanalib import core

from alert_rules.config import RulesConfig
from dashboards import queries as q
from dashboards.board import dashboard
from dashboards.config import DashboardConfig
from dashboards.panels import Row, Spec, stat, timeseries

TITLE = "Observability pipeline"


def items(config: DashboardConfig, _rules: RulesConfig) -> list[Spec | Row]:
    """The board's rows and panels, in order."""
    return [
        Row("Request logs"),
        timeseries("Log records", "Request records per second offered to the log pipeline, kept (by reason), "
                   "dropped (by reason) and lost after queueing.", "ops", q.log_records()),
        timeseries("Sampling ratio", "Share of request records kept for the archive.", "percentunit",
                   q.sampling_ratio(), min_value=0, max_value=1),
        timeseries("Writer queue", "Records waiting in the writer queue against its capacity.", "short",
                   q.log_queue()),
        timeseries("Archive bytes", "Bytes per second written to the archive, and the same records as raw JSON.",
                   "Bps", q.archive_bytes()),
        stat("Compression ratio", "Raw JSON bytes per archived byte over the time range.", "none",
             q.compression_ratio(), width=4),
        timeseries("Archive activity", "Records archived, zstd frames written and segments published or deleted "
                   "per second.", "ops", q.archive_activity(), width=12),
        Row("Scraping"),
        timeseries("Sidecar scrape of vLLM", "Whether every sidecar's last scrape of vLLM's /metrics worked (the "
                   "minimum over replicas), the longest scrape, and failures per second over all replicas.",
                   "short", q.scrape_health()),
        timeseries("Scrape parse problems", "Malformed lines skipped per second, and vLLM families the catalog does "
                   "not know (a new vLLM version).", "short", q.scrape_problems()),
        stat("Last successful scrape", "Seconds since a sidecar last scraped vLLM successfully: the stalest "
             "replica.", "s",
             q.scrape_age(), width=4, thresholds=[("green", None), ("red", 60.0)]),
        timeseries("Prometheus targets", "Prometheus' own scrape of each job: 1 up, 0 down.", "short",
                   q.prometheus_targets(), width=4, min_value=0, max_value=1),
        Row("Rules and notifications"),
        timeseries("Rule evaluation time", "Seconds the last evaluation of each rule group took in Prometheus, and "
                   "rule evaluation failures per second.", "s", q.rule_evaluation_time(), width=12),
        timeseries("Notifications", "Alert notifications per second Prometheus sent to Alertmanager, failed to "
                   "send, and dropped.", "ops", q.notifications(config.prometheus_job), width=12),
        timeseries("Embedded rule engine", "The sidecar's own rule engine: p90 seconds of one ingest-and-evaluate "
                   "cycle, and failed evaluations per second.", "s", q.embedded_evaluation()),
        timeseries("Embedded notifications", "Alerts per second the sidecar's rule engine sent, by target and "
                   "result (sent, failed).", "ops", q.embedded_notifications()),
        timeseries("Embedded alerts", "Alerts the sidecar's rule engine holds by state, and the series in its "
                   "store.", "short", q.embedded_alerts()),
    ]


def build(config: DashboardConfig, rules: RulesConfig, _length_edges: tuple[int, ...]) -> core.Dashboard:
    """The observability pipeline board."""
    return dashboard(config, "pipeline", TITLE, "Health of inferwatch itself: request logs, scraping, rule "
                     "evaluation and notifications.", items(config, rules))

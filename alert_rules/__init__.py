"""Alert and recording rules as code, their Prometheus/Alertmanager renderings, and an embedded evaluator."""

"""Grafana dashboards written with grafanalib, built to JSON with provisioning files."""

"""exporters.configuring.http_url: the one URL check, and every place that takes a URL using it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alert_rules.config import RulesConfig
from alert_rules.engine_config import EngineConfig
from exporters.configuring import HTTP_URL_RULE, from_mapping, http_url, optional_http_url
from exporters.errors import ConfigError
from serving.loadtest.spec import check_url
from serving.upstream_http import UpstreamPool

ROOT = Path(__file__).resolve().parents[3]
GOOD = ["http://127.0.0.1:8000", "https://vllm.example/v1", "http://[::1]:9100/", "http://host"]
BAD = ["", "127.0.0.1:8000", "ftp://host/x", "http://", "http://:80", "http://host:0", "http://host:65536",
       "http://host:port", "http://[::1"]


@pytest.mark.parametrize("url", GOOD)
def test_an_http_url_with_a_host_is_accepted(url: str) -> None:
    """http and https URLs with a host, a port or a path pass."""
    assert http_url(url) is None


@pytest.mark.parametrize("url", BAD)
def test_anything_else_is_refused_with_the_rule(url: str) -> None:
    """No scheme, another scheme, no host, port 0, a port out of range or a malformed host: the rule, no exception."""
    assert http_url(url) == HTTP_URL_RULE


def test_empty_is_allowed_only_where_the_url_is_optional() -> None:
    """optional_http_url lets empty (off) through and checks anything else like http_url."""
    assert optional_http_url("") is None
    assert optional_http_url("ftp://host") == HTTP_URL_RULE


@pytest.mark.parametrize("url", ["ftp://x", "http://", "http://host:0"])
def test_the_load_test_url_uses_it(url: str) -> None:
    """--url of loadtest, drill and warm-up is refused by the same rule, naming the flag."""
    with pytest.raises(ConfigError) as err:
        check_url(url)
    assert (err.value.key, str(HTTP_URL_RULE) in str(err.value)) == ("--url", True)


def test_a_receiver_without_a_host_is_refused() -> None:
    """rules.alertmanager_receivers: ``http://`` alone used to pass (it only had to start with http://)."""
    with pytest.raises(ConfigError, match="page"):
        from_mapping(RulesConfig, {"alertmanager_receivers": {"page": "http://", "ticket": "", "info": ""}}, "rules")


def test_the_rule_engine_urls_use_it() -> None:
    """rule_engine.webhook_url: a URL with no host is refused, empty is off."""
    assert from_mapping(EngineConfig, {"webhook_url": ""}, "rule_engine").webhook_url == ""
    with pytest.raises(ConfigError) as err:
        from_mapping(EngineConfig, {"webhook_url": "https://"}, "rule_engine")
    assert err.value.key == "rule_engine.webhook_url"


def test_the_upstream_pool_uses_it() -> None:
    """The request path's connection pool refuses a base URL the config check would refuse."""
    with pytest.raises(ValueError, match=re.escape(HTTP_URL_RULE)):
        UpstreamPool("http://host:0", 1.0)


def test_no_other_module_checks_a_url_scheme_itself() -> None:
    """One URL check: no package module but exporters/configuring.py tests a URL's scheme by hand."""
    hand_made = re.compile(r"""startswith\(\(?["']https?://|scheme (?:not )?in \(["']http""")
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("serving", "exporters", "alert_rules", "dashboards", "log_pipeline")
        for path in (ROOT / package).rglob("*.py")
        if path.name != "configuring.py" and hand_made.search(path.read_text())
    ]
    assert offenders == []

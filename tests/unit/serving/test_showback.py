"""The tenant of a request, the showback report's sums and files, the cron schedule and the CLI's times."""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from multidict import CIMultiDict

from exporters.cost import CostConfig
from exporters.errors import ConfigError
from exporters.records import RequestRecord
from exporters.usage_ledger import Usage, UsageLedger
from serving.background import cron_trigger
from serving.commands.showback import parse_time
from serving.config import ServeConfig
from serving.showback.report import build_report, to_csv, write_report
from serving.showback.schedule import write_scheduled_report
from serving.tenancy import Tenancy, load_key_map

KEY = "sk-" + "k" * 40


def _record() -> RequestRecord:
    return RequestRecord(trace_id="0" * 32, span_id="0" * 16, route="/v1/completions")


class TestTenancy:
    def test_the_tenant_header_and_the_request_class(self) -> None:
        """x-tenant names the tenant (case-insensitive header), x-request-class the class; bad names are invalid."""
        tenancy = Tenancy(ServeConfig(), CostConfig())
        record = _record()
        tenancy.tag(CIMultiDict({"X-Tenant": "team-a", "x-request-class": "code"}), record)
        assert (record.tenant, record.request_class) == ("team-a", "code")
        tenancy.tag(CIMultiDict({"x-tenant": "bad name!"}), record)
        assert record.tenant == "invalid"
        tenancy.tag(CIMultiDict(), record)
        assert record.tenant == "unknown"

    def test_the_api_key_map_names_the_tenant_and_the_key_is_kept_nowhere(self, tmp_path: Path) -> None:
        """With a key map the header is ignored; the record holds the tenant, not the key or its hash."""
        key_map = tmp_path / "keys.txt"
        key_map.write_text(f"{hashlib.sha256(KEY.encode()).hexdigest()} payments  # the payments team\n")
        tenancy = Tenancy(ServeConfig(tenant_key_map_file=str(key_map)), CostConfig())
        record = _record()
        tenancy.tag(CIMultiDict({"Authorization": f"Bearer {KEY}", "x-tenant": "spoof"}), record)
        assert record.tenant == "payments"
        assert KEY not in repr(record)
        assert hashlib.sha256(KEY.encode()).hexdigest() not in repr(record)
        tenancy.tag(CIMultiDict({"Authorization": "Bearer other"}), record)
        assert record.tenant == "unknown"

    def test_a_bad_key_map_line_is_a_config_error_naming_the_line(self, tmp_path: Path) -> None:
        """A line that is not 'HASH TENANT' stops the sidecar with the line's number."""
        key_map = tmp_path / "keys.txt"
        key_map.write_text("# ok\nnot-a-hash team\n")
        with pytest.raises(ConfigError, match="line 2"):
            load_key_map(str(key_map))

    def test_the_repeat_key_is_salted_per_process(self) -> None:
        """The same prompt keys the same within one Tenancy, differently in another."""
        first, second = Tenancy(ServeConfig(), CostConfig()), Tenancy(ServeConfig(), CostConfig())
        keys = []
        for tenancy in (first, first, second):
            record = _record()
            tenancy.key_prompt({"prompt": "hello"}, "m", record)
            keys.append(record.repeat_key)
        assert keys[0] == keys[1] != keys[2]

    def test_the_body_key_is_the_whole_body_and_the_repeat_key_the_model_and_prompt(self) -> None:
        """Another max_tokens is another body (fast retries) but the same prompt (repeats); hash after hash, one
        Tenancy gives the same input the same key."""
        tenancy = Tenancy(ServeConfig(), CostConfig())
        records = []
        for body in ({"prompt": "hello", "max_tokens": 4}, {"prompt": "hello", "max_tokens": 4},
                     {"prompt": "hello", "max_tokens": 5}):
            record = _record()
            tenancy.key_prompt(body, "m", record)
            tenancy.key_body(orjson.dumps(body), record)
            records.append(record)
        assert records[0].repeat_key == records[1].repeat_key == records[2].repeat_key
        assert records[0].body_key == records[1].body_key != records[2].body_key


def _rows() -> dict[tuple[str, str, str], Usage]:
    return {("a", "m", "base"): Usage(requests=2, prompt_tokens=10, gpu_seconds=1.5, cost=0.1),
            ("a", "m", "special"): Usage(requests=1, completion_tokens=7, gpu_seconds=0.25, cost=0.7),
            ("b", "m", "base"): Usage(requests=3, gpu_seconds=2.0, cost=0.2)}


class TestReport:
    def test_every_total_is_the_sum_of_the_rows(self) -> None:
        """Totals, tenants and pools add up; tenants come by cost, with their share."""
        document = build_report(_rows(), 0, 3600, "EUR", "test")
        for figure in (f.name for f in fields(Usage)):
            total = document["totals"][figure]
            assert total == sum(row[figure] for row in document["rows"])
            assert total == pytest.approx(sum(row[figure] for row in document["by_tenant"]))
            assert total == pytest.approx(sum(row[figure] for row in document["by_pool"]))
        assert [t["tenant"] for t in document["by_tenant"]] == ["a", "b"]
        assert document["by_tenant"][0]["cost_share"] == pytest.approx(0.8 / 1.0)
        assert to_csv(document).splitlines()[-1].startswith("total,,,6,10,7,")

    def test_the_files_are_written(self, tmp_path: Path) -> None:
        """report.md, .csv, .json and the two PNGs."""
        written = write_report(build_report(_rows(), 0, 3600, "EUR", "test"), tmp_path)
        assert sorted(written) == sorted(p.name for p in tmp_path.iterdir())
        assert len(written) == 5
        assert json.loads((tmp_path / "report.json").read_text())["plots"] == ["usage_by_tenant.png", "cost_share.png"]


class TestSchedule:
    def test_crontab_and_six_fields_with_seconds(self) -> None:
        """Weekdays as cron numbers them ('0 9 * * 1' is Monday 09:00, 0 Sunday); six fields put the seconds
        first; anything else is refused."""
        sunday = datetime(2026, 11, 29, 12, tzinfo=UTC)
        assert cron_trigger("0 9 * * 1").get_next_fire_time(None, sunday) == datetime(2026, 11, 30, 9, tzinfo=UTC)
        assert cron_trigger("0 9 * * 0").get_next_fire_time(None, sunday) == datetime(2026, 12, 6, 9, tzinfo=UTC)
        assert cron_trigger("30 8 * * 1-5").get_next_fire_time(None, sunday) == datetime(2026, 11, 30, 8, 30,
                                                                                          tzinfo=UTC)
        assert cron_trigger("*/2 * * * * *").get_next_fire_time(None, sunday) == sunday
        with pytest.raises(ValueError, match="3 fields"):
            cron_trigger("* * *")

    def test_a_bad_schedule_is_a_config_error(self) -> None:
        """serve.showback_schedule is checked when the settings are read."""
        from serving.config import build_settings

        with pytest.raises(ConfigError, match=r"serve\.showback_schedule"):
            build_settings({"serve": {"showback_schedule": "every monday"}})

    def test_the_scheduled_report_covers_the_period_up_to_the_run(self, tmp_path: Path) -> None:
        """A run at t writes the ledger's [t - period, t) into a directory named after the period."""
        ledger = UsageLedger(bucket_s=60)
        ledger.add(1000.0, ("a", "m", "base"), Usage(requests=1))
        ledger.add(5000.0, ("a", "m", "base"), Usage(requests=4))
        target = write_scheduled_report(ledger, tmp_path, 3600, "USD", now=6000.0)
        assert target.name == "19700101T004000Z_19700101T014000Z"
        assert json.loads((target / "report.json").read_text())["totals"]["requests"] == 4


def test_times_are_iso_unix_now_or_an_age() -> None:
    """The CLI's --from/--to read what `inferwatch logs` reads, and 'now'."""
    assert parse_time("1700000000") == 1_700_000_000
    assert parse_time("2026-12-01T09:00:00Z") == datetime(2026, 12, 1, 9, tzinfo=UTC).timestamp()
    assert abs(parse_time("7d") - (parse_time("now") - 7 * 86_400)) < 5
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time("last week")

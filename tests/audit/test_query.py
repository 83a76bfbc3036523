"""Queries over generated records: filters, keyset pages, summaries, retention, OCSF."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sandgate.lifecycle.audit import (
    AuditFilter,
    AuditIndex,
    QueryError,
    Retention,
    parse_time,
    to_micros,
    to_ocsf,
)
from tests.audit.conftest import generated, write_records

RECORDS = 2500


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[AuditIndex, list[dict[str, Any]]]:
    state = tmp_path_factory.mktemp("audit-query")
    records = generated(RECORDS, span=timedelta(days=3))
    write_records(state, records, max_bytes=200_000)
    index = AuditIndex(state / "audit-index.db", state / "audit.jsonl")
    assert index.ingest().added == RECORDS
    return index, records


def newest_first(records: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in sorted(records, key=lambda r: r["ts"], reverse=True)]


def walk(index: AuditIndex, query: AuditFilter, limit: int) -> list[str]:
    ids: list[str] = []
    cursor = None
    for _ in range(RECORDS):
        page = index.page(query, limit, cursor)
        ids.extend(r["id"] for r in page.records)
        cursor = page.next_cursor
        if cursor is None:
            return ids
    raise AssertionError("pagination did not end")


def test_records_round_trip_unchanged(indexed: tuple[AuditIndex, list[dict[str, Any]]]) -> None:
    index, records = indexed
    for record in records[:50]:
        assert index.get(record["id"]) == record


@pytest.mark.parametrize(
    "words",
    [
        {},
        {"sandbox": "sbx-0001"},
        {"decision": "deny"},
        {"sandbox": "sbx-0002", "decision": "deny"},
        {"binding": "github-token"},
        {"host": "api0.example.com"},
        {"host": "cdn1*.example.test"},
        {"reason": "SNI does not match Host"},
        {"status": 500},
        {"kind": "connection", "decision": "allow"},
        {"sandbox": "sbx-0003", "host": "nothing.example.com"},
    ],
)
def test_filtered_pages_walk_exactly_the_matching_records(
    indexed: tuple[AuditIndex, list[dict[str, Any]]], words: dict[str, Any]
) -> None:
    index, records = indexed
    query = AuditFilter.model_validate(words)

    def matches(record: dict[str, Any]) -> bool:
        for key, value in words.items():
            if key == "host" and "*" in value:
                prefix, suffix = value.split("*")
                host = record["host"] or ""
                if not (host.startswith(prefix) and host.endswith(suffix)):
                    return False
            elif record[key] != value:
                return False
        return True

    expected = newest_first([r for r in records if matches(r)])
    assert walk(index, query, 37) == expected
    assert index.count(query) == len(expected)


def test_time_window(indexed: tuple[AuditIndex, list[dict[str, Any]]]) -> None:
    index, records = indexed
    since = parse_time("1d")
    until = parse_time("6h")
    query = AuditFilter(since=since, until=until, decision="deny")
    expected = [
        r
        for r in records
        if since <= to_micros(datetime.fromisoformat(r["ts"])) < until and r["decision"] == "deny"
    ]
    assert expected, "the generated window should hold some denials"
    assert walk(index, query, 50) == newest_first(expected)


def test_cursor_is_bound_to_its_filter(indexed: tuple[AuditIndex, list[dict[str, Any]]]) -> None:
    index, _ = indexed
    cursor = index.page(AuditFilter(decision="deny"), 5).next_cursor
    assert cursor
    with pytest.raises(QueryError, match="other filters"):
        index.page(AuditFilter(decision="allow"), 5, cursor)
    with pytest.raises(QueryError, match="not one this server issued"):
        index.page(AuditFilter(), 5, "garbage!")


def test_summary_matches_a_direct_count(indexed: tuple[AuditIndex, list[dict[str, Any]]]) -> None:
    index, records = indexed
    mine = [r for r in records if r["sandbox"] == "sbx-0000"]
    summary = index.summary(AuditFilter(sandbox="sbx-0000"), top=100)
    assert summary.total == len(mine)
    assert summary.denied == sum(r["decision"] == "deny" for r in mine)
    assert {row.key: row.count for row in summary.top_hosts} == Counter(r["host"] for r in mine if r["host"])
    denials = Counter(r["reason"] for r in mine if r["decision"] == "deny")
    assert {row.key: row.count for row in summary.denials_by_reason} == denials
    injections = Counter(f"{r['binding']} -> {r['host']}" for r in mine if r["binding"])
    assert injections and {row.key: row.count for row in summary.injections_by_binding} == injections


def test_parse_time_forms() -> None:
    now = datetime(2025, 3, 4, 12, 30, tzinfo=UTC)
    assert parse_time("90s", now) == to_micros(now - timedelta(seconds=90))
    assert parse_time("2d", now) == to_micros(now - timedelta(days=2))
    assert parse_time("today", now) == to_micros(datetime(2025, 3, 4, tzinfo=UTC))
    assert parse_time("2025-03-01T00:00:00Z", now) == to_micros(datetime(2025, 3, 1, tzinfo=UTC))
    assert parse_time("2025-03-01T02:00:00+02:00", now) == to_micros(datetime(2025, 3, 1, tzinfo=UTC))
    with pytest.raises(QueryError, match="not understood"):
        parse_time("last tuesday", now)


def test_retention_by_rows_and_age(tmp_path: Path) -> None:
    records = generated(600, span=timedelta(days=10))
    write_records(tmp_path, records)
    index = AuditIndex(tmp_path / "audit-index.db", tmp_path / "audit.jsonl")
    index.ingest()
    newest = newest_first(records)
    assert index.apply_retention(Retention(max_rows=500)) == 100
    assert walk(index, AuditFilter(), 200) == newest[:500]
    cutoff = to_micros(datetime.now(UTC) - timedelta(days=2))
    deleted = index.apply_retention(Retention(max_age_days=2))
    kept = [r for r in records if to_micros(datetime.fromisoformat(r["ts"])) >= cutoff]
    assert index.count() == len(kept) and deleted == 500 - len(kept)
    assert index.ingest().lines == 0, "retention must not make the reader re-read the log"


def record_of(kind: str, **fields: Any) -> dict[str, Any]:
    base = {
        "v": 1,
        "ts": "2025-03-04T12:30:00.250000Z",
        "id": "abc123",
        "kind": kind,
        "sandbox": "sbx-1",
        "client": "10.213.0.2:40001",
        "upstream": "198.51.100.7:443",
        "sni": "api.example.com",
        "scheme": "https",
        "method": None,
        "host": "api.example.com",
        "port": 443,
        "path": None,
        "decision": "allow",
        "reason": "allowed by rule",
        "rule": "policy.yaml:7",
        "inspect": True,
        "binding": None,
        "status": None,
        "bytes_in": 1200,
        "bytes_out": 300,
        "duration_ms": 12.6,
        "event": None,
        "detail": None,
    }
    return base | fields


def test_ocsf_request_is_http_activity() -> None:
    event = to_ocsf(
        record_of("request", method="POST", path="/v1/items?<redacted>", status=201, binding="model-key")
    )
    assert (event["class_uid"], event["category_uid"], event["activity_id"], event["type_uid"]) == (
        4002,
        4,
        6,
        400206,
    )
    assert event["http_request"]["http_method"] == "POST"
    assert event["http_request"]["url"]["path"] == "/v1/items?<redacted>"
    assert event["http_response"] == {"code": 201}
    assert event["src_endpoint"] == {"ip": "10.213.0.2", "port": 40001, "uid": "sbx-1", "name": "sbx-1"}
    assert event["dst_endpoint"] == {"ip": "198.51.100.7", "port": 443, "hostname": "api.example.com"}
    assert event["traffic"] == {"bytes_in": 1200, "bytes_out": 300, "bytes": 1500}
    assert event["time"] == int(datetime(2025, 3, 4, 12, 30, 0, 250000, tzinfo=UTC).timestamp() * 1000)
    assert event["firewall_rule"]["uid"] == "policy.yaml:7"
    assert (event["action_id"], event["disposition_id"], event["status_id"]) == (1, 1, 1)
    assert event["unmapped"]["binding"] == "model-key" and event["metadata"]["uid"] == "abc123"
    json.dumps(event)


def test_ocsf_denied_connection_is_refused_network_activity() -> None:
    event = to_ocsf(
        record_of("connection", decision="deny", reason="no rule matched", rule=None, upstream=None)
    )
    assert (event["class_uid"], event["activity_id"], event["type_uid"]) == (4001, 5, 400105)
    assert (event["action"], event["disposition"], event["status"]) == ("Denied", "Blocked", "Failure")
    assert event["dst_endpoint"] == {"hostname": "api.example.com", "port": 443}
    assert "firewall_rule" not in event and event["status_detail"] == "no rule matched"


def test_ocsf_other_kinds() -> None:
    assert to_ocsf(record_of("dns", scheme=None, sni=None, port=53))["class_uid"] == 4003
    assert to_ocsf(record_of("request", method="PATCH"))["activity_id"] == 99
    change = to_ocsf(
        record_of("policy_change", client="control-plane", event="create", detail='{"actor":"api"}')
    )
    assert (change["class_uid"], change["category_uid"], change["type_uid"]) == (6003, 6, 600301)
    assert (change["actor"], change["src_endpoint"]) == (
        {"user": {"name": "api"}},
        {"svc_name": "control-plane"},
    )
    assert to_ocsf(record_of("security_event", event="sni_mismatch"))["severity_id"] == 4
    detail = '{"actor": "access", "expires_at": "2026-01-01T00:10:00+00:00", "extend_seconds": 300}'
    renewal = to_ocsf(record_of("lifecycle", event="renew on access", detail=detail))
    assert (renewal["type_uid"], renewal["actor"]) == (600303, {"user": {"name": "access"}})
    assert renewal["resources"][0]["type"] == "sandbox"
    assert renewal["resources"][0]["data"] == {
        "expires_at": "2026-01-01T00:10:00+00:00",
        "extend_seconds": 300,
    }


def test_a_passthrough_closing_record_adds_bytes_not_a_decision(tmp_path: Path) -> None:
    """The proxy writes a second `connection` record (`event: "closed"`) when a pass-through
    connection ends; summaries and per-sandbox counts count decisions (event null) only."""
    opened = record_of(
        "connection",
        id="pt1",
        host="open.example.com",
        inspect=False,
        bytes_in=0,
        bytes_out=0,
        duration_ms=None,
    )
    closed = opened | {
        "id": "pt1-closed",
        "event": "closed",
        "bytes_in": 5000,
        "bytes_out": 700,
        "duration_ms": 90.0,
    }
    refused = record_of("connection", id="c2", host="denied.example.com", decision="deny", reason="default")
    request = record_of("request", id="r1", method="GET", status=200)
    event = record_of(
        "security_event", id="s1", decision="deny", reason="header_timeout", event="header_timeout"
    )
    write_records(tmp_path, [opened, closed, refused, request, event])
    index = AuditIndex(tmp_path / "audit-index.db", tmp_path / "audit.jsonl")
    assert index.ingest().added == 5  # the closing record is stored and shown
    summary = index.summary(AuditFilter(), top=10)
    assert (summary.total, summary.denied) == (4, 2)
    [open_host] = [row for row in summary.top_hosts if row.key == "open.example.com"]
    assert (open_host.count, open_host.bytes_in, open_host.bytes_out) == (1, 5000, 700)
    assert {row.key: row.count for row in summary.denials_by_reason} == {"default": 1, "header_timeout": 1}
    assert index.counts_by_sandbox(AuditFilter()) == {"sbx-1": (4, 2)}
    assert (to_ocsf(closed)["activity_id"], to_ocsf(opened)["activity_id"]) == (2, 6)

"""The OCSF mapping against the OCSF schema (issue 45): the kinds table's classes and
activities are the schema's, records no real run of tests/audit/test_ocsf_run.py writes (a
request left incomplete, a PATCH, names OCSF's hostname type refuses, a connection from an
address that names no sandbox, a policy change of an older server) export valid events, and the
check itself refuses what a data lake would (so a pass means something)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from ocsf_json_schema import get_ocsf_schema

from sandgate.lifecycle.audit import KINDS, OCSF_VERSION, Change, to_ocsf
from sandgate.lifecycle.audit.kinds import API_CHANGES
from sandgate.lifecycle.principals import BOOTSTRAP
from sandgate.proxy import RECORD_KINDS
from tests.audit.test_query import record_of
from tests.support.ocsf import ocsf_errors

SCHEMA = get_ocsf_schema(version=OCSF_VERSION)
AUDIT_DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
OPERATOR_B = {"id": "0f0f0f0f0f0f", "tenant": "beta", "role": "operator", "via": "key"}
REVIEWER_A = {"id": "1e1e1e1e1e1e", "tenant": "alpha", "role": "reviewer", "via": "key"}


def test_every_record_kind_has_one_row_whose_class_is_the_schemas() -> None:
    assert set(KINDS) == set(RECORD_KINDS)
    classes = {klass["uid"]: klass for klass in SCHEMA["classes"].values()}
    for kind in KINDS.values():
        klass = classes[kind.ocsf.uid]
        assert (kind.ocsf.name, kind.ocsf.category_name) == (klass["caption"], klass["category_name"])
        assert str(kind.ocsf.category_uid) in klass["attributes"]["category_uid"]["enum"]
        for profile in kind.ocsf.profiles:
            assert profile in klass["profiles"], (kind.name, profile)


SYNTHETIC = {
    "incomplete request": record_of("request", method="GET", path="/a", event="incomplete", upstream=None),
    "PATCH (no OCSF method)": record_of("request", method="PATCH", path="/a", status=204, binding="b"),
    "refused request": record_of("request", method="DELETE", path="/", decision="deny", status=403),
    "report-mode request": record_of("request", method="GET", path="/", decision="report", status=200),
    "DNS name OCSF refuses": record_of("dns", host="_srv._tcp.example.com", port=53, detail="qtype=SRV"),
    "connection to an IP literal": record_of("connection", host="198.51.100.9", upstream=None, sni=None),
    "unknown source": record_of("security_event", sandbox="-", event="unknown-source", decision="deny"),
    "security event without a client": record_of("security_event", client="-", event="header_timeout"),
    "revoked connection": record_of("connection", event="revoked", decision="deny"),
    "older policy change": record_of(
        "policy_change", client="control-plane", event=None, detail=None, reason="policy patch"
    ),
    "vault delete": record_of(
        "policy_change",
        client="control-plane",
        event="credential-vault delete",
        detail='{"actor": "egress-token"}',
    ),
    "approval allow-sandbox": record_of(
        "policy_change", client="control-plane", event="approval allow-sandbox", detail='{"actor": "api-key"}'
    ),
    "through the company's proxy": record_of(
        "request",
        method="GET",
        path="/a",
        status=200,
        via="http://proxy.example.test:3128",
        upstream="10.9.0.2:3128",
    ),
    "renew on access": record_of(
        "lifecycle",
        client="control-plane",
        event="renew on access",
        detail='{"actor": "access", "expires_at": "2026-01-01T00:10:00+00:00", "extend_seconds": 300}',
    ),
    "key revoked by the bootstrap admin": record_of(
        "api", client="control-plane", sandbox="-", method="DELETE", path="/v1/keys/0a1b2c3d4e5f",
        reason="key.revoke", status=200,
        detail='{"key": "0a1b2c3d4e5f", "params": {"key_id": "0a1b2c3d4e5f"}}',
        principal=BOOTSTRAP.model_dump(),
    ),
    "another tenant's sandbox refused": record_of(
        "api", client="control-plane", method="POST", path="/v1/sandboxes/sbx-1/pause",
        reason="sandbox.pause", status=404, decision="deny", detail='{"params": {"sandbox_id": "sbx-1"}}',
        principal=OPERATOR_B,
    ),
    "a WebSocket refused to a reviewer": record_of(
        "api", client="control-plane", method="WS", path="/v1/sandboxes/sbx-1/proxy/44772/pty",
        reason="sandbox.proxy", status=403, decision="deny", detail=None, principal=REVIEWER_A,
    ),
    "policy patch by an operator": record_of(
        "policy_change", client="control-plane", event="policy patch", detail='{"actor": "api-key"}',
        principal=OPERATOR_B,
    ),
    "command of an operator": record_of(
        "command", client="10.0.0.1:5000", method="run", detail='{"actor": "api-key", "command": "id"}',
        principal=OPERATOR_B,
    ),
}  # fmt: skip


def test_a_principal_is_the_actors_user() -> None:
    event = to_ocsf(SYNTHETIC["another tenant's sandbox refused"])
    assert event["actor"]["user"] == {
        "uid": "0f0f0f0f0f0f", "name": "0f0f0f0f0f0f", "type_id": 1, "type": "User",
        "org": {"uid": "beta", "name": "beta"}, "groups": [{"name": "operator"}],
    }  # fmt: skip
    assert (event["status"], event["api"]["response"], event["unmapped"]["principal_via"]) == (
        "Failure",
        {"code": 404},
        "key",
    )
    assert (event["activity_name"], event["api"]["operation"]) == ("Create", "sandbox.pause")
    admin = to_ocsf(SYNTHETIC["key revoked by the bootstrap admin"])["actor"]["user"]
    assert (admin["type"], admin["uid"], admin["org"]["uid"]) == ("Admin", "bootstrap", "default")
    command = to_ocsf(SYNTHETIC["command of an operator"])
    assert (command["actor"]["user"]["uid"], command["unmapped"]["credential"]) == ("0f0f0f0f0f0f", "api-key")
    assert "credential" not in to_ocsf(SYNTHETIC["another tenant's sandbox refused"])["unmapped"]


@pytest.mark.parametrize("record", SYNTHETIC.values(), ids=SYNTHETIC.keys())
def test_records_a_run_rarely_writes_export_valid_events(record: dict[str, Any]) -> None:
    assert ocsf_errors(to_ocsf(record)) == []


def test_an_incomplete_request_says_so() -> None:
    event = to_ocsf(SYNTHETIC["incomplete request"])
    assert (event["status_id"], event["http_response"]) == (0, {"code": 0})
    assert "incomplete" in event["status_detail"]


def test_a_value_outside_its_type_stays_in_unmapped() -> None:
    dns = to_ocsf(SYNTHETIC["DNS name OCSF refuses"])
    assert "query" not in dns and dns["unmapped"]["host"] == "_srv._tcp.example.com"
    patch = to_ocsf(SYNTHETIC["PATCH (no OCSF method)"])
    assert (patch["activity_name"], patch["unmapped"]["method"]) == ("Patch", "PATCH")
    assert "http_method" not in patch["http_request"]
    literal = to_ocsf(SYNTHETIC["connection to an IP literal"])
    assert literal["dst_endpoint"] == {"ip": "198.51.100.9", "port": 443}


def _broken(change: str) -> dict[str, Any]:
    event = copy.deepcopy(to_ocsf(SYNTHETIC["vault delete"]))
    if change == "ip":
        event["src_endpoint"] = {"ip": "control-plane"}  # what the export wrote before issue 45
    elif change == "type_uid":
        event["type_uid"] = 600399
    elif change == "caption":
        event["severity"] = "High"
    elif change == "attribute":
        event["traffic"] = {"bytes": 1}  # not an API Activity attribute
    elif change == "required":
        del event["actor"]
    return event


@pytest.mark.parametrize("change", ["ip", "type_uid", "caption", "attribute", "required"])
def test_the_check_refuses_what_the_schema_refuses(change: str) -> None:
    assert ocsf_errors(_broken(change)), change


def test_every_control_plane_change_has_its_api_activity() -> None:
    assert set(API_CHANGES) == set(Change)
    enum = SCHEMA["classes"]["api_activity"]["attributes"]["activity_id"]["enum"]
    assert all(enum[str(number)]["caption"] == name for number, name in API_CHANGES.values())


def test_an_upstream_proxy_is_the_proxy_endpoint_not_the_destination() -> None:
    event = to_ocsf(SYNTHETIC["through the company's proxy"])
    assert event["proxy_endpoint"] == {"ip": "10.9.0.2", "port": 3128, "hostname": "proxy.example.test"}
    assert event["dst_endpoint"] == {"hostname": "api.example.com", "port": 443}


def test_a_dns_name_is_the_querys_not_an_endpoints() -> None:
    event = to_ocsf(record_of("dns", upstream=None, sni=None, port=53, detail="qtype=A answers=198.51.100.7"))
    assert event["query"] == {"hostname": "api.example.com", "type": "A"} and "dst_endpoint" not in event


def documented_kinds() -> dict[str, list[str]]:
    """docs/audit.md's OCSF mapping table: each row's cells by its record kind."""
    text = AUDIT_DOC.read_text()
    table = text[text.index("| record kind | required fields |") :].split("\n\n")[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0].strip("`"): row[1:] for row in rows}


def test_the_docs_mapping_table_is_the_kinds_table() -> None:
    """The table users read (docs/audit.md, "OCSF export") says what KINDS does: version, every
    kind, its required fields, console label, class, category and profiles."""
    text = AUDIT_DOC.read_text()
    assert f"## OCSF export (`format=ocsf`, `-o ocsf`), OCSF {OCSF_VERSION}\n" in text
    assert f"Every event names `metadata.version` `{OCSF_VERSION}`" in text
    rows = documented_kinds()
    assert set(rows) == set(KINDS)
    for name, (required, label, klass, profiles, _activity) in rows.items():
        kind = KINDS[name]
        assert re.findall(r"`(\w+)`", required) == list(kind.required), name
        assert label == kind.label, name
        documented = re.fullmatch(r"(.+) `(\d+)` \((\d+)(?: (.+))?\)", klass)
        assert documented, (name, klass)
        class_name, uid, category_uid, category_name = documented.groups()
        ocsf = kind.ocsf
        assert (class_name, int(uid), int(category_uid)) == (ocsf.name, ocsf.uid, ocsf.category_uid), name
        assert category_name in (None, ocsf.category_name), name
        assert re.findall(r"`(\w+)`", profiles) == list(ocsf.profiles), name

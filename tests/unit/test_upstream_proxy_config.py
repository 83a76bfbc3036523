"""Upstream proxies as configured (proxy/contract/config.py, proxy/upstreamproxy.py): what a URL,
a host pattern and an identity header may be, which proxy a destination leaves through, the
CONNECT headers, a login missing from the vault, and an audit index made before `via` existed."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
from pathlib import Path

import pytest
from mitmproxy.test import taddons, tflow
from pydantic import ValidationError

from sandgate.lifecycle.audit import AuditIndex
from sandgate.proxy import AuditRecord, SandboxEntry, UpstreamProxy
from sandgate.proxy.audit import AuditLog
from sandgate.proxy.contract.config import upstream_proxy_for
from sandgate.proxy.enforcement import EnforcementAddon
from sandgate.proxy.identity import IdentityAddon
from sandgate.proxy.metrics import Metrics
from sandgate.proxy.resolver import NameMemory, Resolver
from sandgate.proxy.state import ProxyState, SandboxTable
from sandgate.proxy.upstreamproxy import UpstreamProxies, connect_request
from sandgate.vault import generate_master_key, open_store

SANDBOX = "10.213.0.2"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://proxy.example.com:3128", "http://host:port"),
        ("http://proxy.example.com", "http://host:port"),
        ("http://corp:s3cret@proxy.example.com:3128", "carries a login in its URL"),
        ("http://proxy.example.com:3128/path", "no path"),
    ],
)
def test_bad_urls_are_refused_saying_why(url: str, words: str) -> None:
    with pytest.raises(ValidationError) as raised:
        UpstreamProxy(url=url)
    assert words in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_bad_patterns_and_headers_are_refused() -> None:
    for hosts in (["*"], ["a.*.example.com"], ["example.com:443"]):
        with pytest.raises(ValidationError, match=r"use host\.example\.com or"):
            UpstreamProxy(url="http://192.0.2.1:3128", hosts=hosts)
    for header in ("Proxy-Authorization", "Host", "Bad Header"):
        with pytest.raises(ValidationError, match="is not a header name sandgate may set"):
            UpstreamProxy(url="http://192.0.2.1:3128", identity_header=header)
        with pytest.raises(ValidationError, match="is not a header name sandgate may set"):
            UpstreamProxy(url="http://192.0.2.1:3128", tenant_header=header)


def test_the_first_proxy_that_carries_a_host_wins() -> None:
    api = UpstreamProxy(url="http://192.0.2.1:3128", hosts=["*.api.example.com", "files.example.com"])
    rest = UpstreamProxy(url="http://192.0.2.2:3128/")
    assert rest.url == "http://192.0.2.2:3128" and rest.address == ("192.0.2.2", 3128)
    assert upstream_proxy_for([api, rest], "a.b.api.example.com") is api
    assert upstream_proxy_for([api, rest], "FILES.example.com.") is api
    assert upstream_proxy_for([api, rest], "api.example.com") is rest  # `*.` is subdomains only
    assert upstream_proxy_for([api], "other.example.com") is None  # dialled directly


def test_a_proxy_for_some_tenants_carries_only_their_sandboxes_and_names_the_tenant() -> None:
    acme = UpstreamProxy(
        url="http://192.0.2.1:3128", tenants=["acme"], identity_header="X-Sandbox", tenant_header="X-Tenant"
    )
    rest = UpstreamProxy(url="http://192.0.2.2:3128")
    assert upstream_proxy_for([acme, rest], "api.example.com", "acme") is acme
    assert upstream_proxy_for([acme, rest], "api.example.com", "globex") is rest
    assert upstream_proxy_for([acme, rest], "api.example.com") is rest  # a sandbox of no tenant
    assert upstream_proxy_for([acme], "api.example.com", "globex") is None  # dialled directly
    proxies = UpstreamProxies([acme, rest], SandboxTable(None).values)
    of_acme = SandboxEntry(sandbox_id="sbx-a", address=SANDBOX, policy={}, tenant="acme")
    assert proxies.choose(of_acme, "api.example.com") is acme
    assert proxies.connect_headers(acme, of_acme) == [("X-Sandbox", "sbx-a"), ("X-Tenant", "acme")]
    of_globex = SandboxEntry(sandbox_id="sbx-g", address=SANDBOX, policy={}, tenant="globex")
    assert proxies.choose(of_globex, "api.example.com") is rest
    with pytest.raises(ValidationError, match="both 'X-Same'"):
        UpstreamProxy(url="http://192.0.2.1:3128", identity_header="X-Same", tenant_header="x-same")


def test_connect_headers_carry_the_vault_login_and_the_sandbox_id(tmp_path: Path) -> None:
    store = open_store("local", tmp_path, generate_master_key())
    store.put("corp", "gateway:pw-1")
    table = SandboxTable(store)
    proxy = UpstreamProxy(url="http://192.0.2.1:3128", credential="corp", identity_header="X-Sandbox")
    proxies = UpstreamProxies([proxy], table.values)
    proxies.load()
    entry = SandboxEntry(sandbox_id="sbx-1", address=SANDBOX, policy={}, tenant="acme")
    headers = proxies.connect_headers(proxy, entry)
    assert headers == [("Proxy-Authorization", "Basic " + base64.b64encode(b"gateway:pw-1").decode()),
                       ("X-Sandbox", "sbx-1")]  # fmt: skip
    assert "pw-1" not in table.values.redact_text("login gateway:pw-1")
    request = connect_request("api.example.com", 443, headers)
    assert request.startswith(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n")
    assert request.endswith(b"X-Sandbox: sbx-1\r\n\r\n")


def test_a_login_missing_from_the_vault_is_a_502_never_a_direct_dial(tmp_path: Path) -> None:
    store = open_store("local", tmp_path, generate_master_key())
    table = SandboxTable(store)
    policy = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "198.51.100.0/24"}]}
    table.put(SandboxEntry(sandbox_id="sbx-u", address=SANDBOX, policy=policy))
    proxy = UpstreamProxy(url="http://192.0.2.1:3128", credential="absent")
    state = ProxyState(table, Resolver(["127.0.0.1"]), NameMemory(), AuditLog(tmp_path / "a.jsonl", 4096, 2),
                       Metrics(), upstream_proxies=UpstreamProxies([proxy], table.values))  # fmt: skip
    flow = tflow.tflow()
    flow.client_conn.peername, flow.client_conn.sni = (SANDBOX, 40000), None
    flow.request.data.host, flow.request.data.port = "198.51.100.10", 80
    flow.request.headers["host"] = "198.51.100.10"
    IdentityAddon(state).client_connected(flow.client_conn)
    with taddons.context():
        asyncio.run(EnforcementAddon(state).requestheaders(flow))
    assert flow.response is not None and flow.response.status_code == 502
    body = json.loads(flow.response.content or b"")
    assert body["reason"] == "upstream-error"
    assert "http://192.0.2.1:3128: its credential 'absent' is not in the vault" in body["detail"]
    assert flow.server_conn.via is None


def test_an_index_made_before_via_gets_the_column(tmp_path: Path) -> None:
    index = AuditIndex(tmp_path / "index.db", tmp_path / "audit.jsonl")
    index._conn().execute("ALTER TABLE records DROP COLUMN via")
    index.close()
    db = sqlite3.connect(tmp_path / "index.db")
    assert "via" not in {row[1] for row in db.execute("PRAGMA table_info(records)")}
    db.close()
    log = AuditLog(tmp_path / "audit.jsonl", 1 << 20, 1)
    record = AuditRecord(kind="connection", sandbox="sbx", client="-", decision="allow", reason="rule",
                         via="http://192.0.2.1:3128")  # fmt: skip
    log.write(record)
    log.close()
    reopened = AuditIndex(tmp_path / "index.db", tmp_path / "audit.jsonl")
    reopened.ingest()
    [(via,)] = reopened._conn().execute("SELECT via FROM records").fetchall()
    assert via == "http://192.0.2.1:3128"

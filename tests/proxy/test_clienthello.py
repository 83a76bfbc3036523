"""ClientHello checks as pure functions and in the enforcement addon's judgement: hellos made by
OpenSSL (tests/adversarial/attacks.py, `openssl_hello`), the malformed and ECH variants as edits
of its extension list (`HELLO_EDITS`, each described there), parsed by mitmproxy as the proxy
parses them; a property test that no extension list makes the checks raise."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import tls
from mitmproxy.options import Options
from mitmproxy.proxy import context as proxy_context
from mitmproxy.proxy.layers.tls import parse_client_hello
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import tflow

from sandgate.proxy import SandboxEntry
from sandgate.proxy.audit import AuditLog
from sandgate.proxy.clienthello import encrypted_hello, hello_fault, server_name_fault
from sandgate.proxy.enforcement import EnforcementAddon
from sandgate.proxy.identity import IdentityAddon
from sandgate.proxy.metrics import Metrics
from sandgate.proxy.resolver import NameMemory, Resolver
from sandgate.proxy.state import ConnState, ProxyState, SandboxTable
from sandgate.vault import generate_master_key, open_store
from tests.adversarial.attacks import HELLO_EDITS, hello_extensions, hello_record, openssl_hello, server_name

SANDBOX, ORIGIN = "10.213.0.2", "198.51.100.10"
PASSTHROUGH, INTERCEPTED = "open.example.com", "api.example.com"
POLICY = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": PASSTHROUGH},
        {"action": "allow", "target": INTERCEPTED, "methods": ["GET"]},  # an L7 rule: intercepted
    ],
}


def hello(edit: str, sni: str = PASSTHROUGH) -> tls.ClientHello:
    head, extensions = hello_extensions(openssl_hello(sni))
    parsed = parse_client_hello(
        hello_record(head, HELLO_EDITS[edit](extensions, sni.encode(), b"x.example.test"))
    )
    assert parsed is not None
    return parsed


FAULTS = {
    "two_server_name": "extension 0x0000 more than once",
    "repeated_extension": "extension 0x000a more than once",
    "two_names": "server_name holds 2 names; one is allowed",
    "bad_list_length": "server_name list length does not match its extension",
    "other_name_type": "server_name of type 1, not host_name",
}


UNPARSEABLE = "trailing_bytes"  # mitmproxy cannot parse it; the addon's tls_failed_client records it


@pytest.mark.parametrize("edit", sorted(set(HELLO_EDITS) - {UNPARSEABLE}))
def test_what_a_conforming_server_must_reject_is_named(edit: str) -> None:
    parsed = hello(edit)
    assert hello_fault(parsed.extensions) == FAULTS.get(edit)
    assert encrypted_hello(parsed.extensions) == ("encrypted_client_hello" if edit == "ech" else None)


def test_server_name_bodies() -> None:
    assert server_name_fault(server_name(b"a.example.com")) is None
    assert server_name_fault(server_name(b"a.example.com.")) is None  # the same name: normalised later
    assert server_name_fault(server_name(b"bad host")) == "server_name is not a valid host name"
    assert server_name_fault(server_name()) == "server_name holds 0 names; one is allowed"
    assert server_name_fault(b"") == "server_name list length does not match its extension"
    assert server_name_fault(server_name(b"a.example.com") + b"\x00") is not None  # trailing byte
    cut = server_name(b"a.example.com")[:-3]
    assert (
        server_name_fault(b"\x00" + bytes([len(cut) - 2]) + cut[2:])
        == "server_name entry length out of bounds"
    )


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0, 0, 10, 0xFE0D, 0xFFCE, 23]), st.binary(max_size=40)), max_size=6)
)
def test_no_extension_list_makes_the_checks_raise(extensions: list[tuple[int, bytes]]) -> None:
    fault = hello_fault(extensions)
    kinds = [kind for kind, _ in extensions]
    if len(kinds) != len(set(kinds)):
        assert fault is not None and "more than once" in fault
    if fault is None and 0 in kinds:  # a server_name that passes is exactly one valid host name
        body = dict(extensions)[0]
        assert body[2] == 0 and int.from_bytes(body[3:5], "big") == len(body) - 5
    encrypted_hello(extensions)


def test_a_hello_mitmproxy_cannot_parse_is_recorded_as_malformed(state: ProxyState) -> None:
    head, extensions = hello_extensions(openssl_hello(PASSTHROUGH))
    record = hello_record(head, HELLO_EDITS[UNPARSEABLE](extensions, PASSTHROUGH.encode(), b""))
    with pytest.raises(ValueError):
        parse_client_hello(record)
    client = tflow.tclient_conn()
    client.peername, client.proxy_mode = (SANDBOX, 40002), ProxyMode.parse("transparent")
    IdentityAddon(state).client_connected(client)
    client.error = "Cannot parse ClientHello: " + record.hex()  # as mitmproxy's TLS layer sets it
    context = proxy_context.Context(client, Options())
    context.server.address = (ORIGIN, 443)
    addon = EnforcementAddon(state)
    addon.tls_failed_client(tls.TlsData(client, context))
    last = json.loads(state.audit.path.read_text().splitlines()[-1])
    assert (last["decision"], last["reason"], last["detail"]) == (
        "deny",
        "malformed-clienthello",
        "the ClientHello does not parse",
    )
    assert state.connections[client.id].denied
    client.error = "The client does not trust the proxy's certificate for x (unknown ca)"
    addon.tls_failed_client(tls.TlsData(client, context))  # not a hello fault: nothing recorded
    assert len(state.audit.path.read_text().splitlines()) == 1  # ours, once


# ------------------------------------------------------------------ the addon's judgement


@pytest.fixture
def state(tmp_path: Path) -> ProxyState:
    table = SandboxTable(open_store("local", tmp_path, generate_master_key()))
    table.put(SandboxEntry(sandbox_id="sbx-h", address=SANDBOX, policy=POLICY))
    state = ProxyState(
        table, Resolver(["127.0.0.1"]), NameMemory(), AuditLog(tmp_path / "a.jsonl", 4096, 2), Metrics()
    )

    async def addresses(name: str) -> list[str]:
        return [ORIGIN]

    state.resolver.addresses = addresses  # type: ignore[method-assign]  # no DNS server in a unit test
    return state


def judge(state: ProxyState, client_hello: tls.ClientHello, ech: Any = "refuse") -> dict[str, Any]:
    addon = EnforcementAddon(state, ech)
    sandbox = state.table.get(SANDBOX)
    assert sandbox is not None
    conn = ConnState(sandbox_address=SANDBOX, sandbox_id=sandbox.id, client=(SANDBOX, 40000))
    judged = asyncio.run(addon.judge_clienthello(conn, sandbox, client_hello, (ORIGIN, 443)))
    addon.settle_clienthello(conn, sandbox, conn.client, client_hello.sni, 443, judged)
    record = json.loads(state.audit.path.read_text().splitlines()[-1])
    outcome = "deny" if conn.denied else "passthrough" if conn.passthrough else "intercept"
    return {"outcome": outcome, "reason": record["reason"], "detail": record.get("detail")}


@pytest.mark.parametrize("edit", sorted(FAULTS))
def test_a_malformed_hello_is_refused_whatever_the_host(state: ProxyState, edit: str) -> None:
    for host in (PASSTHROUGH, INTERCEPTED):
        judged = judge(state, hello(edit, host))
        assert judged == {"outcome": "deny", "reason": "malformed-clienthello", "detail": FAULTS[edit]}


@pytest.mark.parametrize(
    ("mode", "passthrough_host", "intercepted_host"),
    [
        ("refuse", "deny", "deny"),
        ("intercept", "intercept", "intercept"),
        ("passthrough", "passthrough", "intercept"),
    ],
)
def test_an_ech_hello_is_what_the_setting_says(
    state: ProxyState, mode: str, passthrough_host: str, intercepted_host: str
) -> None:
    assert judge(state, hello("none"), mode)["outcome"] == "passthrough"  # the control
    on_passthrough = judge(state, hello("ech"), mode)
    assert on_passthrough["outcome"] == passthrough_host
    assert on_passthrough["detail"].startswith("encrypted_client_hello: ")
    assert on_passthrough["detail"].endswith(f"(ech={mode})")
    assert judge(state, hello("ech", INTERCEPTED), mode)["outcome"] == intercepted_host
    if mode == "refuse":
        assert on_passthrough["reason"] == "ech-refused"
    denied = judge(state, hello("ech", "denied.example.test"), mode)  # the policy still comes first
    assert denied["outcome"] == "deny" and denied["reason"] == "default"

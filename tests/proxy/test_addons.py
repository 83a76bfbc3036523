"""The proxy's pieces alone, with mitmproxy's own test flows (tflow) and addon context (taddons):
decisions and refusals, identity, injection, trimming, the audit log and the CA. No sockets."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from mitmproxy import tls
from mitmproxy.options import Options
from mitmproxy.proxy import context as proxy_context
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.test import taddons, tflow

from sandgate.proxy import AuditRecord, SandboxEntry, ensure_ca, frontdoor, redact_path
from sandgate.proxy.audit import AuditLog
from sandgate.proxy.auditing import AuditAddon
from sandgate.proxy.enforcement import EnforcementAddon
from sandgate.proxy.identity import IdentityAddon
from sandgate.proxy.injection import InjectionAddon
from sandgate.proxy.metrics import Metrics
from sandgate.proxy.resolver import NameMemory, Resolver
from sandgate.proxy.state import FLOW_KEY, ProxyState, SandboxTable
from sandgate.proxy.streaming import CHECKED_BODY_MAX, StreamingAddon
from sandgate.vault import generate_master_key, open_store

SANDBOX = "10.213.0.2"
ORIGIN = "198.51.100.10"
TOKEN = "tok-unit-9b1f3e77c2"
POLICY = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": "198.51.100.0/24", "methods": ["GET", "POST", "TRACE"]},
        {"action": "allow", "target": "api.example.com"},
    ],
    "bindings": [
        {
            "name": "api",
            "credential": "tok",
            "match": {"hosts": ["api.example.com"], "schemes": ["http"]},
            "auth": {"type": "bearer"},
        },
    ],
}


@pytest.fixture
def state(tmp_path: Path) -> ProxyState:
    key = generate_master_key()
    store = open_store("local", tmp_path, key)
    store.put("tok", TOKEN)
    table = SandboxTable(store)
    table.put(SandboxEntry(sandbox_id="sbx-u", address=SANDBOX, policy=POLICY))
    return ProxyState(
        table, Resolver(["127.0.0.1"]), NameMemory(), AuditLog(tmp_path / "a.jsonl", 4096, 2), Metrics()
    )


def sandbox_flow(state: ProxyState, host: str, method: str = "GET", path: str = "/x?q=1"):  # type: ignore[no-untyped-def]
    flow = tflow.tflow()
    flow.client_conn.peername = (SANDBOX, 40000)
    flow.client_conn.sni = None
    flow.request.method, flow.request.path = method, path
    flow.request.data.host, flow.request.data.port = host, 80  # tflow's port 22 would not match Host
    flow.request.headers["host"] = host
    IdentityAddon(state).client_connected(flow.client_conn)
    return flow


def records(state: ProxyState) -> list[dict]:
    return [json.loads(line) for line in state.audit.path.read_text().splitlines()]


def test_refused_request_gets_403_json_and_one_record(state: ProxyState) -> None:
    flow = sandbox_flow(state, "denied.example.com")
    with taddons.context():
        asyncio.run(EnforcementAddon(state).requestheaders(flow))
    assert flow.response is not None and flow.response.status_code == 403
    assert json.loads(flow.response.content or b"") == {
        "error": "egress denied",
        "host": "denied.example.com",
        "reason": "default",
        "rule": None,
    }
    AuditAddon(state).response(flow)
    [record] = records(state)
    assert (record["kind"], record["decision"], record["path"]) == ("request", "deny", "/x?<redacted>")


def test_disagreeing_names_get_421(state: ProxyState) -> None:
    flow = sandbox_flow(state, ORIGIN)
    flow.client_conn.tls, flow.client_conn.sni = True, "api.example.com"
    asyncio.run(EnforcementAddon(state).requestheaders(flow))
    assert flow.response is not None and flow.response.status_code == 421


def test_allowed_literal_is_pinned_and_dialled(state: ProxyState) -> None:
    flow = sandbox_flow(state, ORIGIN)
    addon = EnforcementAddon(state)
    asyncio.run(addon.requestheaders(flow))
    assert flow.response is None and flow.metadata[FLOW_KEY].verdict.allowed
    server = tflow.tserver_conn()
    server.address = (ORIGIN, 80)
    addon.server_connect(ServerConnectionHookData(server=server, client=flow.client_conn))
    assert server.error is None and server.address == (ORIGIN, 80)


def test_denied_tls_is_ignored_then_killed_before_any_certificate(state: ProxyState) -> None:
    client = tflow.tclient_conn()
    client.peername, client.proxy_mode = (SANDBOX, 40001), ProxyMode.parse("transparent")
    IdentityAddon(state).client_connected(client)
    ctx = proxy_context.Context(client, Options())
    ctx.server.address = ("203.0.113.9", 443)
    hello = tls.ClientHelloData(ctx, _client_hello("evil.example.com"))
    addon = EnforcementAddon(state)
    asyncio.run(addon.tls_clienthello(hello))
    assert hello.ignore_connection
    server = tflow.tserver_conn()
    addon.server_connect(ServerConnectionHookData(server=server, client=client))
    assert server.error == "egress denied"
    assert records(state)[-1]["sni"] == "evil.example.com"


def test_unknown_source_is_refused(state: ProxyState) -> None:
    client = tflow.tclient_conn()
    client.peername = ("10.99.0.2", 1234)
    IdentityAddon(state).client_connected(client)
    assert client.error and "not a registered sandbox" in client.error
    assert records(state)[-1]["event"] == "unknown-source"


def test_injection_replaces_client_header_and_never_on_trace(state: ProxyState) -> None:
    injected = sandbox_flow(state, "api.example.com")
    injected.request.scheme, injected.request.port = "http", 80
    injected.request.headers["authorization"] = "Bearer forged"
    state.names.remember(SANDBOX, "api.example.com", [ORIGIN])
    enforcement, injection = EnforcementAddon(state), InjectionAddon(state)
    state.resolver.addresses = _fixed(ORIGIN)  # type: ignore[method-assign]  # no DNS in unit tests
    asyncio.run(enforcement.requestheaders(injected))
    asyncio.run(injection.requestheaders(injected))
    assert injected.request.headers.get_all("authorization") == [f"Bearer {TOKEN}"]
    trace = sandbox_flow(state, "api.example.com", method="TRACE")
    trace.request.scheme, trace.request.port = "http", 80
    asyncio.run(enforcement.requestheaders(trace))
    asyncio.run(injection.requestheaders(trace))
    assert "authorization" not in trace.request.headers


def test_websocket_history_is_trimmed() -> None:
    flow = tflow.tflow(ws=True)
    StreamingAddon().websocket_message(flow)
    assert flow.websocket is not None and len(flow.websocket.messages) == 1


def test_audit_log_rotates(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1024, backups=2)
    for n in range(30):
        log.write(AuditRecord(kind="request", sandbox="s", client="c", decision="allow", reason=f"r{n}"))
    files = [tmp_path / name for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl")]
    kept = [json.loads(line)["reason"] for path in files for line in path.read_text().splitlines()]
    assert kept == [f"r{n}" for n in range(30 - len(kept), 30)]  # the newest, in order, none cut
    assert (tmp_path / "audit.jsonl.1").exists() and (tmp_path / "audit.jsonl.2").exists()
    assert not (tmp_path / "audit.jsonl.3").exists()
    assert redact_path("/a/b?token=x") == "/a/b?<redacted>" and redact_path("/a") == "/a"


def test_ca_is_made_once_with_a_private_key_file(tmp_path: Path) -> None:
    first = ensure_ca(tmp_path)
    assert stat.S_IMODE(first.key_and_cert.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" not in first.cert.read_bytes()
    before = first.key_and_cert.read_bytes()
    assert ensure_ca(tmp_path).key_and_cert.read_bytes() == before


def _start_like_a_worker(state_dir: str, barrier: Any, results: Any) -> None:
    """What each proxy worker does first on start: the CA and the upstream trust bundle."""
    from sandgate.proxy.contract.ca import upstream_trust_bundle

    barrier.wait(timeout=30)
    try:
        files = ensure_ca(Path(state_dir))
        upstream_trust_bundle(Path(state_dir), None)
        results.put(files.key_and_cert.read_bytes())
    except Exception as exc:
        results.put(repr(exc).encode())


def test_workers_starting_together_make_one_ca(tmp_path: Path) -> None:
    """Workers start at the same moment on a fresh state dir: one CA, whose certificate is the
    one sandboxes trust, and no writer's temporary file renamed away under another."""
    fork = multiprocessing.get_context("fork")
    count = 8
    barrier, results = fork.Barrier(count), fork.Queue()
    workers = [
        fork.Process(target=_start_like_a_worker, args=(str(tmp_path), barrier, results))
        for _ in range(count)
    ]
    for worker in workers:
        worker.start()
    try:
        seen = {results.get(timeout=60) for _ in workers}
    finally:
        for worker in workers:
            worker.join(timeout=30)
            worker.kill()
    assert len(seen) == 1, seen
    ca = x509.load_pem_x509_certificates(seen.pop())[0]
    assert x509.load_pem_x509_certificate((tmp_path / "mitmproxy-ca-cert.pem").read_bytes()) == ca
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".ca.lock",
        "mitmproxy-ca-cert.pem",
        "mitmproxy-ca.pem",
        "upstream-trust.pem",
    ]


def _fixed(address: str):  # type: ignore[no-untyped-def]
    async def addresses(name: str) -> list[str]:
        return [address]

    return addresses


def _client_hello(sni: str) -> tls.ClientHello:
    """A real ClientHello for `sni`, made by OpenSSL (no socket: memory BIOs)."""
    import ssl

    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    ssl_object = context.wrap_bio(incoming, outgoing, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        ssl_object.do_handshake()
    record = outgoing.read()
    return tls.ClientHello(record[9:])  # skip the record header (5) and handshake header (4)


def test_accepted_connections_send_without_delay() -> None:
    """asyncio sets TCP_NODELAY only when a socket's proto is IPPROTO_TCP, which the front door's
    listeners (socket.create_server) are not; without it every keep-alive response through
    mitmproxy waited 40 ms for the client's delayed ACK (23 instead of 450 req/s at c=1)."""
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()):
        sock, _ = frontdoor.accept(listener)
        with sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert not sock.getblocking()


@pytest.mark.parametrize(
    ("host", "version", "declared", "streamed", "length_kept"),
    [
        ("api.example.com", "HTTP/2.0", "100", False, True),  # read whole: h2 checks DATA against it first
        ("api.example.com", "HTTP/2.0", str(CHECKED_BODY_MAX + 1), True, False),  # framed by what is sent
        ("api.example.com", "HTTP/2.0", None, True, False),  # END_STREAM alone frames it
        ("api.example.com", "HTTP/1.1", "100", True, True),  # mitmproxy checks HTTP/1 framing first
        (ORIGIN, "HTTP/2.0", "100", True, True),  # no credential goes with it
    ],
)
def test_a_credentialed_http2_body_is_read_whole_before_it_goes(
    state: ProxyState, host: str, version: str, declared: str | None, streamed: bool, length_kept: bool
) -> None:
    """streaming.py rule 6 (issue 27): which requests are held until their framing is checked."""
    flow = sandbox_flow(state, host, method="POST")
    flow.request.scheme, flow.request.port, flow.request.http_version = "http", 80, version
    flow.request.headers.pop("content-length", None)
    if declared is not None:
        flow.request.headers["content-length"] = declared
    state.names.remember(SANDBOX, "api.example.com", [ORIGIN])
    state.resolver.addresses = _fixed(ORIGIN)  # type: ignore[method-assign]  # no DNS in unit tests
    asyncio.run(EnforcementAddon(state).requestheaders(flow))
    asyncio.run(InjectionAddon(state).requestheaders(flow))
    assert flow.response is None and flow.metadata[FLOW_KEY].verdict.allowed
    StreamingAddon().requestheaders(flow)
    assert bool(flow.request.stream) is streamed
    assert ("content-length" in flow.request.headers) is length_kept

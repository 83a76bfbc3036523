"""Chaining to a company's proxy: a real squid behind basic auth (tests/support/squid.py) as the
upstream of every allowed destination. Proven from the other side: squid's access log shows each
CONNECT target with the login's user and the sandbox id; the origins' log shows every request
came from squid's address, never the gateway's; the upstream password is in no audit record, no
proxy log, config file or argv, and nothing the sandbox got. A stopped squid gives the agent a
clear failure, and the origins' log proves nothing went direct."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy import SandboxEntry, UpstreamProxy
from sandgate.vault import StoreSecrets, StoreSettings, generate_master_key, open_store
from tests.proxy.conftest import (
    CLIENT_ADDR,
    EXPLICIT_PORT,
    GATEWAY,
    Client,
    RunningProxy,
    start_proxy,
    stop_proxy,
)
from tests.support.internet import HOST_V4, ORIGIN_V4, Internet
from tests.support.squid import IDENTITY_HEADER, SQUID_V4, TENANT_HEADER, Squid, start_squid

pytestmark = pytest.mark.root

SANDBOX = "sbx-corp"
TOKEN = "sk-corp-8d1f4e2a9c7b"
POLICY = {
    "defaultAction": "deny",
    "egress": [{"action": "allow", "target": f"{name}.example.com"} for name in ("pass", "api", "plain")],
    "bindings": [
        {
            "name": "api",
            "credential": "api-token",
            "match": {"hosts": ["api.example.com"]},
            "auth": {"type": "bearer"},
        },
    ],
}
PASSWORD = "corp-" + secrets.token_hex(8)
# What a sandbox puts on its own CONNECT to the explicit listener: never what the upstream reads.
FORGED = (
    "--proxy-header",
    f"{IDENTITY_HEADER}: sbx-forged",
    "--proxy-header",
    "Proxy-Authorization: Basic eDp5",
)


@pytest.fixture(scope="module")
def squid(net: Internet) -> Iterator[Squid]:
    with start_squid(net, "gateway", PASSWORD) as running:
        yield running


def corp_proxy(squid: Squid, credential: str = "corp-proxy") -> UpstreamProxy:
    return UpstreamProxy(url=squid.url, credential=credential, identity_header=IDENTITY_HEADER)


@pytest.fixture(scope="module")
def proxy(net: Internet, squid: Squid, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({f"{n}.example.com": [ORIGIN_V4] for n in ("pass", "api", "plain")})
    vault_dir = tmp_path_factory.mktemp("vault")
    key = generate_master_key()
    store = open_store("local", vault_dir, key)
    store.put("api-token", TOKEN)
    store.put("corp-proxy", f"gateway:{PASSWORD}")
    store.put("corp-proxy-wrong", "gateway:not-the-password")
    entry = SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(
        tmp_path_factory.mktemp("proxy"),
        net,
        [entry],
        vault=StoreSettings(state_dir=vault_dir),
        vault_secrets=StoreSecrets(vault_key=key),
        upstream_proxies=[corp_proxy(squid)],
    )
    try:
        yield running
    finally:
        stop_proxy(running)


def origin_clients(net: Internet, since: int) -> list[str]:
    return [str(r["client"]).rsplit(":", 1)[0] for r in net.origin_requests()[since:]]


def squid_lines(squid: Squid, method: str, url: str, at_least: int = 1) -> list[list[str]]:
    """squid's lines for `method url`, once there are `at_least` (squid logs a CONNECT when its
    tunnel closes, a moment after the client is done)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in squid.access_log() if line[3] == method and line[4] == url]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def through_squid(client: Client, net: Internet, *curl: str) -> tuple[str, list[dict[str, Any]]]:
    """curl's output and the requests the origins got for it, each proven to come from squid."""
    mark = len(net.origin_requests())
    result = client.curl(*curl)
    assert result.returncode == 0, result.stderr
    seen = net.origin_requests()[mark:]
    assert seen and origin_clients(net, mark) == [SQUID_V4] * len(seen)
    for request in seen:  # nothing for the upstream proxy went inside the tunnel
        assert not {"proxy-authorization", IDENTITY_HEADER.lower()} & set(request["headers"])
    return result.stdout, seen


def test_passthrough_https_leaves_through_squid(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    out, _ = through_squid(client, net, "--cacert", str(net.ca_cert), "https://pass.example.com/")
    assert out == "hello from origin\n"  # with the origin's own certificate: passed through
    [line] = squid_lines(squid, "CONNECT", "pass.example.com:443")[-1:]
    assert line[2] == "gateway" and line[5] == "200" and line[6] == SANDBOX
    [record] = proxy.wait_audit(1, kind="connection", host="pass.example.com", event=None)
    assert record["via"] == squid.url and record["upstream"] == f"{SQUID_V4}:3128"
    assert record["inspect"] is False


def test_intercepted_https_is_injected_through_squid(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    out, [seen] = through_squid(client, net, "--cacert", str(proxy.ca_cert), "https://api.example.com/echo")
    assert json.loads(out)["headers"]["authorization"] == "Bearer [REDACTED]"
    assert seen["headers"]["authorization"] == f"Bearer {TOKEN}"  # injected, inside the tunnel
    assert squid_lines(squid, "CONNECT", "api.example.com:443")[-1][6] == SANDBOX
    [record] = proxy.wait_audit(1, kind="request", host="api.example.com", status=200)
    assert record["via"] == squid.url and record["binding"] == "api"


def test_plain_http_goes_through_squid_and_the_tunnel_carries_no_proxy_header(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    through_squid(client, net, "http://plain.example.com/echo")
    assert squid_lines(squid, "CONNECT", "plain.example.com:80")[-1][2] == "gateway"
    [record] = proxy.wait_audit(1, kind="request", host="plain.example.com", status=200)
    assert record["via"] == squid.url


def test_explicit_connect_passthrough_goes_through_squid_with_our_headers_only(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    before = len(squid_lines(squid, "CONNECT", "pass.example.com:443"))
    explicit = ("-x", f"http://{GATEWAY}:{EXPLICIT_PORT}", *FORGED)
    url = "https://pass.example.com/bytes?n=5000"
    out, _ = through_squid(client, net, *explicit, "--cacert", str(net.ca_cert), url)
    assert len(out) == 5000
    lines = squid_lines(squid, "CONNECT", "pass.example.com:443", before + 1)
    assert len(lines) == before + 1
    assert lines[-1][2] == "gateway" and lines[-1][6] == SANDBOX  # not the sandbox's own headers
    # Intercepted inside the explicit tunnel: injected, and through squid too.
    api = "https://api.example.com/echo"
    out, [seen] = through_squid(client, net, *explicit, "--cacert", str(proxy.ca_cert), api)
    assert seen["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(out)["headers"]["authorization"] == "Bearer [REDACTED]"


def test_explicit_absolute_form_http_goes_through_squid_with_our_headers_only(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    """`curl -x gateway:15002 http://...`: the request to the explicit listener in absolute form,
    with a forged identity and login of the sandbox's own, leaves through squid as a CONNECT
    carrying the real sandbox id and the vault's login."""
    before = len(squid_lines(squid, "CONNECT", "plain.example.com:80"))
    mark = len(net.origin_requests())
    recorded = len(proxy.wait_audit(0, kind="request", host="plain.example.com", status=200))
    result = client.curl("-x", f"http://{GATEWAY}:{EXPLICIT_PORT}", *FORGED, "http://plain.example.com/echo")
    assert result.returncode == 0, result.stderr
    assert origin_clients(net, mark) == [SQUID_V4]
    lines = squid_lines(squid, "CONNECT", "plain.example.com:80", before + 1)
    assert len(lines) == before + 1 and lines[-1][2] == "gateway" and lines[-1][6] == SANDBOX
    [seen] = net.origin_requests()[mark:]
    assert PASSWORD not in json.dumps(seen) and "sbx-corp" not in json.dumps(seen["headers"])
    records = proxy.wait_audit(recorded + 1, kind="request", host="plain.example.com", status=200)
    assert len(records) == recorded + 1 and records[-1]["via"] == squid.url


def test_a_tenant_s_proxy_carries_only_its_sandboxes_and_names_the_tenant_on_the_connect(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    """A list whose first proxy is for tenant acme (with the tenant header) and whose second, for
    everyone else, has a login squid refuses: a sandbox of acme leaves through the first, with
    its tenant on the CONNECT; the same sandbox as one of globex through the second (407)."""
    acme = UpstreamProxy(
        url=squid.url,
        credential="corp-proxy",
        identity_header=IDENTITY_HEADER,
        tenants=["acme"],
        tenant_header=TENANT_HEADER,
    )
    proxies = [acme, corp_proxy(squid, "corp-proxy-wrong")]
    try:
        for tenant, status in (("acme", "200"), ("globex", "407")):
            entry = SandboxEntry(
                sandbox_id=SANDBOX,
                address=CLIENT_ADDR,
                policy=POLICY,
                upstream_proxies=proxies,
                tenant=tenant,
            )
            proxy.control.put_sandbox(entry)
            before = len(squid_lines(squid, "CONNECT", "plain.example.com:80"))
            mark = len(net.origin_requests())
            answer = client.curl("-i", "http://plain.example.com/echo")
            assert answer.stdout.startswith("HTTP/1.1 200" if tenant == "acme" else "HTTP/1.1 502"), (
                answer.stdout
            )
            line = squid_lines(squid, "CONNECT", "plain.example.com:80", before + 1)[-1]
            assert line[5] == status and line[6] == SANDBOX
            assert line[7] == (tenant if tenant == "acme" else "-")  # the header of acme's proxy only
            assert origin_clients(net, mark) == ([SQUID_V4] if tenant == "acme" else [])
            if tenant == "acme":
                [seen] = net.origin_requests()[mark:]
                assert TENANT_HEADER.lower() not in seen["headers"]  # never inside the tunnel
    finally:
        proxy.control.put_sandbox(SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=POLICY))


def test_the_upstream_password_is_nowhere_but_the_vault(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    assert client.curl("--cacert", str(proxy.ca_cert), "https://api.example.com/echo").returncode == 0
    for path in proxy.config.state_dir.rglob("*"):  # config, audit, log, CA, sockets
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path
    assert PASSWORD.encode() not in Path(f"/proc/{proxy.process.pid}/cmdline").read_bytes()
    assert PASSWORD.encode() not in Path(f"/proc/{proxy.process.pid}/environ").read_bytes()
    echoed = client.curl("--cacert", str(proxy.ca_cert), "https://api.example.com/echo")
    assert PASSWORD not in echoed.stdout and "gateway" not in json.loads(echoed.stdout)["headers"].values()
    assert PASSWORD not in (squid.work / "access.log").read_text()


def test_a_refusing_upstream_is_a_502_naming_it_never_a_direct_dial(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    """The sandbox's own upstream (the tenant seam) with a login squid refuses (407)."""
    wrong = SandboxEntry(
        sandbox_id=SANDBOX,
        address=CLIENT_ADDR,
        policy=POLICY,
        upstream_proxies=[corp_proxy(squid, "corp-proxy-wrong")],
    )
    proxy.control.put_sandbox(wrong)
    try:
        mark = len(net.origin_requests())
        plain = client.curl("-i", "http://plain.example.com/")
        assert plain.returncode == 0, plain.stderr
        assert plain.stdout.startswith("HTTP/1.1 502"), plain.stdout
        assert f"{SQUID_V4}:3128" in plain.stdout and "407" in plain.stdout
        passed = client.curl("--cacert", str(net.ca_cert), "https://pass.example.com/")
        assert passed.returncode != 0  # the pass-through is closed
        assert net.origin_requests()[mark:] == []
        records = proxy.wait_audit(
            1, kind="connection", host="pass.example.com", event="closed", reason="upstream-error"
        )
        assert "refused the CONNECT to pass.example.com:443: 407" in records[-1]["detail"]
        assert squid_lines(squid, "CONNECT", "plain.example.com:80")[-1][5] == "407"
    finally:
        proxy.control.put_sandbox(SandboxEntry(sandbox_id=SANDBOX, address=CLIENT_ADDR, policy=POLICY))


def test_a_stopped_upstream_fails_clearly_and_nothing_goes_direct(
    proxy: RunningProxy, client: Client, net: Internet, squid: Squid
) -> None:
    squid.stop()
    mark = len(net.origin_requests())
    plain = client.curl("-i", "http://plain.example.com/")
    assert plain.stdout.startswith("HTTP/1.1 502"), plain.stdout
    assert squid.url.removeprefix("http://") in plain.stdout
    intercepted = client.curl("-i", "--cacert", str(proxy.ca_cert), "https://api.example.com/echo")
    assert intercepted.stdout.split()[1] == "502", intercepted.stdout  # HTTP/2 here
    assert f"upstream proxy {squid.url} is unreachable" in intercepted.stdout
    passed = client.curl("--cacert", str(net.ca_cert), "https://pass.example.com/")
    assert passed.returncode != 0
    # the explicit listener's paths: an absolute-form request, a CONNECT passed through
    explicit = ("-x", f"http://{GATEWAY}:{EXPLICIT_PORT}")
    absolute = client.curl("-i", *explicit, "http://plain.example.com/")
    assert absolute.stdout.startswith("HTTP/1.1 502") and squid.url in absolute.stdout, absolute.stdout
    tunnelled = client.curl(*explicit, "--cacert", str(net.ca_cert), "https://pass.example.com/")
    assert tunnelled.returncode != 0 and "hello from origin" not in tunnelled.stdout
    assert net.origin_requests()[mark:] == [], "a request went direct"
    assert HOST_V4 not in origin_clients(net, 0)  # nothing ever came from the gateway itself
    failed = proxy.wait_audit(1, kind="request", host="api.example.com", status=None, event=None)
    assert failed[-1]["via"] == squid.url
    assert failed[-1]["detail"].startswith(f"through upstream proxy {squid.url}: ")
    closed = proxy.wait_audit(
        1, kind="connection", host="pass.example.com", event="closed", reason="upstream-error"
    )
    assert "is unreachable" in closed[-1]["detail"]

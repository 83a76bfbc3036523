"""The company's proxy end to end: `sandgate serve` with `SANDGATE_UPSTREAM_PROXIES` naming a real
squid behind basic auth (tests/support/squid.py), its login put with `sandgate vault put` after
the server started. A sandbox's pass-through HTTPS, intercepted HTTPS and plain HTTP leave through
squid (its access log: the CONNECT targets, the login's user, the sandbox's id; the origins' log:
squid's address only), and the password is in no file of the state dir, the server's log or
anything the sandbox printed."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.conftest import set_policy, upstream
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SANDGATE, SandgateServer, sandgate_server
from tests.support.squid import IDENTITY_HEADER, SQUID_V4, TENANT_HEADER, Squid, start_squid

pytestmark = pytest.mark.root

PASSWORD = "corp-" + secrets.token_hex(8)
HOSTS = ("pass.example.com", "seen.example.com", "plain.example.com")


@pytest.fixture(scope="module")
def squid(internet: Internet) -> Iterator[Squid]:
    internet.set_names({name: [ORIGIN_V4] for name in HOSTS} | {"api.example.com": [ORIGIN_V4]})
    with start_squid(internet, "gateway", PASSWORD) as running:
        yield running


@pytest.fixture(scope="module")
def chained(
    tmp_path_factory: pytest.TempPathFactory, internet: Internet, squid: Squid
) -> Iterator[SandgateServer]:
    proxies = [
        {
            "url": squid.url,
            "credential": "corp-proxy",
            "identity_header": IDENTITY_HEADER,
            "tenant_header": TENANT_HEADER,
        }
    ]
    extra = {**upstream(internet), "SANDGATE_UPSTREAM_PROXIES": json.dumps(proxies)}
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate-chained")), extra) as running:
        env = {**running.env(), "SANDGATE_STATE_DIR": str(running.state_dir)}
        put = subprocess.run([*SANDGATE, "vault", "put", "corp-proxy"], env=env, input=f"gateway:{PASSWORD}",
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert put.returncode == 0, put.stderr
        yield running


def squid_connects(squid: Squid, target: str) -> list[list[str]]:
    """squid's CONNECT lines for `target`, waited for (squid logs a tunnel when it closes)."""
    deadline = time.monotonic() + 15
    while not (lines := [x for x in squid.access_log() if x[3] == "CONNECT" and x[4] == target]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return lines


def test_a_sandboxs_traffic_leaves_through_the_company_proxy(
    chained: SandgateServer, internet: Internet, squid: Squid
) -> None:
    sandbox_id = chained.create_sandbox()["id"]
    egress = [
        {"action": "allow", "target": "pass.example.com"},
        {"action": "allow", "target": "seen.example.com", "inspect": "always"},
        {"action": "allow", "target": "plain.example.com"},
    ]
    set_policy(chained, sandbox_id, {"version": 1, "defaultAction": "deny", "egress": egress})
    mark = len(internet.origin_requests())
    printed = ""
    for command in (
        "curl -sS -k --max-time 20 https://pass.example.com/",  # passed through: the origin's certificate
        "curl -sS --max-time 20 https://seen.example.com/",  # intercepted: the proxy's CA, trusted inside
        "curl -sS --max-time 20 http://plain.example.com/",
    ):
        ran = chained.run(sandbox_id, command, timeout=90)
        assert ran.stdout.strip() == "hello from origin", f"{command}: {ran.stdout} {ran.stderr}"
        printed += ran.stdout + ran.stderr
    for target in ("pass.example.com:443", "seen.example.com:443", "plain.example.com:80"):
        [line] = squid_connects(squid, target)[-1:]
        assert line[2] == "gateway" and line[6] == sandbox_id and line[7] == "default", line
    clients = {str(r["client"]).rsplit(":", 1)[0] for r in internet.origin_requests()[mark:]}
    assert clients == {SQUID_V4}
    assert PASSWORD not in printed and PASSWORD not in chained.log()
    for path in chained.state_dir.rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path

"""The non-default ECH settings on a real proxy: an ECH-carrying ClientHello (OpenSSL's hello with
a GREASE encrypted_client_hello added, as browsers send it; tests/adversarial/attacks.py) to a
pass-through host. With `ech = "intercept"` the proxy answers the handshake itself and no
connection reaches the origin (lazy upstream: nothing is dialled before a request); with
`ech = "passthrough"` the hello is relayed to the origin, which answers it. The origin's side is
an nft SYN counter in the test internet's namespace. The default (`refuse`) is proven from a real
sandbox in tests/adversarial/test_clienthello.py."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, EXPLICIT_PORT, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.witness import origin_syns

pytestmark = pytest.mark.root

ATTACKS = Path(__file__).parents[1] / "adversarial" / "attacks.py"
HOST = "open.example.com"
POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": HOST}]}


@pytest.fixture(scope="module", params=["intercept", "passthrough"])
def proxy(
    request: pytest.FixtureRequest, net: Internet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    net.set_names({HOST: [ORIGIN_V4]})
    entry = SandboxEntry(sandbox_id="sbx-ech", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [entry], ech=request.param)
    try:
        yield running
    finally:
        stop_proxy(running)


def hello(client: Client, edit: str, connect: bool = False) -> str:
    """The reply to one hello, sent transparently to the origin's address or inside a CONNECT."""
    target = {"host": HOST, "connect_port": EXPLICIT_PORT} if connect else {"host": ORIGIN_V4}
    arguments = json.dumps({**target, "port": 443, "sni": HOST, "edit": edit})
    result = client.run([sys.executable, str(ATTACKS), "clienthello", arguments])
    assert result.returncode == 0, result.stderr
    reply: str = json.loads(result.stdout.splitlines()[-1])["reply"]
    return reply


def test_an_ech_hello_is_intercepted_or_relayed_as_set(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    mode = proxy.config.ech
    with origin_syns(net.netns_name) as syns:
        assert hello(client, "none") == "server_hello"  # the control: passed through to the origin
        after_control = syns.count()
        assert after_control >= 1  # (more than one only if a SYN was retransmitted)
        assert hello(client, "ech") == "server_hello"  # answered, by the proxy or by the origin
        assert (syns.count() > after_control) == (mode == "passthrough")
        after_transparent = syns.count()
        assert hello(client, "ech", connect=True) == "server_hello"  # the same inside a CONNECT
        assert (syns.count() > after_transparent) == (mode == "passthrough")
    records = proxy.wait_audit(3, kind="connection")
    ech = [r for r in records if (r.get("detail") or "").startswith("encrypted_client_hello")]
    assert ech and all(r["decision"] == "allow" and r["sni"] == HOST for r in ech), records
    tunnel = [r for r in records if r.get("method") == "CONNECT"][-1]["client"]
    inside_connect = [r for r in ech if r["client"] == tunnel]  # the hello inside the CONNECT
    assert inside_connect and len(ech) > len(inside_connect), records  # and the transparent one
    for record in ech:
        if mode == "intercept":
            assert record["inspect"] is True
            assert record["detail"].endswith("intercepted, the proxy's TLS takes no ECH (ech=intercept)")
        else:
            assert record["detail"].endswith("passed through, judged by the outer name (ech=passthrough)")

"""Slowloris: a connection that never finishes its request headers is closed after
`header_timeout` (here 1 s) and recorded; complete requests are not affected."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sandgate.proxy import SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

HEADER_TIMEOUT = 1.0
POLICY = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "plain.example.com"}]}

# Dribble one header byte every 0.2 s (or send nothing) for at most 6 s; report when (and
# whether) the proxy closed. HOST, PORT and HOW are prepended.
DRIBBLE = """
import json, socket, time
sock = socket.create_connection((HOST, PORT), timeout=1)
start = time.monotonic()
closed = None
sock.sendall(b"GET / HTTP/1.1\\r\\nHost: plain.example.com\\r\\n" if HOW == "dribble" else b"")
while time.monotonic() - start < 6:
    try:
        if HOW == "dribble":
            sock.sendall(b"X")
        sock.settimeout(0.2)
        if sock.recv(4096) == b"":
            closed = time.monotonic() - start
            break
    except socket.timeout:
        continue
    except OSError:
        closed = time.monotonic() - start
        break
print(json.dumps({"closed_after": closed}))
"""


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({"plain.example.com": [ORIGIN_V4]})
    entry = SandboxEntry(sandbox_id="sbx-slow", address=CLIENT_ADDR, policy=POLICY)
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [entry], header_timeout=HEADER_TIMEOUT)
    try:
        yield running
    finally:
        stop_proxy(running)


@pytest.mark.parametrize(("port", "how"), [(80, "dribble"), (443, "silent")])
def test_unfinished_headers_are_closed_after_the_deadline(
    proxy: RunningProxy, client: Client, port: int, how: str
) -> None:
    result = client.python(f"HOST, PORT, HOW = {ORIGIN_V4!r}, {port}, {how!r}\n" + DRIBBLE)
    closed_after = json.loads(result.stdout)["closed_after"]
    assert closed_after is not None and HEADER_TIMEOUT * 0.8 <= closed_after < HEADER_TIMEOUT + 3, result
    events = proxy.wait_audit(1, kind="security_event", reason="header_timeout")
    assert events and events[-1]["sandbox"] == "sbx-slow" and events[-1]["event"] == "header_timeout"


def test_a_complete_request_is_not_cut(proxy: RunningProxy, client: Client) -> None:
    before = len(proxy.wait_audit(0, reason="header_timeout"))
    result = client.curl("-o", "/dev/null", "-w", "%{http_code}", "http://plain.example.com/bytes")
    assert result.stdout == "200", result
    slow_origin = client.python(
        "import socket, time\n"
        f"s = socket.create_connection(({ORIGIN_V4!r}, 80), timeout=5)\n"
        "s.sendall(b'GET / HTTP/1.1\\r\\nHost: plain.example.com\\r\\n\\r\\n')\n"
        "time.sleep(1.5)\n"  # past the deadline, after complete headers
        "print(s.recv(12).decode())\n"
    )
    assert slow_origin.stdout.startswith("HTTP/1.1 200"), slow_origin
    assert len(proxy.wait_audit(0, reason="header_timeout")) == before

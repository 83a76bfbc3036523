"""One proxy process (`workers: 1`, no pool) whose audit log cannot be written forwards nothing:
RLIMIT_FSIZE on the proxy at the file's size makes every write fail (EFBIG), as a full disk
would. The request is answered 503 with why, the origin's log stays empty, `/health` says why;
with the limit lifted the next request goes through with its write-ahead line and its whole
record under one id. (The pool's path: tests/adversarial/test_audit_under_crashes.py.)"""

from __future__ import annotations

import json
import resource
from collections.abc import Iterator

import pytest

from sandgate.proxy import INCOMPLETE, SandboxEntry
from tests.proxy.conftest import CLIENT_ADDR, Client, RunningProxy, start_proxy, stop_proxy
from tests.support.internet import ORIGIN_V4, Internet

pytestmark = pytest.mark.root

HOST = "plain.example.com"
ASK = ["--resolve", f"{HOST}:80:{ORIGIN_V4}", "-w", " status=%{http_code}", f"http://{HOST}/"]


@pytest.fixture(scope="module")
def proxy(net: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    net.set_names({HOST: [ORIGIN_V4]})
    policy = {"defaultAction": "deny", "egress": [{"action": "allow", "target": HOST}]}
    entry = SandboxEntry(sandbox_id="sbx-audit-full", address=CLIENT_ADDR, policy=policy)
    running = start_proxy(tmp_path_factory.mktemp("proxy"), net, [entry], workers=1)
    try:
        yield running
    finally:
        stop_proxy(running)


def test_an_unwritable_audit_log_forwards_nothing_and_says_why(
    proxy: RunningProxy, client: Client, net: Internet
) -> None:
    assert client.curl(*ASK).stdout.endswith("status=200")  # the path works, and the file exists
    mark = len(net.origin_requests())
    soft, hard = resource.prlimit(proxy.process.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(proxy.process.pid, resource.RLIMIT_FSIZE, (proxy.config.audit_path.stat().st_size, hard))
    try:
        refused = client.curl(*ASK)
        body, _, status = refused.stdout.rpartition(" status=")
        assert status == "503", refused
        answer = json.loads(body)
        assert answer["reason"] == "audit-unwritable" and "EFBIG" in answer["detail"], answer
        assert str(proxy.config.state_dir) not in body  # why, without the host's paths
        assert net.origin_requests()[mark:] == [], "the origin saw a request the audit never recorded"
        assert "EFBIG" in proxy.control.health()["audit"]
    finally:
        resource.prlimit(proxy.process.pid, resource.RLIMIT_FSIZE, (soft, hard))
    assert client.curl(*ASK).stdout.endswith("status=200")
    [seen] = net.origin_requests()[mark:]
    assert seen["path"] == "/"
    assert proxy.control.health()["audit"] == "ok"
    lines = [r for r in proxy.audit_lines() if r["kind"] == "request"]
    ahead, whole = lines[-2:]  # the one forwarded since: its write-ahead line, then its whole record
    assert (ahead["id"], ahead["event"], ahead["status"]) == (whole["id"], INCOMPLETE, None)
    assert (whole["event"], whole["status"]) == (None, 200)

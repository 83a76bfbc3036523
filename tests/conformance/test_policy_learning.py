"""Learning a policy from a real run: a sandbox runs a small workload under a report-mode policy
(HTTPS to an index and a file host, passed through, and plain HTTP to an API, which the proxy
sees request by request), `sandgate policy suggest` writes a policy from the audit log, and that
policy, applied in enforce mode, lets the same workload pass and refuses what it did not do: a
host, a method and a path it never used (proven by the origin's log)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conformance.conftest import API_HOST, PATCHED_HOST, curl_status, set_policy
from tests.support.cli import sandgate
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
INDEX, CDN, EXFIL = "index.learn.example.com", "files.learn.example.com", "exfil.learn.example.com"
REPORT = {"mode": "report", "defaultAction": "deny", "egress": []}


@pytest.fixture(scope="module")
def names(internet: Internet) -> Iterator[None]:
    internet.set_names({name: [ORIGIN_V4] for name in [API_HOST, PATCHED_HOST, INDEX, CDN, EXFIL]})
    yield
    internet.set_names({API_HOST: [ORIGIN_V4], PATCHED_HOST: [ORIGIN_V4]})


def workload(server: SandgateServer, sandbox_id: str, marker: str) -> list[str]:
    curl = "curl -sSk --max-time 15 -o /dev/null -w '%{http_code}\\n'"
    commands = [
        f"{curl} https://{INDEX}/echo/simple/{marker}/",
        f"{curl} https://{CDN}/echo/packages/{marker}.whl",
        f"{curl} -X POST http://{API_HOST}/echo/v1/{marker}",
    ]
    return server.run(sandbox_id, " ; ".join(commands), timeout=90).stdout.split()


def origin_count(internet: Internet, path: str) -> int:
    return sum(request["path"] == path for request in internet.origin_requests())


def test_a_suggested_policy_lets_the_run_pass_and_nothing_else(
    server: SandgateServer, internet: Internet, names: None, tmp_path: Path
) -> None:
    sandbox_id = server.create_sandbox()["id"]
    set_policy(server, sandbox_id, REPORT)
    assert workload(server, sandbox_id, "run") == ["200", "200", "200"]  # report mode: let through
    learned = tmp_path / "learned.yaml"
    suggest = ("policy", "suggest", "--sandbox", sandbox_id, "-o", str(learned))
    ran = sandgate("--state-dir", str(server.state_dir), *suggest)
    assert ran.returncode == 0, ran.stderr
    assert sandgate("policy", "check", str(learned)).returncode == 0, learned.read_text()
    set_policy(server, sandbox_id, {**yaml.safe_load(learned.read_text()), "mode": "enforce"})
    assert workload(server, sandbox_id, "run") == ["200", "200", "200"], learned.read_text()
    for path in ("/echo/simple/run/", "/echo/packages/run.whl", "/echo/v1/run"):
        assert origin_count(internet, path) == 2, path  # both runs reached the origin
    never_seen = curl_status(server, sandbox_id, f"-k https://{EXFIL}/echo/out")
    assert never_seen in ("000", "403")  # a host never seen
    assert (
        curl_status(server, sandbox_id, f"-X DELETE http://{API_HOST}/echo/v1/run") == "403"
    )  # a method never used
    assert (
        curl_status(server, sandbox_id, f"-X POST http://{API_HOST}/echo/v1/other") == "403"
    )  # a path never used
    assert origin_count(internet, "/echo/out") == origin_count(internet, "/echo/v1/other") == 0

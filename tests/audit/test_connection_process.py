"""Which process made which request (issue 37): each connection and request record names the
process inside the sandbox that opened the connection, found by the proxy in the sandbox's own
network namespace (proxy/origin.py), never from anything the sandbox says.

Proven from the other side: two programs (curl and python) each print their own pid (the
sandbox's) before they connect, and the kernel's process records (exec_audit = "processes")
give the host pid of each exec; the request records must name those pids and executables. The
origin's log shows the requests arrived.
"""

from __future__ import annotations

import json
import os
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.lifecycle.audit import to_ocsf
from sandgate.proxy.origin import ProcessFinder, holder
from tests.support.audit import audit_records
from tests.support.internet import ORIGIN_V4, Internet, start_internet
from tests.support.ocsf import ocsf_errors
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root

API_HOST = "api.example.com"  # intercepted: request records
OPEN_HOST = "open.example.com"  # TLS passed through: connection records only
POLICY = {
    "version": 1,
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": API_HOST, "inspect": "always"},
        {"action": "allow", "target": OPEN_HOST},
    ],
}
# Each program writes its own pid (as the sandbox sees it) first, then connects: `exec` makes
# curl the shell whose pid was written.
CURL = f"sh -c 'echo $$ > /tmp/curl.pid; exec curl -sS --max-time 20 http://{API_HOST}/echo/curl'"
PYTHON = (
    'python3 -c \'import os, urllib.request; open("/tmp/python.pid", "w").write(str(os.getpid())); '
    f'urllib.request.urlopen("http://{API_HOST}/echo/python", timeout=20).read()\''
)
# A program that says it is another: its argv[0] and its User-Agent claim curl.
DISGUISED = f"""
import urllib.request
request = urllib.request.Request("http://{API_HOST}/echo/disguised", headers={{"User-Agent": "curl/8"}})
urllib.request.urlopen(request, timeout=20).read()
"""
PASSTHROUGH = f"sh -c 'echo $$ > /tmp/tls.pid; exec curl -sSk --max-time 20 https://{OPEN_HOST}/'"


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with start_internet(tmp_path_factory.mktemp("internet")) as running:
        running.set_names({API_HOST: [ORIGIN_V4], OPEN_HOST: [ORIGIN_V4]})
        yield running


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-proxy", "two-workers"])
def server(
    tmp_path_factory: pytest.TempPathFactory, internet: Internet, request: pytest.FixtureRequest
) -> Iterator[SandgateServer]:
    extra = {
        **internet.upstream_settings(),
        "SANDGATE_PROXY_WORKERS": request.param,  # each worker looks up its own connections
        "SANDGATE_EXEC_AUDIT": "processes",
        "SANDGATE_PROCESS_EVENTS_NETNS": os.environ["SANDGATE_TEST_HOST_NETNS"],
    }
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate")), extra) as running:
        yield running


@pytest.fixture(scope="module")
def sandbox(server: SandgateServer) -> str:
    sandbox_id = str(server.create_sandbox()["id"])
    with server.client() as client:
        put = client.put(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy", json={"policy": POLICY})
        assert put.status_code == 200, put.text
    return sandbox_id


def wait_for(server: SandgateServer, sandbox: str, match: Any, what: str) -> dict[str, Any]:
    for _ in range(300):  # bounded: 30 s
        found = [r for r in audit_records(server.state_dir, sandbox) if match(r)]
        if found:
            return found[-1]
        threading.Event().wait(0.1)
    raise AssertionError(f"no record of {what}")


def request_to(server: SandgateServer, sandbox: str, path: str) -> dict[str, Any]:
    """The whole record (not the write-ahead line) of the sandbox's request to `path`."""
    return wait_for(
        server,
        sandbox,
        lambda r: r["kind"] == "request" and r["path"] == path and r.get("event") is None,
        f"the request to {path}",
    )


def exec_of(server: SandgateServer, sandbox: str, sandbox_pid: int, program: str) -> dict[str, Any]:
    """The kernel's record of the exec of `program` by the process the sandbox calls `sandbox_pid`."""
    facts = wait_for(
        server,
        sandbox,
        lambda r: (
            r["kind"] == "process"
            and json.loads(r["detail"]).get("sandbox_pid") == sandbox_pid
            and program in json.loads(r["detail"]).get("exe", "").rsplit("/", 1)[-1]
        ),
        f"the exec of {program} as pid {sandbox_pid}",
    )
    return json.loads(facts["detail"])


def pid_file(server: SandgateServer, sandbox: str, name: str) -> int:
    return int(server.run(sandbox, f"cat /tmp/{name}.pid").stdout.strip())


def test_each_request_names_the_program_that_made_it(
    server: SandgateServer, sandbox: str, internet: Internet
) -> None:
    for command in (CURL, PYTHON):
        assert server.run(sandbox, command).exit_code == 0
    paths = {str(r["path"]) for r in internet.origin_requests()}
    assert {"/echo/curl", "/echo/python"} <= paths  # they went out
    for name, path, program in (("curl", "/echo/curl", "curl"), ("python", "/echo/python", "python3")):
        sandbox_pid = pid_file(server, sandbox, name)
        launched = exec_of(server, sandbox, sandbox_pid, program)
        record = request_to(server, sandbox, path)
        process = record["process"]
        assert process["sandbox_pid"] == sandbox_pid, (process, launched)
        assert process["pid"] == launched["pid"], (process, launched)
        assert process["exe"] == launched["exe"] and program in process["exe"].rsplit("/", 1)[-1]
        assert process.get("unknown") is None


def test_a_program_that_claims_to_be_another_is_named_by_what_it_is(
    server: SandgateServer, sandbox: str
) -> None:
    server.run(sandbox, f"printf '%s' {shlex.quote(DISGUISED)} > /tmp/disguised.py")
    disguised = "bash -c 'echo $$ > /tmp/disguised.pid; exec -a curl python3 /tmp/disguised.py'"
    assert server.run(sandbox, disguised).exit_code == 0
    sandbox_pid = pid_file(server, sandbox, "disguised")
    process = request_to(server, sandbox, "/echo/disguised")["process"]
    assert process["sandbox_pid"] == sandbox_pid
    assert process["exe"].rsplit("/", 1)[-1].startswith("python3"), process


def test_a_sandbox_without_a_netns_is_not_looked_up() -> None:
    """No netns in its entry: exec_audit is not 'processes', or gVisor (rule 3 of origin.py)."""
    finder = ProcessFinder()
    finder.start(("10.0.0.2", 40000), ("192.0.2.1", 443), None, [])
    assert finder.of(("10.0.0.2", 40000)) is None


def test_a_lookup_past_its_deadline_gives_up() -> None:
    """A sandbox with a flood of processes or open files cannot hold a lookup thread: the scan
    stops at its deadline (this process's own netns holds this test's open files)."""
    with pytest.raises(TimeoutError):
        holder(Path("/proc/self/ns/net"), 1, time.monotonic() - 1)


def test_a_passed_through_connection_names_its_program(server: SandgateServer, sandbox: str) -> None:
    server.run(sandbox, PASSTHROUGH)
    sandbox_pid = pid_file(server, sandbox, "tls")
    launched = exec_of(server, sandbox, sandbox_pid, "curl")
    closing = wait_for(
        server,
        sandbox,
        lambda r: r["kind"] == "connection" and r.get("sni") == OPEN_HOST and r.get("event") == "closed",
        "the pass-through connection's end",
    )
    assert closing["process"]["pid"] == launched["pid"] and closing["process"]["exe"].endswith("/curl")


def test_ocsf_names_the_process_as_the_actor(server: SandgateServer, sandbox: str) -> None:
    record = request_to(server, sandbox, "/echo/curl")
    event = to_ocsf({k: v for k, v in record.items() if k != "prev"})
    assert ocsf_errors(event) == [], event
    assert event["actor"]["process"]["pid"] == record["process"]["pid"]
    assert event["actor"]["process"]["file"]["path"] == record["process"]["exe"]


def test_the_console_links_a_request_to_its_process(server: SandgateServer, sandbox: str) -> None:
    record = request_to(server, sandbox, "/echo/python")
    pid = record["process"]["pid"]
    link = f"/console/sandboxes/{sandbox}/processes/{pid}"
    with server.client() as client:
        for _ in range(100):  # the index takes the lines in about every 0.25 s
            api = client.get("/v1/audit", params={"sandbox": sandbox, "kind": "request", "limit": 50})
            if any(r["id"] == record["id"] and r.get("process") for r in api.json()["records"]):
                break
            threading.Event().wait(0.1)
        client.post("/console/login", data={"key": server.api_key})
        timeline = client.get(f"/console/sandboxes/{sandbox}")
        page = client.get(link)
    indexed = next(r for r in api.json()["records"] if r["id"] == record["id"])
    assert indexed["process"] == record["process"]
    assert timeline.status_code == 200 and f'href="{link}"' in timeline.text
    # The process's page: the kernel's exec of python (its argv) and the request it made.
    assert page.status_code == 200 and "/echo/python" in page.text and "urllib.request" in page.text
    assert "/echo/curl" not in page.text

"""The audit as a write-ahead log, proven from the origin's side: SIGKILL of one proxy worker, and
of the whole proxy, during a burst of credentialed requests from inside the sandbox, and every
request the origin saw (with the credential injected) has its audit record, marked
`incomplete` where its response never ended; and an audit log the proxy cannot write means
nothing is forwarded, with a refusal that says why.

Processes are found and killed by PID (the server's proxy child, its template, the workers),
never by name. Every wait is for an event (the origin's log, the process table, the kernel's
socket table), bounded in time; none is a fixed sleep."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.proxy import INCOMPLETE
from tests.adversarial.conftest import BOUND_HOST, TEST_RUNTIME, Attacker, EgressProxy
from tests.adversarial.test_resilience import proxy_pid
from tests.support.internet import ORIGIN_V4, ORIGIN_V6

pytestmark = pytest.mark.root

STOP_FILE = "/workspace/burst.stop"
# An SSE stream of about 3 s keeps responses open when the kill lands; /echo and / are quick.
BURST = {"paths": ["/sse?n=30&gap=0.1", "/echo", "/"], "clients": 4, "stop_file": STOP_FILE}
WAIT = 40.0  # seconds any one event may take on a loaded machine


def children(pid: int) -> list[int]:
    found: list[int] = []
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.exists():
        return found
    for task in tasks.iterdir():
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def worker_pids(pool: int) -> list[int]:
    """The pool's workers: the children of its one child, the worker template."""
    return [worker for template in children(pool) for worker in children(template)]


def wait_for(what: str, found: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        value = found()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {WAIT:g} s for {what}"
        time.sleep(0.05)


def upstream_connections(proxy: EgressProxy, pids: list[int]) -> set[tuple[int, str]]:
    """(pid, local address) of every connection a process among `pids` has open to the origin's
    HTTPS port, from the kernel's socket table (of the proxy's network namespace)."""
    ss = proxy.in_netns(["ss", "-Htnp", "state", "established"])
    table = subprocess.run(ss, capture_output=True, text=True).stdout
    origins = (f"{ORIGIN_V4}:443", f"[{ORIGIN_V6}]:443")
    found = set()
    for line in table.splitlines():
        fields = line.split()
        if any(origin in fields for origin in origins):
            for pid in map(int, re.findall(r"pid=(\d+)", line)):
                if pid in pids:
                    found.add((pid, fields[2]))
    return found


def owner_of_a_held_response(proxy: EgressProxy, pids: list[int]) -> int:
    """A process among `pids` with one connection to the origin open across two looks 0.3 s apart:
    a response in mid-stream (an SSE stream lasts about 3 s), so a kill now cuts it off."""
    earlier = upstream_connections(proxy, pids)
    deadline = time.monotonic() + WAIT
    while True:
        time.sleep(0.3)
        now = upstream_connections(proxy, pids)
        if held := earlier & now:
            return min(held)[0]
        assert time.monotonic() < deadline, f"no response held open at the origin for {WAIT:g} s"
        earlier = now


def credentialed_since(attacker: Attacker, mark: int) -> list[dict[str, Any]]:
    """What the origin got for the bound host with the credential injected, since `mark`."""
    return [
        request
        for request in attacker.origin_requests_since(mark)
        if request["headers"].get("host") == BOUND_HOST
        and str(request["headers"].get("authorization", "")).startswith("Bearer ")
    ]


def request_records(attacker: Attacker, before: set[str]) -> dict[str, dict[str, Any]]:
    """This sandbox's request records written since `before` (ids then known), one per id: the
    whole line where there is one, else the write-ahead line."""
    merged: dict[str, dict[str, Any]] = {}
    for record in attacker.audit():
        if record["sandbox"] != attacker.sandbox.id or record["kind"] != "request" or record["id"] in before:
            continue
        if merged.get(record["id"], {}).get("event", INCOMPLETE) == INCOMPLETE:
            merged[record["id"]] = record
    return merged


class Burst:
    """The burst, run inside the sandbox in a thread of the test until `stop`."""

    def __init__(self, attacker: Attacker) -> None:
        self.attacker = attacker
        self.outcome: dict[str, Any] = {}
        attacker.sh(f"rm -f {STOP_FILE}")
        self.mark = len(attacker.internet.origin_requests())
        self.before = {record["id"] for record in attacker.audit()}
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.outcome.update(self.attacker.attack("burst", address=ORIGIN_V4, sni=BOUND_HOST, **BURST))

    def seen(self) -> list[dict[str, Any]]:
        return credentialed_since(self.attacker, self.mark)

    def stop(self) -> None:
        self.attacker.sandbox.files.write_file(STOP_FILE, "stop")
        self.thread.join(90)
        assert not self.thread.is_alive(), "the burst did not stop"


@pytest.fixture
def burst(attacker: Attacker) -> Iterator[Burst]:
    running = Burst(attacker)
    try:
        yield running
    finally:
        if running.thread.is_alive():
            running.stop()


def assert_every_request_seen_has_its_record(burst: Burst) -> None:
    """Waits (bounded) for the records: a node's arrive in the server's log through the shipper."""
    seen = burst.seen()
    at_origin = Counter(str(request["path"]).partition("?")[0] for request in seen)
    deadline = time.monotonic() + WAIT
    while True:
        records = request_records(burst.attacker, burst.before)
        recorded = Counter(
            str(record["path"]).partition("?")[0]
            for record in records.values()
            if record["decision"] == "allow" and record["binding"] == "api" and record["host"] == BOUND_HOST
        )
        missing = at_origin - recorded
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not missing, f"the origin saw these credentialed requests with no audit record: {missing}"
    cut_off = [record for record in records.values() if record.get("event") == INCOMPLETE]
    assert cut_off, "a response cut off by the kill has a record marked incomplete"
    assert all(record["status"] is None and record["binding"] == "api" for record in cut_off), cut_off


@pytest.mark.skipif(
    TEST_RUNTIME == "kubernetes",
    reason="a node's proxy is one process (its memory vault is fed to one: proxy/workers.py), with "
    "no worker to kill apart from it; the whole-proxy kill is the case there",
)
def test_a_worker_killed_mid_burst_leaves_a_record_for_every_request_the_origin_saw(
    attacker: Attacker, burst: Burst, egress_proxy: EgressProxy
) -> None:
    pool = proxy_pid(egress_proxy.parent)
    workers = wait_for("two workers", lambda: len(worker_pids(pool)) >= 2 and worker_pids(pool))
    wait_for("the burst at the origin", lambda: len(burst.seen()) >= 3)
    victim = owner_of_a_held_response(egress_proxy, workers)
    os.kill(victim, signal.SIGKILL)  # by PID: a worker of this server's pool
    wait_for(
        "the killed worker replaced",
        lambda: victim not in (now := worker_pids(pool)) and len(now) >= 2,
    )
    after_kill = len(burst.seen())
    wait_for("the burst going on after the restart", lambda: len(burst.seen()) >= after_kill + 3)
    burst.stop()
    assert proxy_pid(egress_proxy.parent) == pool, "the pool itself stayed up"
    assert_every_request_seen_has_its_record(burst)


def test_the_whole_proxy_killed_mid_burst_leaves_a_record_for_every_request_the_origin_saw(
    attacker: Attacker, burst: Burst, egress_proxy: EgressProxy
) -> None:
    parent = egress_proxy.parent
    pool = proxy_pid(parent)
    wait_for("the burst at the origin", lambda: len(burst.seen()) >= 3)
    owner_of_a_held_response(egress_proxy, worker_pids(pool) or [pool])  # a node's serves alone
    os.kill(pool, signal.SIGKILL)  # the pool; its template and workers die with it (PDEATHSIG)
    wait_for("the proxy restarted", lambda: _other_proxy(parent, pool))
    after_kill = len(burst.seen())
    wait_for("the burst going on after the restart", lambda: len(burst.seen()) >= after_kill + 3)
    burst.stop()
    assert_every_request_seen_has_its_record(burst)


def _other_proxy(parent: int, old: int) -> bool:
    try:
        return proxy_pid(parent) != old
    except AssertionError:  # between the death and the restart there is none
        return False


def test_an_unwritable_audit_log_forwards_nothing_and_says_why(
    attacker: Attacker, egress_proxy: EgressProxy
) -> None:
    """RLIMIT_FSIZE on the proxy's audit writer at the file's size: every write fails (EFBIG), as
    on a full disk. A credentialed request is refused with 503 and why, the origin sees nothing,
    DNS answers SERVFAIL; once the limit is lifted, the next request goes through, recorded."""
    writer = proxy_pid(egress_proxy.parent)  # the pool (or a node's proxy): the one writer of audit.jsonl
    live = egress_proxy.state_dir / "audit.jsonl"
    mark = len(attacker.internet.origin_requests())
    pin = f"--resolve {BOUND_HOST}:443:{ORIGIN_V4}"  # no DNS: the request itself meets the audit
    ask = f"-w ' status=%{{http_code}}' {pin} https://{BOUND_HOST}/echo"
    soft, hard = resource.prlimit(writer, resource.RLIMIT_FSIZE)
    resource.prlimit(writer, resource.RLIMIT_FSIZE, (live.stat().st_size, hard))
    try:
        refused = attacker.curl(ask)
        body, _, code = refused.stdout.rpartition(" status=")
        assert code == "503", refused
        assert "audit" in body and "EFBIG" in body, body
        answer = attacker.attack("dns", name=BOUND_HOST, qtype="A")
        assert answer["answered"] and answer["rcode"] == 2, answer  # SERVFAIL
        assert credentialed_since(attacker, mark) == []
        assert attacker.internet.origin_requests()[mark:] == [], "the origin saw a request"
    finally:
        resource.prlimit(writer, resource.RLIMIT_FSIZE, (soft, hard))
    answered = attacker.curl(ask)
    assert answered.stdout.rpartition(" status=")[2] == "200", answered
    [seen] = credentialed_since(attacker, mark)
    assert seen["path"] == "/echo"
    recorded = attacker.wait_audit(
        lambda r: r["kind"] == "request" and r["status"] == 200 and r["path"] == "/echo"
    )
    assert recorded

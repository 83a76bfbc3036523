"""Every program a sandbox runs, recorded from the kernel's process connector (exec_audit =
"processes"): a script run through execd starts children, and the audit file (read here as
written) has each one with its parent; a flood of processes is recorded or its loss is; a
sandbox that tries to reach the host's processes fails and the attempt is in the file."""

from __future__ import annotations

import json
import os
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgate.lifecycle.audit import to_ocsf
from sandgate.lifecycle.runtime.gvisor import find_runsc
from sandgate.proxy import verify_chain
from tests.support.audit import audit_records
from tests.support.ocsf import ocsf_errors
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root

SCRIPT = """
sh -c 'sleep 0.5; echo from-child > /tmp/proc-child.txt' &
cat /etc/hostname > /dev/null
wait
"""
# A process that ends within a millisecond or so of its exec (cat here, at times) may be gone
# before /proc is read: its record then has pid and parent (the kernel's) and says `gone`.


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandgateServer]:
    extra = {"SANDGATE_EXEC_AUDIT": "processes"}
    if "SANDGATE_TEST_HOST_NETNS" in os.environ:
        extra["SANDGATE_PROCESS_EVENTS_NETNS"] = os.environ["SANDGATE_TEST_HOST_NETNS"]
    with sandgate_server(Path(tmp_path_factory.mktemp("procs")), extra) as running:
        yield running


@pytest.fixture(scope="module")
def sandbox(server: SandgateServer) -> str:
    return str(server.create_sandbox()["id"])


@pytest.fixture(scope="module")
def gvisor_sandbox(server: SandgateServer) -> str:
    if find_runsc() is None:
        pytest.skip("runsc is not installed")
    return str(server.create_sandbox(extensions={"sandgate.isolation": "gvisor"})["id"])


@pytest.fixture(params=["standard", "gvisor"])
def any_sandbox(request: pytest.FixtureRequest, sandbox: str) -> str:
    """The standard sandbox (the kernel's process connector), then the gVisor one (gVisor's
    runtime monitoring)."""
    return sandbox if request.param == "standard" else str(request.getfixturevalue("gvisor_sandbox"))


def processes(server: SandgateServer, sandbox: str | None, wanted: int = 0) -> list[dict[str, Any]]:
    """The sandbox's process records (their facts), waiting (bounded) for `wanted` of them."""
    found: list[dict[str, Any]] = []
    for _ in range(100):
        found = [
            {**json.loads(r["detail"]), "record": r}
            for r in audit_records(server.state_dir)
            if r["kind"] == "process" and (sandbox is None or r["sandbox"] == sandbox)
        ]
        if len(found) >= wanted:
            break
        threading.Event().wait(0.1)
    return found


# The script, its child shell and that shell's sleep, by their command lines.
TREE = ("sh /tmp/script.sh", "sh -c sleep 0.5; echo from-child > /tmp/proc-child.txt", "sleep 0.5")


def run_script(
    server: SandgateServer, sandbox: str, wanted: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run SCRIPT through execd; its process records, and them by command line, once the tree of
    three generations (TREE) is there with each one's parent (`wanted` records more than before)."""
    wanted += len(processes(server, sandbox))
    server.run(sandbox, f"printf '%s' {shlex.quote(SCRIPT)} > /tmp/script.sh")  # a builtin: no exec
    server.run(sandbox, "sh /tmp/script.sh")
    seen = processes(server, sandbox, wanted)
    by_argv = {" ".join(p.get("argv", [])): p for p in seen}
    script, child_shell, sleep = (by_argv[argv] for argv in TREE)
    assert child_shell["ppid"] == script["pid"] and sleep["ppid"] == child_shell["pid"]
    return seen, by_argv


def test_each_program_is_recorded_with_its_parent(server: SandgateServer, sandbox: str) -> None:
    seen, by_argv = run_script(server, sandbox, 5)
    script, child_shell, sleep = (by_argv[argv] for argv in TREE)
    assert sleep["exe"].endswith("/sleep") and sleep["cwd"] and isinstance(sleep["sandbox_pid"], int)
    children = [p for p in seen if p["ppid"] == script["pid"] and p["pid"] != script["pid"]]
    assert len(children) == 2  # the child shell and cat, each exec'd once
    cat = next(p for p in children if p is not child_shell)
    assert cat.get("argv", ["cat", "/etc/hostname"]) == ["cat", "/etc/hostname"] and (
        "exe" in cat or "gone" in cat
    )
    assert all(p["record"]["client"] == "kernel" and p["record"]["method"] == "exec" for p in seen)
    # execd's bash -c exec'd the script in its own place: two execs of one pid, both with execd's
    # pid as the parent (the first read shows bash's command line, or sh's if it had moved on).
    same = [p for p in seen if p["pid"] == script["pid"]]
    assert len(same) == 2 and same[0]["ppid"] == same[1]["ppid"] == script["ppid"]
    assert same[0]["argv"] in (["/usr/bin/bash", "-c", "sh /tmp/script.sh"], ["sh", "/tmp/script.sh"])
    assert verify_chain(server.state_dir / "audit.jsonl").problems == []


def test_reaching_for_host_processes_fails_and_is_recorded(server: SandgateServer, any_sandbox: str) -> None:
    assert server.process is not None
    host_pids = (server.process.pid, server.proxy_pid())
    ptrace = "import ctypes, sys; sys.exit(ctypes.CDLL(None).ptrace(16, int(sys.argv[1]), 0, 0) == -1)"
    attempts = [f"/bin/kill -9 {pid}" for pid in host_pids] + [f"python3 -c '{ptrace}' {host_pids[0]}"]
    fake = f'{{"kind":"process","sandbox":"forged-{any_sandbox}"}}'
    for attempt in attempts:  # each in a shell that lives on a while, so /proc shows its argv
        assert server.run(any_sandbox, f'sh -c "{attempt}; s=\\$?; sleep 0.3; exit \\$s"').exit_code != 0
    # every place it can write, and the audit file's own path on the host (masked inside)
    targets = f"/tmp/audit.jsonl /dev/shm/audit.jsonl {server.state_dir}/audit.jsonl"
    write = f"echo '{fake}' | tee {targets} > /dev/null 2>&1; sleep 0.3; true"
    server.run(any_sandbox, write)  # (a last builtin: bash does not exec sleep in its own place)
    assert server.process.poll() is None and server.proxy_pid() == host_pids[1]  # both live on
    argvs = " | ".join(" ".join(p.get("argv", [])) for p in processes(server, any_sandbox))
    for attempt in [*attempts, "tee /tmp/audit.jsonl"]:
        assert attempt in argvs, (attempt, argvs)
    # The fake line is data inside records (the command's text), never a record of its own.
    assert all(not r["sandbox"].startswith("forged") for r in audit_records(server.state_dir))
    assert verify_chain(server.state_dir / "audit.jsonl").problems == []


def test_a_flood_of_processes_is_recorded_or_its_loss_is(server: SandgateServer, any_sandbox: str) -> None:
    count = 1500
    loop = f"i=0; while [ $i -lt {count} ]; do /bin/true; i=$((i+1)); done # flood"
    server.run(any_sandbox, loop, timeout=300)
    children: list[dict[str, Any]] = []
    lost: list[dict[str, Any]] = []
    for _ in range(300):  # bounded: the watcher may still be writing the flood's records
        seen = processes(server, any_sandbox)
        shell = next(p for p in seen if "# flood" in " ".join(p.get("argv", [])))
        children = [p for p in seen if p.get("ppid") == shell["pid"] and p["pid"] != shell["pid"]]
        lost = [p for p in processes(server, "-") if p["op"] == "events_lost"]
        if len(children) == count or lost:
            break
        threading.Event().wait(0.1)
    # Every exec is there (each with its parent; those gone before /proc was read say so), or
    # the kernel's (gVisor's) overflow is.
    assert len(children) == count or lost, (len(children), lost)
    assert all(p.get("exe", "/usr/bin/true").endswith("true") for p in children)


def test_ocsf_export_of_processes_passes_the_schema(server: SandgateServer, sandbox: str) -> None:
    server.run(sandbox, "sh -c 'sleep 0.3; true'")
    seen = processes(server, sandbox, 2)
    events = [to_ocsf({k: v for k, v in p["record"].items() if k != "prev"}) for p in seen[:200]]
    assert events and all(e["class_uid"] == 1007 for e in events)
    for event in events:
        assert ocsf_errors(event) == [], event
    launched = next(e for e in events if e["activity_name"] == "Launch" and "cmd_line" in e["process"])
    assert launched["process"]["parent_process"]["pid"] == launched["actor"]["process"]["pid"]


def test_a_gvisor_sandbox_s_programs_come_from_gvisor_s_runtime_monitoring(
    server: SandgateServer, gvisor_sandbox: str
) -> None:
    """On gVisor the host kernel sees only runsc: the records come from the Sentry's execve and
    clone events, sent to the server's sink (lifecycle/gvisor_events.py)."""
    seen, by_argv = run_script(server, gvisor_sandbox, 4)
    script, _child_shell, sleep = (by_argv[argv] for argv in TREE)
    assert by_argv["cat /etc/hostname"]["ppid"] == script["pid"]
    assert all(p.get("source") == "gvisor" and p["record"]["client"] == "kernel" for p in seen), seen
    assert sleep["exe"].endswith("/sleep") and sleep["cwd"]
    assert verify_chain(server.state_dir / "audit.jsonl").problems == []

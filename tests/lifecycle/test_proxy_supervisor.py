"""The supervisor counts the proxy as ready only once it listens on its ports: a proxy whose
port is taken must stop `sandgate serve` at start with the proxy's own error, not leave a server
whose proxy restarts forever (sandbox creates then failed with a bare ENOENT on the socket)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from sandgate.lifecycle.proxy_supervisor import ProxySupervisor, listening
from sandgate.lifecycle.wiring import answers
from sandgate.proxy import ProxyControl
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root


def test_listening_reads_tcp_and_udp_ports_of_a_process() -> None:
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        udp.bind(("127.0.0.1", 0))
        assert tcp.getsockname()[1] not in listening(os.getpid()).tcp  # bound is not listening
        tcp.listen()
        found = listening(os.getpid())
        assert tcp.getsockname()[1] in found.tcp and udp.getsockname()[1] in found.udp


def test_serve_refuses_to_start_when_the_proxy_port_is_taken(tmp_path: Path) -> None:
    server = SandgateServer(tmp_path / "state")
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("0.0.0.0", server.proxy_ports["TRANSPARENT"]))
        squatter.listen()
        try:
            with pytest.raises(RuntimeError) as failed:
                server.start()
        finally:
            server.stop()
            server.remove_leftovers()
    message = str(failed.value)
    assert "sandgate serve exited" in message
    assert "address already in use" in message and str(server.proxy_ports["TRANSPARENT"]) in message
    assert "Traceback" not in message  # one clear line from the proxy, passed on by serve


def test_sigterm_stops_serve_and_its_proxy_child(tmp_path: Path) -> None:
    server = SandgateServer(tmp_path / "state")
    try:
        server.start()
        proxy = server.proxy_pid()
        process = server.process
        assert process is not None
        server.stop()
        assert process.returncode == 0, server.log()
        assert not Path(f"/proc/{proxy}").exists(), "the proxy child outlived sandgate serve"
    finally:
        server.stop()
        server.remove_leftovers()


def allow(server: SandgateServer, sandbox_id: str, target: str) -> httpx.Response:
    with server.client() as client:
        return client.patch(
            f"/v1/sandboxes/{sandbox_id}/networkpolicy", json=[{"action": "allow", "target": target}]
        )


def wait_for_new_proxy(server: SandgateServer, old_pid: int, budget: float = 60.0) -> int:
    """The pid of the proxy that replaced `old_pid` once its socket answers (bounded wait)."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        with contextlib.suppress(LookupError):
            pid = server.proxy_pid()
            if pid != old_pid and answers(ProxyControl(server.state_dir / "proxy.sock")):
                return pid
        time.sleep(0.1)
    raise AssertionError(f"no new proxy with an answering socket within {budget}s:\n{server.log()}")


def test_a_lost_control_socket_restarts_the_proxy_and_policy_changes_work_again(tmp_path: Path) -> None:
    with sandgate_server(tmp_path) as server:
        sandbox_id = server.create_sandbox()["id"]
        sock = server.state_dir / "proxy.sock"
        first = server.proxy_pid()

        sock.unlink()  # deleted (e.g. a second server's start did this before the state dir lock)
        second = wait_for_new_proxy(server, first)
        assert allow(server, sandbox_id, "a.example.com").status_code == 200

        sock.unlink()  # replaced by a socket of another process
        with socket.socket(socket.AF_UNIX) as squatter:
            squatter.bind(str(sock))
            squatter.listen()
            third = wait_for_new_proxy(server, second)
        assert allow(server, sandbox_id, "b.example.com").status_code == 200
        with ProxyControl(sock) as control:
            (entry,) = control.list()
        assert entry.sandbox_id == sandbox_id  # re-pushed to the new proxy with its latest policy
        assert [rule.target for rule in entry.policy.egress][:2] == ["b.example.com", "a.example.com"]
        assert third != second and "control socket" in server.log()


FAKE_PROXY = """#!/bin/bash
# Stands in for `python -m sandgate.proxy`: every start is logged; the first is ready at once,
# later ones only after $SLOW seconds (a loaded machine importing mitmproxy).
echo $$ >> "$DIR/starts"
[ "$(wc -l < "$DIR/starts")" -gt 1 ] && sleep "$SLOW"
touch "$DIR/ready-$$"
exec sleep 600
"""


def test_a_restart_slower_than_the_start_timeout_is_fed_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted proxy that got ready after the start timeout ran on with no sandbox entries
    (only a successful start re-pushes them) and every sandbox was refused. Now the late child
    is ended and the next attempt waits twice as long, until one is ready and fed."""
    fake = tmp_path / "fake-proxy"
    fake.write_text(FAKE_PROXY)
    fake.chmod(0o755)
    monkeypatch.setenv("DIR", str(tmp_path))
    monkeypatch.setenv("SLOW", "2.5")
    fed: list[int | None] = []
    supervisor = ProxySupervisor(
        tmp_path / "proxy.json",
        is_healthy=lambda: (tmp_path / f"ready-{supervisor.pid}").exists(),
        on_ready=lambda: fed.append(supervisor.pid),
        log_path=tmp_path / "proxy.log",
        python=str(fake),
        start_timeout=1.0,
    )
    supervisor.start()
    try:
        first = supervisor.pid
        assert first is not None and fed == [first]
        os.kill(first, signal.SIGKILL)  # a crash: restarts take 2.5 s, the first timeout is 1 s
        deadline = time.monotonic() + 60
        while len(fed) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(fed) == 2 and fed[1] == supervisor.pid, fed  # a restart got ready and was fed
        starts = [int(pid) for pid in (tmp_path / "starts").read_text().split()]
        assert len(starts) >= 3  # at least one attempt was too slow at 1 s, a later one waited longer
        late = [pid for pid in starts if pid not in fed]
        assert late and not any(Path(f"/proc/{pid}").exists() for pid in late)  # none left unfed
    finally:
        supervisor.stop()

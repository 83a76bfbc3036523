"""The supervisor counts the proxy as ready only once it listens on its ports: a proxy whose
port is taken must stop `sandgate serve` at start with the proxy's own error, not leave a server
whose proxy restarts forever (sandbox creates then failed with a bare ENOENT on the socket)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sandgate.lifecycle.supervisor import listening
from tests.support.server import SandgateServer

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

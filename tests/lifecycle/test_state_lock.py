"""A second `sandgate serve` on a running server's state dir is refused with one line and
touches nothing of the running one: its control socket, nft table and database stay as they
were, and it still applies a policy change (before the lock, the second start deleted
proxy.sock and every later policy change answered 500)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import SANDGATE, SandgateServer, sandgate_server

pytestmark = pytest.mark.root


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SandgateServer]:
    with sandgate_server(tmp_path) as running:
        yield running


def nft_table(name: str) -> str:
    done = subprocess.run(["nft", "list", "table", "inet", name], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else f"(absent: {done.stderr.strip()})"


def footprint(server: SandgateServer) -> dict[str, object]:
    """What a second start must not change: the socket file, the nft table, the database files."""
    sock = (server.state_dir / "proxy.sock").stat()
    # Not sandgate.db-shm: the WAL index every reader maps and marks, so the running server's
    # own reads (its reaper, its key checks) move its mtime; a writer would change the others.
    files = [server.state_dir / name for name in ("sandgate.db", "sandgate.db-wal", "proxy.json")]
    return {
        "proxy.sock": (sock.st_ino, sock.st_mtime_ns),
        "nft": nft_table(server.nft_table),
        **{path.name: (path.stat().st_mtime_ns, path.stat().st_size) for path in files},
    }


def test_second_serve_on_the_same_state_dir_is_refused_and_touches_nothing(
    server: SandgateServer, tmp_path: Path
) -> None:
    sandbox_id = server.create_sandbox()["id"]
    before = footprint(server)
    # Its own API port, proxy ports, nft table and veth prefix: only the state dir is shared, so
    # nothing but the lock can stop it before it rewrites proxy.json and takes the socket.
    second = SandgateServer(server.state_dir)
    second.log_path = tmp_path / "second.log"
    done = subprocess.run(
        [*SANDGATE, "serve"], env=second.server_env(), capture_output=True, text=True, timeout=120
    )
    assert server.process is not None
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        f"sandgate: already running, pid {server.process.pid} (state dir {server.state_dir})\n"
    )
    assert footprint(server) == before
    assert nft_table(second.nft_table).startswith("(absent")

    with server.client() as client:
        changed = client.patch(
            f"/v1/sandboxes/{sandbox_id}/networkpolicy",
            json=[{"action": "allow", "target": "api.example.com"}],
        )
        assert changed.status_code == 200, changed.text
        policy = client.get(f"/v1/sandboxes/{sandbox_id}/networkpolicy").json()
    assert [rule["target"] for rule in policy["policy"]["egress"]] == ["api.example.com"]
    assert os.path.exists(server.state_dir / "proxy.sock")


def alive(pid: int) -> bool:
    """Running (a killed orphan may linger as a zombie until PID 1 reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_start_after_a_sigkill_stops_the_orphaned_proxy_and_serves(tmp_path: Path) -> None:
    """A killed server's proxy child keeps the proxy ports; the next start on the state dir (it
    holds the lock, so that proxy is nobody's) stops it instead of failing on a taken port."""
    with sandgate_server(tmp_path) as server:
        sandbox_id = server.create_sandbox()["id"]
        orphan = server.proxy_pid()
        assert server.process is not None
        server.process.kill()
        server.process.wait()
        server.process = None
        assert alive(orphan)  # still running, holding the ports
        server.start()
        assert not alive(orphan) and server.proxy_pid() != orphan
        assert f"sandgate: stopped proxy pid {orphan}, left running by a server" in server.log()
        assert server.run(sandbox_id, "echo re-adopted").stdout == "re-adopted"

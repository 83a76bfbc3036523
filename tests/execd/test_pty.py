"""`/pty` sessions against a real execd: a real terminal driven over a real WebSocket client
(`websockets`), framed as the Go execd frames it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from .conftest import Execd
from .test_files import snapshot

STDIN, STDOUT, STDERR, REPLAY = b"\x00", 1, 2, 3


def ws_url(execd: Execd, session_id: str, query: str = "") -> str:
    return f"ws://{execd.endpoint}/pty/{session_id}/ws{query}"


def new_session(execd: Execd, **body: str) -> str:
    with execd.client() as client:
        response = client.post("/pty", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["session_id"]
    return session_id


def read_until(ws: ClientConnection, needle: bytes, channel: int = STDOUT, timeout: float = 15) -> bytes:
    """Output of `channel` until it contains `needle` (JSON frames are skipped)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        frame = ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
        if isinstance(frame, bytes) and frame[0] == channel:
            seen += frame[1:]
    return seen


def next_json(ws: ClientConnection, timeout: float = 15) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        frame = ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
        if isinstance(frame, str):
            data: dict[str, object] = json.loads(frame)
            return data


def test_shell_reads_a_line_and_sees_resize(execd: Execd, execd_root: Path) -> None:
    session_id = new_session(execd, cwd=str(execd_root))
    with connect(ws_url(execd, session_id)) as ws:
        assert next_json(ws) == {"type": "connected", "session_id": session_id, "mode": "pty"}
        ws.send(STDIN + b"tty; stty size; pwd\n")
        assert b"24 80" in read_until(ws, b"24 80")
        ws.send(json.dumps({"type": "resize", "cols": 132, "rows": 43}))
        ws.send(STDIN + b"stty size\n")
        read_until(ws, b"43 132")
        ws.send(STDIN + b'read -r line; echo "got:${line}:$((6*7))"\n')
        time.sleep(0.2)
        ws.send(json.dumps({"type": "stdin", "data": "typed text\n"}))
        read_until(ws, b"got:typed text:42")
        ws.send(json.dumps({"type": "ping"}))
        assert next_json(ws) == {"type": "pong"}
        ws.send(STDIN + b"exit 3\n")
        assert next_json(ws) == {"type": "exit", "exit_code": 3}
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
    with execd.client() as client:
        status = client.get(f"/pty/{session_id}").json()
    assert status["running"] is False and status["output_offset"] > 0


def test_sigint_interrupts_the_foreground_program(execd: Execd) -> None:
    session_id = new_session(execd)
    with connect(ws_url(execd, session_id)) as ws:
        next_json(ws)
        ws.send(STDIN + b"sleep 30; echo slept\n")
        time.sleep(0.3)
        ws.send(json.dumps({"type": "signal", "signal": "SIGINT"}))
        ws.send(STDIN + b"echo after-$((1+1))\n")
        assert b"\nslept\r\n" not in read_until(ws, b"after-2", timeout=10)  # only its echo


def test_reconnect_replays_and_takeover_evicts(execd: Execd) -> None:
    session_id = new_session(execd)
    with connect(ws_url(execd, session_id)) as first:
        next_json(first)
        first.send(STDIN + b"echo marker-$((3*5))\n")
        read_until(first, b"marker-15")
        with pytest.raises(InvalidStatus) as busy:
            connect(ws_url(execd, session_id))
        assert busy.value.response.status_code == 409
        with connect(ws_url(execd, session_id, "?takeover=1&since=0")) as second:
            replay = second.recv(timeout=10)
            assert isinstance(replay, bytes) and replay[0] == REPLAY
            assert int.from_bytes(replay[1:9], "big") == 0 and b"marker-15" in replay[9:]
            assert next_json(second)["type"] == "connected"
            with pytest.raises(ConnectionClosed) as evicted:
                while True:
                    first.recv(timeout=10)
            assert evicted.value.rcvd is not None and evicted.value.rcvd.code == 4001
            second.send(STDIN + b"echo still-$((2+2))\n")
            read_until(second, b"still-4")
    with execd.client() as client:
        offset = client.get(f"/pty/{session_id}").json()["output_offset"]
    with connect(ws_url(execd, session_id, f"?since={offset}")) as third:
        assert next_json(third)["type"] == "connected"  # nothing to replay: connected comes first
        assert execd.client().delete(f"/pty/{session_id}").status_code == 200
        assert next_json(third) == {"type": "exit", "exit_code": 137}
    assert execd.client().get(f"/pty/{session_id}").status_code == 404


def test_pipe_mode_keeps_stderr_apart(execd: Execd) -> None:
    session_id = new_session(execd, command='echo out; echo err >&2; read -r x; echo "in:$x"')
    with connect(ws_url(execd, session_id, "?pty=0")) as ws:
        assert next_json(ws)["mode"] == "pipe"
        read_until(ws, b"err", channel=STDERR)
        ws.send(STDIN + b"piped\n")
        read_until(ws, b"in:piped")
        assert next_json(ws) == {"type": "exit", "exit_code": 0}


def test_bad_frames_get_an_error_frame_and_the_shell_goes_on(execd: Execd) -> None:
    session_id = new_session(execd)
    with connect(ws_url(execd, session_id)) as ws:
        next_json(ws)
        for bad in ({"type": "dance"}, {"type": "resize", "cols": 0, "rows": 10}, {"type": "signal"}):
            ws.send(json.dumps(bad))
            error = next_json(ws)
            assert error["type"] == "error" and error["code"] == "INVALID_FRAME"
        ws.send(STDIN + b"echo alive-$((9*9))\n")
        read_until(ws, b"alive-81")
    execd.client().delete(f"/pty/{session_id}")


def test_bad_requests_are_4xx_and_change_nothing(execd: Execd, execd_root: Path) -> None:
    before = snapshot(execd_root)
    with execd.client() as client:
        missing_cwd = client.post("/pty", json={"cwd": str(execd_root / "no-such-dir")})
        not_json = client.post("/pty", content=b"{not json", headers={"content-type": "application/json"})
        wrong_type = client.post("/pty", json={"command": ["ls"]})
        unknown = client.get("/pty/nope")
        session_id = new_session(execd)
        plain_get = client.get(f"/pty/{session_id}/ws")
        bad_version = client.get(
            f"/pty/{session_id}/ws",
            headers={"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "8"},
        )
        status = client.get(f"/pty/{session_id}").json()
    for response in (missing_cwd, not_json, wrong_type, plain_get, bad_version):
        assert response.status_code == 400 and set(response.json()) == {"code", "message"}, response.text
    assert unknown.status_code == 404 and unknown.json()["code"] == "CONTEXT_NOT_FOUND"
    with pytest.raises(InvalidStatus) as gone:
        connect(ws_url(execd, "nope"))
    assert gone.value.response.status_code == 404
    assert status == {"session_id": session_id, "running": False, "output_offset": 0}
    assert snapshot(execd_root) == before
    assert httpx.get(f"{execd.url}/ping").status_code == 200


def test_oversize_message_closes_the_socket_and_the_session_stays(execd: Execd) -> None:
    session_id = new_session(execd)
    with connect(ws_url(execd, session_id)) as ws:
        next_json(ws)
        ws.send(STDIN + b"x" * (2 * 1024 * 1024))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    with connect(ws_url(execd, session_id)) as again:  # the shell is still there to attach to
        assert next_json(again)["type"] == "connected"
        again.send(STDIN + b"echo back-$((5*5))\n")
        read_until(again, b"back-25")
    execd.client().delete(f"/pty/{session_id}")

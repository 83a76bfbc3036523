"""HTTP details every client sees (reason phrases) and the `/v1/isolated` answers, against a real
execd: raw status lines, the SDKs' own calls, and refusals that change nothing."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from .conftest import Execd
from .test_files import snapshot


def status_line(execd: Execd, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", execd.port), timeout=10) as sock:
        sock.sendall(request)
        return sock.makefile("rb").readline()


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n"),
        (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404 Not Found\r\n"),
        (
            b"PUT /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 405 Method Not Allowed\r\n",
        ),
        (b"GET /files/info HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n"),
        (b"GET /ping HTTP/1.1\r\nno colon\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n"),
    ],
)
def test_status_line_has_its_reason_phrase(execd: Execd, request_bytes: bytes, expected: bytes) -> None:
    assert status_line(execd, request_bytes) == expected


def test_clients_print_the_reason(execd: Execd) -> None:
    with execd.client() as client:
        response = client.get("/files/info", params={"path": "/no/such/file"})
    with pytest.raises(httpx.HTTPStatusError, match="Client error '404 Not Found'"):
        response.raise_for_status()


def test_isolated_capabilities_say_not_available(execd: Execd) -> None:
    from opensandbox.api.execd import Client
    from opensandbox.api.execd.api.isolated_execution import isolated_capabilities

    caps = isolated_capabilities.sync(client=Client(base_url=execd.url))
    assert caps is not None and caps.available is False
    assert caps.setpriv_available is False and caps.userns_available is False
    assert caps.commit_supported is False and caps.diff_supported is False
    assert isinstance(caps.message, str) and "/command" in caps.message
    hardening = caps.hardening.to_dict()  # type: ignore[union-attr]
    seccomp_line = next(
        line
        for line in Path(f"/proc/{execd.process.pid}/status").read_text().splitlines()
        if line.startswith("Seccomp:")
    )
    assert hardening["seccomp"]["state"] == ("active" if seccomp_line.split()[1] == "2" else "disabled")
    assert hardening["init_mode"] == "none" and hardening["signal_shield"] is False


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/isolated/session"),
        ("GET", "/v1/isolated/sessions"),
        ("DELETE", "/v1/isolated/session/abc"),
        ("POST", "/v1/isolated/session/abc/run"),
        ("GET", "/v1/isolated/session/abc/runs/r1/logs"),
        ("POST", "/v1/isolated/session/abc/files/upload"),
        ("DELETE", "/v1/isolated/session/abc/directories"),
    ],
)
def test_isolated_sessions_are_503_and_change_nothing(
    execd: Execd, execd_root: Path, method: str, path: str
) -> None:
    before = snapshot(execd_root)
    with execd.client() as client:
        response = client.request(
            method, path, json={"workspace": {"path": str(execd_root)}, "code": "touch x"}
        )
    assert response.status_code == 503 and response.reason_phrase == "Service Unavailable"
    assert response.json()["code"] == "NOT_SUPPORTED" and "/v1/isolated" in response.json()["message"]
    assert snapshot(execd_root) == before

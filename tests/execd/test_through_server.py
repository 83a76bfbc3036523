"""The new execd routes inside a real sandbox, reached the way clients reach them once execd sits
behind the host: through a real `sandgate serve` and its reverse proxy
(`/v1/sandboxes/{id}/proxy/44772/...`). One server and one sandbox per isolation (standard,
and gvisor: code contexts, files and the PTY on gVisor's kernel)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.support.server import SandgateServer, sandgate_server

from .test_pty import STDIN, next_json, read_until

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=["standard", "gvisor"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SandgateServer]:
    extra = {"SANDGATE_ISOLATION": request.param}
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate")), extra) as running:
        yield running


@pytest.fixture(scope="module")
def execd_url(server: SandgateServer) -> str:
    sandbox = server.create_sandbox()
    return f"/v1/sandboxes/{sandbox['id']}/proxy/44772"


def events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(part) for part in response.text.split("\n\n") if part.strip()]


def test_isolated_capabilities_and_code_languages(server: SandgateServer, execd_url: str) -> None:
    with server.client() as client:
        caps = client.get(f"{execd_url}/v1/isolated/capabilities")
        assert caps.status_code == 200 and caps.json()["available"] is False
        refused = client.post(f"{execd_url}/v1/isolated/session", json={"workspace": {"path": "/tmp"}})
        assert refused.status_code == 503 and refused.json()["code"] == "NOT_SUPPORTED"
        for language, code in (("bash", "echo $((6*7))"), ("javascript", "console.log(6*7); 'js'")):
            run = client.post(f"{execd_url}/code", json={"context": {"language": language}, "code": code})
            seen = events(run)
            assert [e["text"] for e in seen if e["type"] == "stdout"] == ["42\n"], seen
            assert seen[-1]["type"] == "execution_complete"


def test_files_with_identity_in_the_sandbox(server: SandgateServer, execd_url: str) -> None:
    boundary = "sandgate-e2e"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="metadata"; filename="metadata"\r\n\r\n'
        '{"path": "/tmp/as-nobody.txt"}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\nhello\r\n'
        f"--{boundary}--\r\n"
    ).encode()
    with server.client() as client:
        upload = client.post(
            f"{execd_url}/v1/filesystem/65534/65534/files/upload",
            content=body,
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
        if server.server_env()["SANDGATE_ISOLATION"] == "gvisor":  # no setfsuid(2) in gVisor
            assert upload.status_code == 501 and "setfsuid" in upload.json()["message"], upload.text
            return
        assert upload.status_code == 200, upload.text
        info = client.get(f"{execd_url}/files/info", params={"path": "/tmp/as-nobody.txt"}).json()
        assert info["/tmp/as-nobody.txt"]["owner"] in ("nobody", "65534")
        bad = client.get(f"{execd_url}/v1/filesystem/x/0/files/info", params={"path": "/tmp"})
        assert bad.status_code == 400 and set(bad.json()) == {"code", "message"}


def test_pty_over_the_proxied_websocket(server: SandgateServer, execd_url: str) -> None:
    with server.client() as client:
        created = client.post(f"{execd_url}/pty", json={"cwd": "/tmp"})
    assert created.status_code == 201
    session_id = created.json()["session_id"]
    url = f"ws://{server.domain}{execd_url}/pty/{session_id}/ws"
    with connect(url, additional_headers={"OPEN-SANDBOX-API-KEY": server.api_key}) as ws:
        assert next_json(ws)["type"] == "connected"
        ws.send(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
        ws.send(STDIN + b"stty size; pwd\n")
        assert b"30 100\r\n" in read_until(ws, b"\n/tmp\r\n")
        ws.send(STDIN + b"exit 5\n")
        assert next_json(ws) == {"type": "exit", "exit_code": 5}

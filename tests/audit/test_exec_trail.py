"""The exec audit trail from a real sandbox: every execd call through the host's reverse proxy is
in the audit file (read here as written, not through the product's readers), with the digest of
what the test sent, the command's exit code, who called; written ahead, redacted, hash-chained."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from sandgate.lifecycle.audit import to_ocsf
from sandgate.proxy import verify_chain
from tests.support.audit import audit_records
from tests.support.ocsf import ocsf_errors
from tests.support.server import SANDGATE, SandgateServer, sandgate_server

from ..execd.test_pty import STDIN, next_json, read_until

pytestmark = pytest.mark.root

BOUNDARY = "sandgate-trail"
VAULT_SECRET = "trail-vault-secret-7f3a9c"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandgateServer]:
    with sandgate_server(Path(tmp_path_factory.mktemp("trail"))) as running:
        yield running


@pytest.fixture(scope="module")
def sandbox(server: SandgateServer) -> str:
    return str(server.create_sandbox()["id"])


def execd(sandbox: str) -> str:
    return f"/v1/sandboxes/{sandbox}/proxy/44772"


def lines_of(server: SandgateServer, record_id: str) -> list[dict[str, Any]]:
    """Every line of the live audit file with this id, in file order."""
    lines = (server.state_dir / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["id"] == record_id]


def exec_records(server: SandgateServer, sandbox: str, kind: str) -> list[dict[str, Any]]:
    return [
        {**r, "facts": json.loads(r["detail"])}
        for r in audit_records(server.state_dir, sandbox)
        if r["kind"] == kind
    ]


def upload(client: httpx.Client, sandbox: str, path: str, content: bytes) -> httpx.Response:
    body = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="metadata"; filename="metadata"\r\n\r\n'
            f'{{"path": "{path}"}}\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    return client.post(
        f"{execd(sandbox)}/files/upload",
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )


def test_commands_and_file_operations_are_in_the_file(server: SandgateServer, sandbox: str) -> None:
    content = os.urandom(300_000) + b"\n"  # several chunks through the proxy
    script = (
        b"#!/bin/sh\nsh -c 'echo child' > /tmp/trail/child.txt\ncat /tmp/trail/in.bin > /dev/null\nexit 3\n"
    )
    with server.client() as client:
        assert upload(client, sandbox, "/tmp/trail/in.bin", content).status_code == 200
        assert upload(client, sandbox, "/tmp/trail/run.sh", script).status_code == 200
        assert (
            client.post(
                f"{execd(sandbox)}/files/permissions", json={"/tmp/trail/run.sh": {"mode": 755}}
            ).status_code
            == 200
        )
        run = client.post(f"{execd(sandbox)}/command", json={"command": "./run.sh", "cwd": "/tmp/trail"})
        assert '"CommandExecError"' in run.text and '"3"' in run.text, run.text
        read = client.get(f"{execd(sandbox)}/files/download", params={"path": "/tmp/trail/child.txt"})
        assert read.content == b"child\n"
        moved = client.post(
            f"{execd(sandbox)}/files/mv", json=[{"src": "/tmp/trail/child.txt", "dest": "/tmp/trail/c2"}]
        )
        assert moved.status_code == 200, moved.text
        replaced = client.post(
            f"{execd(sandbox)}/files/replace", json={"/tmp/trail/c2": {"old": "child", "new": "grown"}}
        )
        assert replaced.status_code == 200, replaced.text
        assert (
            client.post(f"{execd(sandbox)}/directories", json={"/tmp/trail/d": {"mode": 700}}).status_code
            == 200
        )
        assert (
            client.delete(f"{execd(sandbox)}/directories", params={"path": "/tmp/trail/d"}).status_code == 200
        )
        assert client.delete(f"{execd(sandbox)}/files", params={"path": "/tmp/trail/c2"}).status_code == 200
        found = client.get(f"{execd(sandbox)}/files/search", params={"path": "/tmp/trail", "pattern": "*.sh"})
        assert found.status_code == 200
        background = client.post(
            f"{execd(sandbox)}/command", json={"command": "sleep 0.1", "background": True}
        )
        assert background.status_code == 200
        cell = client.post(
            f"{execd(sandbox)}/code", json={"context": {"language": "python"}, "code": "print(6*7)"}
        )
        assert "execution_complete" in cell.text, cell.text

    files = exec_records(server, sandbox, "file")
    ops = [r["facts"]["op"] for r in files]
    assert ops == [
        "write",
        "write",
        "chmod",
        "read",
        "move",
        "replace",
        "mkdir",
        "rmdir",
        "delete",
        "search",
    ], ops
    written = files[0]["facts"]["files"]
    assert written == [
        {"path": "/tmp/trail/in.bin", "sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
    ]
    assert files[0]["path"] == "/tmp/trail/in.bin" and files[0]["status"] == 200
    assert files[0]["bytes_out"] > len(content) and files[0]["facts"]["actor"] == "api-key"
    assert files[1]["facts"]["files"][0]["sha256"] == hashlib.sha256(script).hexdigest()
    assert files[3]["facts"]["read_sha256"] == hashlib.sha256(b"child\n").hexdigest()
    assert files[3]["bytes_in"] == len(b"child\n")
    assert files[4]["facts"]["moves"] == [{"src": "/tmp/trail/child.txt", "dest": "/tmp/trail/c2"}]
    assert files[5]["facts"]["files"][0]["new_sha256"] == hashlib.sha256(b"grown").hexdigest()
    assert files[9]["facts"]["pattern"] == "*.sh"

    commands = exec_records(server, sandbox, "command")
    by_op = {r["facts"]["op"]: r for r in commands}
    run_record = next(r for r in commands if r["facts"].get("command") == "./run.sh")
    assert run_record["facts"]["exit_code"] == 3 and run_record["facts"]["cwd"] == "/tmp/trail"
    assert run_record["duration_ms"] > 0 and run_record["bytes_in"] == len(run.content)
    bg = next(r for r in commands if r["facts"].get("command") == "sleep 0.1")
    assert bg["facts"]["background"] is True and bg["facts"]["run_id"]
    assert by_op["code"]["facts"]["code"] == "print(6*7)" and by_op["code"]["facts"]["exit_code"] == 0
    assert by_op["code"]["facts"]["code_sha256"] == hashlib.sha256(b"print(6*7)").hexdigest()

    # Each has its write-ahead line first, then the whole one, under one id.
    first, last = lines_of(server, run_record["id"])
    assert (
        first["event"] == "incomplete"
        and first["status"] is None
        and "exit_code" not in json.loads(first["detail"])
    )
    assert last["event"] is None and last["status"] == 200


@contextmanager
def audit_unwritable(server: SandgateServer) -> Iterator[None]:
    """While inside, no line can be appended to the live audit file (a directory in its place)."""
    live = server.state_dir / "audit.jsonl"
    aside = server.state_dir / "audit.aside"
    os.replace(live, aside)
    live.mkdir()
    try:
        yield
    finally:
        live.rmdir()
        os.replace(aside, live)


def exists_in(server: SandgateServer, sandbox: str, path: str) -> bool:
    return server.run(sandbox, f"test -e {path}").exit_code == 0


def test_a_call_that_cannot_be_recorded_is_not_forwarded(server: SandgateServer, sandbox: str) -> None:
    with audit_unwritable(server), server.client() as client:
        refused = client.post(f"{execd(sandbox)}/command", json={"command": "touch /tmp/was-run"})
    assert refused.status_code == 503 and refused.json()["code"] == "AUDIT_UNWRITABLE", refused.text
    with server.client() as client:
        check = client.post(f"{execd(sandbox)}/command", json={"command": "test -e /tmp/was-run; echo $?"})
    assert '"text":"1' in check.text, check.text  # execd never ran it


def test_write_ahead_line_is_there_while_the_command_runs(server: SandgateServer, sandbox: str) -> None:
    marker = f"long-running-{os.getpid()}"
    runner = threading.Thread(target=server.run, args=(sandbox, f"sleep 3 # {marker}"))
    runner.start()
    try:
        pending = None
        for _ in range(200):  # bounded wait for the line
            text = (server.state_dir / "audit.jsonl").read_text()
            pending = next((json.loads(line) for line in text.splitlines() if marker in line), None)
            if pending:
                break
            threading.Event().wait(0.05)
        assert pending is not None and pending["event"] == "incomplete", pending
        assert runner.is_alive()  # the line was there before the command ended
    finally:
        runner.join(60)
    record = next(
        r for r in exec_records(server, sandbox, "command") if marker in r["facts"].get("command", "")
    )
    assert record["event"] is None and record["facts"]["exit_code"] == 0 and record["duration_ms"] >= 3000


def test_secrets_are_redacted_and_the_token_caller_is_named(server: SandgateServer, sandbox: str) -> None:
    with server.client() as client:
        found = client.get(f"/v1/sandboxes/{sandbox}/endpoints/44772").json()
        egress = client.get(f"/v1/sandboxes/{sandbox}/endpoints/18080").json()
    token = found["headers"]["X-EXECD-ACCESS-TOKEN"]
    vault = {
        "credentials": [{"name": "tok", "source": {"type": "inline", "value": VAULT_SECRET}}],
        "bindings": [],
    }
    made = httpx.post(f"http://{egress['endpoint']}/credential-vault", json=vault, headers=egress["headers"])
    assert made.status_code == 201, made.text
    command = f"echo {token} {server.api_key} {VAULT_SECRET} > /dev/null"
    answer = httpx.post(
        f"{server.base_url}{execd(sandbox)}/command",
        json={"command": command, "envs": {"SECRET_NAME": VAULT_SECRET}},
        headers={"X-EXECD-ACCESS-TOKEN": token},
        timeout=30,
        trust_env=False,
    )
    assert answer.status_code == 200, answer.text
    text = (server.state_dir / "audit.jsonl").read_text()
    for secret in (token, server.api_key, VAULT_SECRET):
        assert secret not in text
    record = next(
        r for r in exec_records(server, sandbox, "command") if "[REDACTED]" in r["facts"].get("command", "")
    )
    # the endpoint's token is bound to the bootstrap key that asked for it: its call is that key's
    assert record["facts"]["actor"] == "execd-token" and record["principal"]["via"] == "bootstrap"
    assert record["facts"]["env_names"] == ["SECRET_NAME"]
    assert record["facts"]["command"].count("[REDACTED]") == 3


def test_the_chain_holds_and_verify_finds_an_edit(
    server: SandgateServer, sandbox: str, tmp_path: Path
) -> None:
    server.run(sandbox, "true")
    assert verify_chain(server.state_dir / "audit.jsonl").problems == []
    ok = subprocess.run(
        [*SANDGATE, "logs", "verify"], env=server.server_env(), capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    copy = tmp_path / "audit.jsonl"
    lines = (server.state_dir / "audit.jsonl").read_text().splitlines(keepends=True)
    edited = next(i for i, line in enumerate(lines[:-1]) if '"kind":"command"' in line)
    lines[edited] = lines[edited].replace('"decision":"allow"', '"decision":"deny"')
    copy.write_text("".join(lines))
    env = {**server.server_env(), "SANDGATE_STATE_DIR": str(tmp_path)}
    found = subprocess.run([*SANDGATE, "logs", "verify"], env=env, capture_output=True, text=True)
    assert found.returncode == 1 and f"audit.jsonl:{edited + 2}" in found.stdout, found.stdout + found.stderr


def test_the_surfaces_show_commands_and_files(server: SandgateServer, sandbox: str) -> None:
    server.run(sandbox, "echo surfaces-marker > /tmp/surfaces.txt")
    with server.client() as client:
        client.get(f"{execd(sandbox)}/files/download", params={"path": "/tmp/surfaces.txt"})
        for _ in range(100):  # the index takes the lines in about every 0.25 s
            files = client.get("/v1/audit", params={"sandbox": sandbox, "kind": "file", "limit": 5})
            if files.json()["records"] and files.json()["records"][0]["path"] == "/tmp/surfaces.txt":
                break
            threading.Event().wait(0.1)
        api = client.get("/v1/audit", params={"sandbox": sandbox, "kind": "command", "limit": 1000})
        client.post("/console/login", data={"key": server.api_key})
        page = client.get(f"/console/sandboxes/{sandbox}")
    assert api.status_code == 200 and {r["kind"] for r in api.json()["records"]} == {"command"}
    assert any("surfaces-marker" in r["reason"] for r in api.json()["records"])
    assert files.json()["records"][0]["method"] == "read"
    assert files.json()["records"][0]["path"] == "/tmp/surfaces.txt"
    assert page.status_code == 200 and 'id="timeline"' in page.text and "surfaces-marker" in page.text
    cli = subprocess.run(
        [*SANDGATE, "logs", "--sandbox", sandbox, "--kind", "file", "-o", "json", "--limit", "1"],
        env=server.server_env(),
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and json.loads(cli.stdout.splitlines()[-1])["path"] == "/tmp/surfaces.txt", cli
    table = subprocess.run(
        [*SANDGATE, "logs", "--sandbox", sandbox, "--kind", "command", "--limit", "3", "--no-color"],
        env=server.server_env(),
        capture_output=True,
        text=True,
    )
    assert "surfaces-marker" in table.stdout and "command" in table.stdout, table


def test_ocsf_export_of_commands_and_files_passes_the_schema(server: SandgateServer, sandbox: str) -> None:
    with server.client() as client:
        upload(client, sandbox, "/tmp/ocsf/one.txt", b"ocsf\n")
        client.post(
            f"{execd(sandbox)}/files/mv", json=[{"src": "/tmp/ocsf/one.txt", "dest": "/tmp/ocsf/two.txt"}]
        )
        server.run(sandbox, "exit 4")
        for _ in range(100):  # the index takes the lines in about every 0.25 s
            page = client.get(
                "/v1/audit", params={"sandbox": sandbox, "format": "ocsf", "limit": 1000}
            ).json()
            events = [e for e in page["records"] if e["class_uid"] in (1001, 1007)]
            if any(e.get("exit_code") == 4 for e in events):
                break
            threading.Event().wait(0.1)
    assert {e["class_uid"] for e in events} == {1001, 1007}
    for event in events:
        assert ocsf_errors(event) == [], event
    digest = hashlib.sha256(b"ocsf\n").hexdigest()
    files = [e for e in events if e["class_uid"] == 1001]
    written = next(e for e in files if e["file"].get("path") == "/tmp/ocsf/one.txt" and e["activity_id"] == 1)
    assert written["file"]["hashes"][0]["value"] == digest and written["activity_name"] == "Create"
    moved = next(e for e in files if e["activity_id"] == 5)
    assert moved["file_result"]["path"] == "/tmp/ocsf/two.txt"
    failed = next(e for e in events if e.get("exit_code") == 4)
    assert failed["status_id"] == 2 and failed["process"]["cmd_line"] == "exit 4"
    assert failed["actor"]["user"]["name"] == "bootstrap" and failed["device"]["uid"] == sandbox
    assert failed["unmapped"]["credential"] == "api-key"


def test_a_route_spelt_with_escapes_or_a_padded_body_is_recorded(
    server: SandgateServer, sandbox: str
) -> None:
    """execd decodes percent-escapes before routing and reads JSON bodies up to 8 MiB: a call
    spelt `/comman%64`, or whose command sits in a body padded to 2 MiB, runs and is recorded with its
    command line; a route execd does not know is recorded too."""
    padded_body = b'{"command": "touch /tmp/padded-run"' + b" " * (2 * 1024 * 1024) + b"}"
    with server.client() as client:
        escaped = client.post(f"{execd(sandbox)}/comman%64", json={"command": "touch /tmp/escaped-run"})
        padded = client.post(
            f"{execd(sandbox)}/command", content=padded_body, headers={"content-type": "application/json"}
        )
        unknown = client.post(f"{execd(sandbox)}/no-such-route", json={"command": "true"})
    assert escaped.status_code == padded.status_code == 200, (escaped.text, padded.text[:300])
    assert unknown.status_code == 404
    assert exists_in(server, sandbox, "/tmp/escaped-run") and exists_in(server, sandbox, "/tmp/padded-run")
    commands = exec_records(server, sandbox, "command")
    by_command = {r["facts"].get("command"): r for r in commands}
    assert by_command["touch /tmp/escaped-run"]["facts"]["route"] == "POST /comman%64"
    assert by_command["touch /tmp/padded-run"]["bytes_out"] == len(padded_body)
    other = next(r for r in commands if r["facts"]["route"] == "POST /no-such-route")
    assert other["method"] == "other" and other["status"] == 404
    assert ocsf_errors(as_ocsf(other)) == [] and as_ocsf(other)["activity_id"] == 99


def as_ocsf(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the audit API exports it (without the reader's `facts` and the chain's `prev`)."""
    return to_ocsf({k: v for k, v in record.items() if k not in ("facts", "prev")})


def typed(server: SandgateServer, sandbox: str, session: str) -> list[dict[str, Any]]:
    return [
        r
        for r in exec_records(server, sandbox, "command")
        if r["method"] == "pty_input" and r["facts"]["session"] == session
    ]


@contextmanager
def attached(server: SandgateServer, sandbox: str) -> Iterator[tuple[str, ClientConnection]]:
    """A new PTY session of the sandbox and a WebSocket attached to it through the server."""
    with server.client() as client:
        created = client.post(f"{execd(sandbox)}/pty", json={"cwd": "/tmp"})
    assert created.status_code == 201, created.text
    session = str(created.json()["session_id"])
    url = f"ws://{server.domain}{execd(sandbox)}/pty/{session}/ws"
    with connect(url, additional_headers={"OPEN-SANDBOX-API-KEY": server.api_key}) as ws:
        assert next_json(ws)["type"] == "connected"
        yield session, ws


JOB = "sh -c 'echo ran-$((6*7)); exec sleep 30'"  # prints ran-42 as the terminal's foreground job


def test_what_is_typed_into_a_terminal_is_recorded_line_by_line(server: SandgateServer, sandbox: str) -> None:
    with attached(server, sandbox) as (session, ws):
        ws.send(STDIN + b"echo pty-")  # a line typed in pieces, its end in a JSON stdin frame
        ws.send(STDIN + b"marker > /tmp/pty-run.txt")
        ws.send(json.dumps({"type": "stdin", "data": f"; echo {server.api_key}; {JOB}\r"}))
        # ran-42 is printed by the foreground job itself (the line's echo shows `$((6*7))`), which
        # then sleeps: SIGINT ends it. Sent at the prompt, readline would drop the "exit 4" typed
        # next; sent before the job leads the terminal, bash may run it anyway.
        read_until(ws, b"ran-42")
        ws.send(json.dumps({"type": "signal", "signal": "SIGINT"}))
        ws.send(STDIN + b"exit 4\n")
        assert next_json(ws) == {"type": "exit", "exit_code": 4}
    assert exists_in(server, sandbox, "/tmp/pty-run.txt")
    lines = typed(server, sandbox, session)
    assert [r["facts"].get("input") or r["facts"]["signal"] for r in lines] == [
        f"echo pty-marker > /tmp/pty-run.txt; echo [REDACTED]; {JOB}\r",
        "SIGINT",
        "exit 4\n",
    ]
    assert all(r["event"] is None and r["facts"]["actor"] == "api-key" for r in lines)
    typed_line = as_ocsf(lines[0])
    assert ocsf_errors(typed_line) == [] and typed_line["class_uid"] == 1007
    assert typed_line["process"]["cmd_line"].startswith("echo pty-marker")
    for _ in range(100):  # the attach record's whole line follows once the proxy saw the close
        opened = [r for r in exec_records(server, sandbox, "command") if r["method"] == "pty_attach"]
        if opened and opened[-1]["facts"]["session"] == session and opened[-1]["event"] is None:
            break
        threading.Event().wait(0.1)
    whole = opened[-1]
    assert whole["facts"]["session"] == session and whole["status"] == 101
    first = f"echo pty-marker > /tmp/pty-run.txt; echo {server.api_key}; {JOB}\r"
    assert whole["facts"]["typed_bytes"] == len(first) + len("exit 4\n")
    assert server.api_key not in (server.state_dir / "audit.jsonl").read_text()


def test_a_typed_line_that_cannot_be_recorded_never_reaches_the_shell(
    server: SandgateServer, sandbox: str
) -> None:
    with attached(server, sandbox) as (session, ws):
        ws.send(STDIN + b"echo ok-$((1+1))\r")  # recorded, then the shell runs it
        read_until(ws, b"ok-2")
        with audit_unwritable(server):
            ws.send(STDIN + b"touch /tmp/pty-unrecorded\r")
            with pytest.raises(ConnectionClosed) as closed:
                for _ in range(1000):
                    ws.recv(timeout=15)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1011
    assert not exists_in(server, sandbox, "/tmp/pty-unrecorded")
    assert [r["facts"]["input"] for r in typed(server, sandbox, session)] == ["echo ok-$((1+1))\r"]

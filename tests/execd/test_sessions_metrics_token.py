"""Sessions, metrics and the access token, against a real execd (directly and through the SDK)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox.exceptions import SandboxApiException

from .conftest import Execd, start_execd, stop_execd


def test_sdk_session_keeps_state_across_runs(execd: Execd, execd_root: Path) -> None:
    commands = execd.sdk_commands()
    session = commands.create_session(working_directory=str(execd_root))
    first = commands.run_in_session(session, "GREETING=hello; mkdir -p inner; cd inner; printf 'no newline'")
    assert first.exit_code == 0 and [m.text for m in first.logs.stdout] == ["no newline"]
    second = commands.run_in_session(session, 'echo "$GREETING from $PWD"; echo warn >&2; false')
    assert second.exit_code == 1
    assert [m.text for m in second.logs.stdout] == [f"hello from {execd_root}/inner"]
    assert [m.text for m in second.logs.stderr] == ["warn"]
    override = commands.run_in_session(session, "pwd", working_directory="/")
    assert [m.text for m in override.logs.stdout] == ["/"]
    broken = commands.run_in_session(session, "if then")
    assert broken.exit_code == 2
    still_there = commands.run_in_session(session, "pwd")
    assert [m.text for m in still_there.logs.stdout] == [f"{execd_root}/inner"]
    commands.delete_session(session)
    with pytest.raises(SandboxApiException):
        commands.run_in_session(session, "true")


def test_session_timeout_and_exit_end_the_session(execd: Execd) -> None:
    commands = execd.sdk_commands()
    session = commands.create_session()
    timed_out = commands.run_in_session(session, "sleep 30", timeout=timedelta(milliseconds=200))
    assert timed_out.exit_code == 137
    with execd.client() as client:
        gone = client.post(f"/session/{session}/run", json={"command": "true"})
        assert gone.status_code == 410 and "timeout" in gone.json()["message"]
    exiting = commands.create_session()
    assert commands.run_in_session(exiting, "exit 4").exit_code == 4
    with execd.client() as client:
        assert client.post(f"/session/{exiting}/run", json={"command": "true"}).status_code == 410


def test_session_bad_input(execd: Execd) -> None:
    with execd.client() as client:
        assert client.post("/session", json={"cwd": "/no/such/dir"}).status_code == 400
        assert client.post("/session/unknown/run", json={"command": "true"}).status_code == 404
        assert client.delete("/session/unknown").status_code == 404
        session = client.post("/session").json()["session_id"]
        assert client.post(f"/session/{session}/run", json={"command": ""}).status_code == 400
        assert client.post(f"/session/{session}/run", json={}).status_code == 400


def test_metrics_and_watch(execd: Execd) -> None:
    with execd.client() as client:
        metrics = client.get("/metrics").json()
        assert set(metrics) == {"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"}
        assert metrics["cpu_count"] >= 1 and 0 <= metrics["cpu_used_pct"] <= 100
        assert 0 < metrics["mem_used_mib"] < metrics["mem_total_mib"]
        frames = []
        with client.stream("GET", "/metrics/watch") as response:
            buffer = b""
            for chunk in response.iter_bytes():
                buffer += chunk
                while b"\n\n" in buffer:
                    part, buffer = buffer.split(b"\n\n", 1)
                    frames.append(json.loads(part))
                if len(frames) >= 2:
                    break
        assert frames[1]["timestamp"] - frames[0]["timestamp"] >= 900


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Execd]:
    server = start_execd(root=tmp_path_factory.mktemp("guarded"), token="s3cret-token")
    try:
        yield server
    finally:
        stop_execd(server)


def test_token_guards_every_route_but_ping(guarded: Execd) -> None:
    with guarded.client() as allowed, guarded.client() as anonymous:
        anonymous.headers.pop("X-EXECD-ACCESS-TOKEN")
        assert anonymous.get("/ping").status_code == 200
        for method, path in [("GET", "/metrics"), ("POST", "/command"), ("GET", "/files/info?path=/")]:
            refused = anonymous.request(method, path)
            assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHORIZED"
            assert "missing X-EXECD-ACCESS-TOKEN" in refused.json()["message"]
        wrong = anonymous.get("/metrics", headers={"X-EXECD-ACCESS-TOKEN": "s3cret-tokeN"})
        assert wrong.status_code == 401 and "wrong" in wrong.json()["message"]
        assert allowed.get("/metrics").status_code == 200
    result = guarded.sdk_commands().run("echo through the sdk")
    assert result.exit_code == 0 and [m.text for m in result.logs.stdout] == ["through the sdk"]
    guarded.sdk_files().write_file("/token.txt", "ok")
    assert guarded.sdk_files().read_file("/token.txt") == "ok"

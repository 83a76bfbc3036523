"""/command against a real execd: the wire format byte for byte, then the real SDK on top."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.execd_sync import ExecutionHandlersSync

from .conftest import Execd


def frames(raw: bytes) -> list[dict[str, Any]]:
    """Split a body the way the Go execd frames it: bare JSON objects, each followed by a blank line."""
    assert raw.endswith(b"\n\n"), raw[-50:]
    parts = raw[:-2].split(b"\n\n")
    assert all(part.startswith(b"{") for part in parts), raw[:200]
    return [json.loads(part) for part in parts]


def run_raw(execd: Execd, body: dict[str, Any]) -> list[dict[str, Any]]:
    with execd.client() as client:
        response = client.post("/command", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    return [e for e in frames(response.content) if e["type"] != "ping"]


def wait_finished(execd: Execd, run_id: str, limit_s: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    with execd.client() as client:
        while time.monotonic() < deadline:
            status = client.get(f"/command/status/{run_id}").json()
            if not status["running"]:
                return dict(status)
            time.sleep(0.05)
    raise AssertionError(f"command {run_id} still running after {limit_s} s")


def process_gone(pid: int, limit_s: float = 5) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_foreground_success_is_init_lines_then_complete(execd: Execd) -> None:
    events = run_raw(execd, {"command": "echo one; echo two >&2; printf 'a\\n\\nb'"})
    assert events[0]["type"] == "init" and len(events[0]["text"]) >= 16
    assert all(isinstance(e["timestamp"], int) for e in events)
    out = [e["text"] for e in events if e["type"] == "stdout"]
    assert out == ["one", "a", "\n", "b"]
    assert [e["text"] for e in events if e["type"] == "stderr"] == ["two"]
    assert events[-1]["type"] == "execution_complete" and events[-1]["execution_time"] >= 0
    assert not [e for e in events if e["type"] == "error"]


def test_foreground_failure_is_error_with_exit_code_and_no_complete(execd: Execd) -> None:
    events = run_raw(execd, {"command": "echo partial; exit 3"})
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["ename"] == "CommandExecError"
    assert events[-1]["error"]["evalue"] == "3"
    assert not [e for e in events if e["type"] == "execution_complete"]


def test_output_streams_while_the_command_runs(execd: Execd, tmp_path: Path) -> None:
    # The command waits for a file that the test writes only after it has seen the first line.
    # If output were held back until the command ended, the command would time out instead.
    go = tmp_path / "go"
    command = (
        f"echo first; for _ in $(seq 500); do [ -e '{go}' ] && break; sleep 0.02; done; "
        f"if [ -e '{go}' ]; then echo second; else echo waited in vain; fi"
    )
    seen: list[str] = []
    with (
        execd.client() as client,
        client.stream("POST", "/command", json={"command": command}) as response,
    ):
        buffer = b""
        for chunk in response.iter_bytes():
            buffer += chunk
            while b"\n\n" in buffer:
                part, buffer = buffer.split(b"\n\n", 1)
                item = json.loads(part)
                if item["type"] == "stdout":
                    seen.append(item["text"])
                    go.touch()
    assert seen == ["first", "second"]


def test_cwd_envs_and_argv(execd: Execd, execd_root: Path) -> None:
    (execd_root / "work dir").mkdir(exist_ok=True)
    events = run_raw(
        execd,
        {
            "command": 'pwd; echo "$GREETING"',
            "cwd": str(execd_root / "work dir"),
            "envs": {"GREETING": "hi there"},
        },
    )
    assert [e["text"] for e in events if e["type"] == "stdout"] == [str(execd_root / "work dir"), "hi there"]
    events = run_raw(execd, {"argv": ["printf", "%s|", "a b", "$HOME"]})
    assert [e["text"] for e in events if e["type"] == "stdout"] == ["a b|$HOME|"]


def test_timeout_kills_the_process_group(execd: Execd, execd_root: Path) -> None:
    pid_file = execd_root / "timeout.pid"
    started = time.monotonic()
    events = run_raw(execd, {"command": f"sleep 60 & echo $! > '{pid_file}'; wait", "timeout": 300})
    assert time.monotonic() - started < 5
    assert events[-1]["type"] == "error" and events[-1]["error"]["evalue"] == "137"
    assert "timeout" in events[-1]["error"]["traceback"][0]
    assert process_gone(int(pid_file.read_text()))


def test_ping_events_while_a_command_is_silent(execd: Execd) -> None:
    with execd.client() as client:
        raw = client.post("/command", json={"command": "sleep 3.4; echo done"}).content
    kinds = [e["type"] for e in frames(raw)]
    assert "ping" in kinds and kinds[-1] == "execution_complete"


def test_client_disconnect_kills_a_foreground_run(execd: Execd) -> None:
    with (
        execd.client() as client,
        client.stream("POST", "/command", json={"command": "echo $$; sleep 60"}) as response,
    ):
        buffer = b""
        for chunk in response.iter_bytes():
            buffer += chunk
            if b'"stdout"' in buffer:
                break
    stdout = next(e for e in frames(buffer[: buffer.rindex(b"\n\n") + 2]) if e["type"] == "stdout")
    assert process_gone(int(stdout["text"]))


def test_background_status_logs_and_cursor(execd: Execd) -> None:
    events = run_raw(
        execd, {"command": "echo out; echo err >&2; sleep 0.3; echo late; exit 5", "background": True}
    )
    assert [e["type"] for e in events] == ["init", "execution_complete"]
    run_id = events[0]["text"]
    with execd.client() as client:
        running = client.get(f"/command/status/{run_id}").json()
        assert running["running"] is True and running["exit_code"] is None and running["finished_at"] is None
        status = wait_finished(execd, run_id)
        assert status["exit_code"] == 5 and status["content"].startswith("echo out")
        full = client.get(f"/command/{run_id}/logs")
        assert full.text == "out\nerr\nlate\n"
        assert full.headers["EXECD-COMMANDS-TAIL-CURSOR"] == str(len(full.content))
        tail = client.get(f"/command/{run_id}/logs", params={"cursor": 8})
        assert tail.text == "late\n" and tail.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "13"
        past_end = client.get(f"/command/{run_id}/logs", params={"cursor": 999})
        assert past_end.text == "" and past_end.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "13"


def test_interrupt_kills_the_whole_group(execd: Execd, execd_root: Path) -> None:
    pid_file = execd_root / "interrupt.pid"
    events = run_raw(execd, {"command": f"sleep 60 & echo $! > '{pid_file}'; wait", "background": True})
    run_id = events[0]["text"]
    deadline = time.monotonic() + 5
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with execd.client() as client:
        assert client.delete("/command", params={"id": run_id}).status_code == 200
    status = wait_finished(execd, run_id)
    assert status["exit_code"] == 143
    assert process_gone(int(pid_file.read_text()))


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")
def test_uid_and_gid(execd: Execd) -> None:
    events = run_raw(execd, {"command": "id -u; id -g; id -G", "uid": 65534, "gid": 65533, "cwd": "/"})
    assert [e["text"] for e in events if e["type"] == "stdout"] == ["65534", "65533", "65533"]


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/command", {"command": "true", "argv": ["true"]}, 400),
        ("POST", "/command", {}, 400),
        ("POST", "/command", {"command": "true", "gid": 1}, 400),
        ("POST", "/command", {"command": "true", "timeout": -1}, 400),
        ("POST", "/command", {"command": "true", "cwd": "/no/such/dir"}, 400),
        ("POST", "/command", {"command": "true", "cwd": "$SANDGATE_UNSET_VAR/x"}, 400),
        ("POST", "/command", {"argv": ["sandgate-no-such-binary"]}, 400),
        ("GET", "/command/status/no-such-id", None, 404),
        ("GET", "/command/no-such-id/logs", None, 404),
        ("DELETE", "/command?id=no-such-id", None, 404),
        ("DELETE", "/command", None, 400),
    ],
)
def test_bad_command_requests_get_a_clear_4xx(
    execd: Execd, method: str, path: str, body: dict[str, Any] | None, status: int
) -> None:
    with execd.client() as client:
        response = client.request(method, path, json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["code"] and len(error["message"]) > 10


def test_invalid_json_and_bad_cursor(execd: Execd) -> None:
    with execd.client() as client:
        response = client.post("/command", content=b"{not json", headers={"content-type": "application/json"})
        assert response.status_code == 400 and "not valid JSON" in response.json()["message"]
        run_id = run_raw(execd, {"command": "true", "background": True})[0]["text"]
        assert client.get(f"/command/{run_id}/logs", params={"cursor": "-1"}).status_code == 400
        foreground_id = run_raw(execd, {"command": "true"})[0]["text"]
        assert client.get(f"/command/{foreground_id}/logs").status_code == 400


# -- the real OpenSandbox 1.1.1 SDK ------------------------------------------------------------


def test_sdk_run_streams_stdout_stderr_and_exit_codes(execd: Execd) -> None:
    commands = execd.sdk_commands()
    seen: list[tuple[str, str]] = []
    handlers = ExecutionHandlersSync(
        on_stdout=lambda m: seen.append(("out", m.text)), on_stderr=lambda m: seen.append(("err", m.text))
    )
    ok = commands.run("echo hello; echo oops >&2", handlers=handlers)
    assert ok.exit_code == 0 and ok.error is None and ok.complete is not None
    assert [m.text for m in ok.logs.stdout] == ["hello"] and [m.text for m in ok.logs.stderr] == ["oops"]
    assert ("out", "hello") in seen and ("err", "oops") in seen
    failed = commands.run("exit 7")
    assert failed.exit_code == 7 and failed.error is not None and failed.error.name == "CommandExecError"
    argv = commands.run(["python3", "-c", "print(6 * 7)"])
    assert [m.text for m in argv.logs.stdout] == ["42"]
    timed_out = commands.run("sleep 30", opts=RunCommandOpts(timeout=timedelta(milliseconds=200)))
    assert timed_out.exit_code == 137


def test_sdk_background_status_logs_and_interrupt(execd: Execd) -> None:
    commands = execd.sdk_commands()
    background = commands.run("echo started; sleep 0.2; echo finished", opts=RunCommandOpts(background=True))
    assert background.id
    status = wait_finished(execd, background.id)
    assert status["exit_code"] == 0
    sdk_status = commands.get_command_status(background.id)
    assert sdk_status.running is False and sdk_status.exit_code == 0 and sdk_status.finished_at is not None
    logs = commands.get_background_command_logs(background.id, cursor=0)
    assert logs.content == "started\nfinished\n" and logs.cursor == len(logs.content)
    assert commands.get_background_command_logs(background.id, cursor=logs.cursor).content == ""

    long_run = commands.run("sleep 60", opts=RunCommandOpts(background=True))
    commands.interrupt(long_run.id)
    stopped = commands.get_command_status(long_run.id)
    assert stopped.running is False and stopped.exit_code == 143


def test_sdk_set_env_reaches_later_commands(execd: Execd) -> None:
    commands = execd.sdk_commands()
    commands.set_env("SANDGATE_TEST_VALUE", "it's set")
    result = commands.run('echo "$SANDGATE_TEST_VALUE"')
    assert [m.text for m in result.logs.stdout] == ["it's set"]

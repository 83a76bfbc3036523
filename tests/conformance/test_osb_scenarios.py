"""The shared client scenario list (scenarios.py) through `osb` (opensandbox-cli 1.1.1,
unchanged), in direct mode and with `OPEN_SANDBOX_USE_SERVER_PROXY`, against a real
`sandgate serve`: the same steps and checks as the SDKs', typed as a user types them.

osb runs in-process through its click entry point (`opensandbox_cli.main:cli`, what the `osb`
script calls) with its argv and environment: each osb process spends about 3 s importing on a
loaded machine, and the scenarios take some 35 calls per mode. test_osb_mcp.py runs the `osb`
executable itself. What osb expresses only in part is said at the scenario (egress: no delete
subcommand; files: no list command, search lists).
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from opensandbox_cli.main import cli

from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import (
    MODES,
    SCENARIOS,
    check,
    check_execd_endpoint,
    egress_endpoint_path,
    run_in_order,
    steps_of,
)
from tests.conformance.scenarios import Result as ScenarioResult
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
BLOCKED = "blocked.example.com"
SECRET = "osb-secret-0123456789"
DIR = "/tmp/osb-conformance"


class OsbClient:
    """Each public method is one scenario, named and ordered as in SCENARIOS."""

    def __init__(self, server: SandgateServer, mode: str, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.env = {
            **server.env(),
            "OPEN_SANDBOX_USE_SERVER_PROXY": "true" if mode == "server_proxy" else "false",
        }
        self.mode = mode
        self.id = ""
        self.session = ""
        self.killed = False

    def _osb(self, *args: str, ok: bool = True) -> Result:
        argv = ["--no-color", "--config", str(self.workdir / "no-config.toml"), *args]
        result = CliRunner().invoke(cli, argv, env=self.env, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, f"osb {' '.join(args)}: {result.exit_code}\n{result.output}"
        return result

    def _json(self, *args: str) -> Any:
        """With `-o json`, before the `--` of a command payload if there is one."""
        cut = args.index("--") if "--" in args else len(args)
        return json.loads(self._osb(*args[:cut], "-o", "json", *args[cut:]).stdout)

    def _run(self, script: str, *options: str, ok: bool = True) -> Result:
        return self._osb("command", "run", *options, self.id, "--", "sh", "-c", script, ok=ok)

    def _info(self, path: str) -> Any:
        (info,) = self._json("file", "info", self.id, path)
        assert info["path"] == path
        return info

    def _exists(self, path: str) -> bool:
        return self._run(f"test -e {path}", ok=False).exit_code == 0

    def create(self) -> None:
        policy = self.workdir / "policy.json"
        policy.write_text(
            json.dumps({"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]})
        )
        created = self._json(
            "sandbox", "create", "-i", self.server.sandbox_image,
            "--entrypoint", "sleep", "--entrypoint", "infinity",
            "--resource", "cpu=1", "-e", "GREETING=hello from create", "-m", "suite=osb",
            "--network-policy-file", str(policy), "--credential-proxy",
        )  # fmt: skip
        self.id = created["id"]
        info = self._json("sandbox", "get", self.id)
        assert info["status"]["state"] == "Running" and info["metadata"] == {"suite": "osb"}
        assert self._run('printf %s "$GREETING"').stdout == "hello from create\n"

    def command_stream(self) -> None:
        # osb writes each event's text as it arrives; execd (the Go one too) sends a line without
        # its terminator, so osb prints the lines run together, in order.
        ran = self._run('for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; sleep 0.05; done')
        assert ran.stdout == "out 1out 2out 3\n"
        assert ran.stderr == "err 1err 2err 3"

    def command_exit_code(self) -> None:
        failed = self._run("echo broken >&2; exit 3", ok=False)
        assert failed.exit_code == 1  # osb's own exit status for any failed command
        assert "CommandExecError: 3" in failed.stderr and "broken" in failed.stderr

    def command_timeout(self) -> None:
        started = time.monotonic()
        failed = self._run("echo begun; sleep 30; echo never", "-t", "1s", ok=False)
        assert time.monotonic() - started < 15, "the timeout did not stop the command"
        assert failed.exit_code == 1 and failed.stdout == "begun\n"

    def _background(self, script: str) -> str:
        started = self._json("command", "run", "-d", self.id, "--", "sh", "-c", script)
        return str(started["execution_id"])

    def _ended(self, execution_id: str) -> Any:
        deadline = time.monotonic() + 15
        while (status := self._json("command", "status", self.id, execution_id))["running"]:
            assert time.monotonic() < deadline, f"{execution_id} still runs: {status}"
            time.sleep(0.1)
        return status

    def command_background(self) -> None:
        execution_id = self._background("echo started; sleep 0.5; echo finished")
        assert self._ended(execution_id)["exit_code"] == 0
        logs = self._osb("command", "logs", self.id, execution_id, "-o", "raw").stdout
        assert logs == "started\nfinished\n\n"  # the log, and the line osb ends its output with

    def command_interrupt(self) -> None:
        execution_id = self._background("sleep 60")
        started = time.monotonic()
        self._osb("command", "interrupt", self.id, execution_id)
        self._ended(execution_id)
        assert time.monotonic() - started < 15, "the interrupt did not stop the command"

    def session_run(self) -> None:
        self.session = self._json("command", "session", "create", self.id, "-w", "/tmp")["session_id"]
        for words in (["mkdir", "-p", "osb-session"], ["cd", "osb-session"], ["export", "KEPT=yes"]):
            self._osb("command", "session", "run", self.id, self.session, "--", *words)
        shown = self._osb(
            "command", "session", "run", self.id, self.session, "--", "sh", "-c", 'echo "$(pwd) $KEPT"'
        )
        assert shown.stdout.strip() == "/tmp/osb-session yes"

    def session_delete(self) -> None:
        self._osb("command", "session", "delete", self.id, self.session)
        again = self._osb("command", "session", "run", self.id, self.session, "--", "true", ok=False)
        assert again.exit_code != 0

    def files_write_read(self) -> None:
        self._osb("file", "write", self.id, f"{DIR}/a.txt", "-c", "alpha\nbeta\n", "--mode", "644")
        assert self._osb("file", "cat", self.id, f"{DIR}/a.txt").stdout == "alpha\nbeta\n"
        data = bytes([0, 1, 2, 253, 254, 255])
        (self.workdir / "b.bin").write_bytes(data)
        self._osb("file", "upload", self.id, str(self.workdir / "b.bin"), f"{DIR}/b.bin")
        self._osb("file", "download", self.id, f"{DIR}/b.bin", str(self.workdir / "back.bin"))
        assert (self.workdir / "back.bin").read_bytes() == data
        info = self._info(f"{DIR}/a.txt")
        assert (info["size"], info["mode"]) == (11, 644)
        every = sorted(f["path"] for f in self._json("file", "search", self.id, DIR, "-p", "*"))
        assert every == [f"{DIR}/a.txt", f"{DIR}/b.bin"]  # osb has no list: search lists
        assert [f["path"] for f in self._json("file", "search", self.id, DIR, "-p", "*.txt")] == [
            f"{DIR}/a.txt"
        ]

    def create_directories(self) -> None:
        self._osb("file", "mkdir", self.id, f"{DIR}/d1/d2", "--mode", "750")
        info = self._info(f"{DIR}/d1/d2")
        assert (info["entry_type"], info["mode"]) == ("directory", 750)

    def delete_files(self) -> None:
        self._osb("file", "write", self.id, f"{DIR}/gone.txt", "-c", "soon gone")
        self._osb("file", "rm", self.id, f"{DIR}/gone.txt")
        assert not self._exists(f"{DIR}/gone.txt")

    def delete_directories(self) -> None:
        self._osb("file", "write", self.id, f"{DIR}/tree/sub/leaf.txt", "-c", "leaf")
        self._osb("file", "rmdir", self.id, f"{DIR}/tree")
        assert not self._exists(f"{DIR}/tree")

    def replace_move_chmod(self) -> None:
        self._osb("file", "write", self.id, f"{DIR}/r.txt", "-c", "hello world")
        self._osb("file", "replace", self.id, f"{DIR}/r.txt", "--old", "world", "--new", "sandgate")
        self._osb("file", "mv", self.id, f"{DIR}/r.txt", f"{DIR}/moved.txt")
        self._osb("file", "chmod", self.id, f"{DIR}/moved.txt", "--mode", "600")
        assert self._osb("file", "cat", self.id, f"{DIR}/moved.txt").stdout == "hello sandgate"
        assert self._info(f"{DIR}/moved.txt")["mode"] == 600
        assert not self._exists(f"{DIR}/r.txt")

    def metrics(self) -> None:
        metrics = self._json("sandbox", "metrics", self.id)
        assert metrics["cpu_count"] > 0 and metrics["memory_total_in_mib"] > 0, metrics

    def endpoints(self) -> None:
        execd = self._json("sandbox", "endpoint", self.id, "-p", "44772")
        check_execd_endpoint(self.server, self.id, self.mode, execd)
        egress = self._json("sandbox", "endpoint", self.id, "-p", "18080")
        assert egress["endpoint"].endswith(egress_endpoint_path(self.id, self.mode)), egress

    def egress(self) -> None:
        def rules() -> list[str]:
            return [f"{r['action']}:{r['target']}" for r in self._json("egress", "get", self.id)["egress"]]

        assert rules() == [f"allow:{API_HOST}"]
        self._osb("egress", "patch", self.id, "--rule", f"deny={BLOCKED}")
        assert rules() == [f"deny:{BLOCKED}", f"allow:{API_HOST}"]  # osb has no egress delete

    def credential_vault(self) -> None:
        payload = self.workdir / "vault.yaml"
        payload.write_text(
            f"credentials:\n  - name: api-token\n    source: {{type: inline, value: {SECRET}}}\n"
            f"bindings:\n  - name: api\n    match: {{hosts: [{API_HOST}]}}\n"
            "    auth: {type: bearer, credential: api-token}\n"
        )
        self._osb("credential-vault", "create", self.id, "--file", str(payload))
        state = self._json("credential-vault", "get", self.id)
        assert state["revision"] == 1 and [c["name"] for c in state["credentials"]] == ["api-token"]
        assert SECRET not in json.dumps(state)

    def pause_resume(self) -> None:
        self._osb("file", "write", self.id, f"{DIR}/kept.txt", "-c", "kept across pause")
        self._osb("sandbox", "pause", self.id)
        assert self._json("sandbox", "get", self.id)["status"]["state"] == "Paused"
        self._osb("sandbox", "resume", self.id)
        assert self._json("sandbox", "get", self.id)["status"]["state"] == "Running"
        assert self._osb("file", "cat", self.id, f"{DIR}/kept.txt").stdout == "kept across pause"
        assert self._run("echo again").stdout == "again\n"

    def connect(self) -> None:
        """Every osb command connects by id afresh; `sandbox health` is that alone."""
        assert self._json("sandbox", "health", self.id)["healthy"] is True
        assert self._osb("file", "cat", self.id, f"{DIR}/kept.txt").stdout == "kept across pause"

    def kill(self) -> None:
        self._osb("sandbox", "kill", self.id)
        self.killed = True
        gone = self._osb("sandbox", "get", self.id, ok=False)
        assert gone.exit_code != 0 and "NOT_FOUND" in gone.output, gone.output

    def _close(self) -> None:
        if self.id and not self.killed:
            self._osb("sandbox", "kill", self.id, ok=False)


def run_osb(server: SandgateServer, mode: str) -> dict[str, ScenarioResult]:
    with tempfile.TemporaryDirectory(prefix=f"osb-{mode}-") as workdir:
        client = OsbClient(server, mode, Path(workdir))
        try:
            return run_in_order("osb", steps_of(client))
        finally:
            client._close()


@pytest.fixture(scope="module")
def osb_results(server: SandgateServer) -> Callable[[str], dict[str, ScenarioResult]]:
    """The scenarios' results of one mode, run once on first use."""
    return functools.cache(lambda mode: run_osb(server, mode))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", MODES)
def test_osb(osb_results: Callable[[str], dict[str, ScenarioResult]], mode: str, scenario: str) -> None:
    check("osb", lambda: osb_results(mode), scenario)

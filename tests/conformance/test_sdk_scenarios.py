"""The shared client scenario list (scenarios.py) through the OpenSandbox Python SDK 1.1.1,
unchanged, in direct mode and with `use_server_proxy`, against a real `sandgate serve`: the
same steps and checks as the JS SDK's tests/js/scenarios.mjs, one pytest case per scenario.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from opensandbox import SandboxSync
from opensandbox.exceptions import SandboxException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.execd_sync import ExecutionHandlersSync
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)
from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule

from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import (
    SCENARIOS,
    SDK_MODES,
    Result,
    by_mode,
    check,
    check_execd_endpoint,
    egress_endpoint_path,
    run_in_order,
    steps_of,
)
from tests.conformance.test_sdk import connection
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
BLOCKED = "blocked.example.com"
SECRET = "py-secret-0123456789"
DIR = "/tmp/py-conformance"


def joined(messages: list[Any]) -> str:
    return "".join(m.text for m in messages)


def until(what: str, check: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


class PythonSdkClient:
    """Each public method is one scenario, named and ordered as in SCENARIOS."""

    def __init__(self, server: SandgateServer, mode: str) -> None:
        self.server = server
        self.mode = mode
        self.sandbox: SandboxSync | None = None
        self.session = ""
        self.killed = False

    def _connection(self) -> Any:
        return connection(self.server, use_server_proxy=self.mode == "server_proxy")

    @property
    def _sandbox(self) -> SandboxSync:
        assert self.sandbox is not None, "no sandbox: create failed"
        return self.sandbox

    def _shell(self, command: str) -> tuple[int | None, str]:
        execution = self._sandbox.commands.run(command)
        return execution.exit_code, joined(execution.logs.stdout).strip()

    def _info(self, path: str) -> Any:
        return self._sandbox.files.get_file_info([path])[path]

    def create(self) -> None:
        self.sandbox = SandboxSync.create(
            self.server.sandbox_image,
            entrypoint=["sleep", "infinity"],
            resource={"cpu": "1", "memory": "512Mi"},
            env={"GREETING": "hello from create"},
            metadata={"suite": "python-sdk"},
            network_policy=NetworkPolicy(
                defaultAction="deny", egress=[NetworkRule(action="allow", target=API_HOST)]
            ),
            credential_proxy=CredentialProxyConfig(enabled=True),
            connection_config=self._connection(),
            ready_timeout=timedelta(seconds=30),
        )
        info = self._sandbox.get_info()
        assert info.status.state == "Running" and info.metadata == {"suite": "python-sdk"}
        assert self._shell('printf %s "$GREETING"') == (0, "hello from create")

    def command_stream(self) -> None:
        seen: list[str] = []
        handlers = ExecutionHandlersSync(
            on_stdout=lambda m: seen.append(f"stdout:{m.text.strip()}"),
            on_stderr=lambda m: seen.append(f"stderr:{m.text.strip()}"),
        )
        execution = self._sandbox.commands.run(
            'for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; sleep 0.05; done', handlers=handlers
        )
        assert execution.exit_code == 0 and execution.complete is not None
        assert [e for e in seen if e.startswith("stdout:")] == [f"stdout:out {i}" for i in (1, 2, 3)]
        assert [e for e in seen if e.startswith("stderr:")] == [f"stderr:err {i}" for i in (1, 2, 3)]

    def command_exit_code(self) -> None:
        execution = self._sandbox.commands.run("echo broken >&2; exit 3")
        assert execution.exit_code == 3
        assert execution.error is not None and execution.error.value == "3"
        assert joined(execution.logs.stderr).strip() == "broken"

    def command_timeout(self) -> None:
        started = time.monotonic()
        execution = self._sandbox.commands.run(
            "echo begun; sleep 30; echo never", opts=RunCommandOpts(timeout=timedelta(seconds=1))
        )
        assert time.monotonic() - started < 15, "the timeout did not stop the command"
        assert execution.exit_code != 0 and execution.error is not None
        assert joined(execution.logs.stdout).strip() == "begun"

    def command_background(self) -> None:
        commands = self._sandbox.commands
        background = RunCommandOpts(background=True)
        command_id = commands.run("echo started; sleep 0.5; echo finished", opts=background).id
        assert command_id

        def ended() -> Any:
            status = commands.get_command_status(command_id)
            return None if status.running else status

        assert until("the background command to end", ended).exit_code == 0
        assert commands.get_background_command_logs(command_id).content == "started\nfinished\n"

    def command_interrupt(self) -> None:
        ready = threading.Event()
        ids: list[str] = []
        outcome: list[Any] = []
        handlers = ExecutionHandlersSync(
            on_init=lambda init: ids.append(init.id),
            on_stdout=lambda m: "ready" in m.text and ready.set(),
        )
        runner = threading.Thread(
            target=lambda: outcome.append(
                self._sandbox.commands.run("echo ready; sleep 60", handlers=handlers)
            )
        )
        runner.start()
        assert ready.wait(15), "the command never started"
        started = time.monotonic()
        self._sandbox.commands.interrupt(ids[0])
        runner.join(15)
        assert not runner.is_alive() and time.monotonic() - started < 15, "the interrupt did not stop it"
        assert outcome[0].error is not None or outcome[0].exit_code != 0
        assert self._sandbox.commands.get_command_status(ids[0]).running is False

    def session_run(self) -> None:
        commands = self._sandbox.commands
        self.session = commands.create_session(working_directory="/tmp")
        first = commands.run_in_session(
            self.session, "mkdir -p py-session && cd py-session && export KEPT=yes"
        )
        assert first.exit_code == 0
        second = commands.run_in_session(self.session, 'echo "$(pwd) $KEPT"')
        assert joined(second.logs.stdout).strip() == "/tmp/py-session yes"

    def session_delete(self) -> None:
        self._sandbox.commands.delete_session(self.session)
        with pytest.raises(SandboxException):
            self._sandbox.commands.run_in_session(self.session, "true")

    def files_write_read(self) -> None:
        files = self._sandbox.files
        data = bytes([0, 1, 2, 253, 254, 255])
        files.write_files(
            [
                WriteEntry(path=f"{DIR}/a.txt", data="alpha\nbeta\n", mode=644),
                WriteEntry(path=f"{DIR}/b.bin", data=data),
            ]
        )
        assert files.read_file(f"{DIR}/a.txt") == "alpha\nbeta\n"
        assert files.read_bytes(f"{DIR}/b.bin") == data
        info = self._info(f"{DIR}/a.txt")
        assert (info.size, info.mode) == (11, 644)
        listed = sorted(f.path for f in files.list_directory(DirectoryListEntry(path=DIR)))
        assert listed == [f"{DIR}/a.txt", f"{DIR}/b.bin"]
        found = [f.path for f in files.search(SearchEntry(path=DIR, pattern="*.txt"))]
        assert found == [f"{DIR}/a.txt"]

    def create_directories(self) -> None:
        self._sandbox.files.create_directories([WriteEntry(path=f"{DIR}/d1/d2", mode=750)])
        info = self._info(f"{DIR}/d1/d2")
        assert (info.entry_type, info.mode) == ("directory", 750)

    def delete_files(self) -> None:
        self._sandbox.files.write_file(f"{DIR}/gone.txt", "soon gone")
        self._sandbox.files.delete_files([f"{DIR}/gone.txt"])
        assert self._shell(f"test -e {DIR}/gone.txt")[0] == 1

    def delete_directories(self) -> None:
        self._sandbox.files.write_file(f"{DIR}/tree/sub/leaf.txt", "leaf")
        self._sandbox.files.delete_directories([f"{DIR}/tree"])
        assert self._shell(f"test -e {DIR}/tree")[0] == 1

    def replace_move_chmod(self) -> None:
        files = self._sandbox.files
        files.write_file(f"{DIR}/r.txt", "hello world")
        files.replace_contents(
            [ContentReplaceEntry(path=f"{DIR}/r.txt", old_content="world", new_content="sandgate")]
        )
        files.move_files([MoveEntry(src=f"{DIR}/r.txt", dest=f"{DIR}/moved.txt")])
        files.set_permissions([SetPermissionEntry(path=f"{DIR}/moved.txt", mode=600)])
        assert files.read_file(f"{DIR}/moved.txt") == "hello sandgate"
        assert self._info(f"{DIR}/moved.txt").mode == 600
        assert self._shell(f"test -e {DIR}/r.txt")[0] == 1

    def metrics(self) -> None:
        metrics = self._sandbox.get_metrics()
        assert metrics.cpu_count > 0 and metrics.memory_total_in_mib > 0
        assert 0 <= metrics.memory_used_in_mib <= metrics.memory_total_in_mib

    def endpoints(self) -> None:
        execd = self._sandbox.get_endpoint(44772)
        check_execd_endpoint(self.server, self._sandbox.id, self.mode, execd.model_dump())
        egress = self._sandbox.get_endpoint(18080)
        assert egress.endpoint.endswith(egress_endpoint_path(self._sandbox.id, self.mode)), egress.endpoint

    def egress(self) -> None:
        def rules() -> list[str]:
            return [f"{r.action}:{r.target}" for r in self._sandbox.get_egress_policy().egress or []]

        assert rules() == [f"allow:{API_HOST}"]
        self._sandbox.patch_egress_rules([NetworkRule(action="deny", target=BLOCKED)])
        assert rules() == [f"deny:{BLOCKED}", f"allow:{API_HOST}"]
        self._sandbox.delete_egress_rules([BLOCKED])
        assert rules() == [f"allow:{API_HOST}"]

    def credential_vault(self) -> None:
        vault = self._sandbox.credential_vault
        created = vault.create(
            credentials=[{"name": "api-token", "source": {"type": "inline", "value": SECRET}}],
            bindings=[
                {
                    "name": "api",
                    "match": {"hosts": [API_HOST]},
                    "auth": {"type": "bearer", "credential": "api-token"},
                }
            ],
        )
        assert created.revision == 1
        state = vault.get()
        assert [c.name for c in state.credentials] == ["api-token"]
        assert SECRET not in state.model_dump_json()

    def pause_resume(self) -> None:
        self._sandbox.files.write_file(f"{DIR}/kept.txt", "kept across pause")
        self._sandbox.pause()
        assert self._sandbox.get_info().status.state == "Paused"
        resumed = SandboxSync.resume(self._sandbox.id, connection_config=self._connection())
        self._sandbox.close()
        self.sandbox = resumed
        assert self._sandbox.get_info().status.state == "Running"
        assert self._sandbox.files.read_file(f"{DIR}/kept.txt") == "kept across pause"
        assert self._shell("echo again") == (0, "again")

    def connect(self) -> None:
        other = SandboxSync.connect(self._sandbox.id, connection_config=self._connection())
        try:
            execution = other.commands.run("echo connected")
            assert joined(execution.logs.stdout).strip() == "connected"
            assert other.files.read_file(f"{DIR}/kept.txt") == "kept across pause"
        finally:
            other.close()

    def kill(self) -> None:
        self._sandbox.kill()
        self.killed = True
        with pytest.raises(SandboxException) as gone:
            self._sandbox.get_info()
        assert gone.value.error.code == "NOT_FOUND", str(gone.value)

    def _close(self) -> None:
        if self.sandbox is not None:
            if not self.killed:
                self.sandbox.kill()
            self.sandbox.close()


def run_python(server: SandgateServer, mode: str) -> dict[str, Result]:
    client = PythonSdkClient(server, mode)
    try:
        return run_in_order("python", steps_of(client))
    finally:
        client._close()


@pytest.fixture(scope="module")
def python_results(
    server: SandgateServer, direct_execd_server: SandgateServer
) -> Callable[[str], dict[str, Result]]:
    """The scenarios' results of one mode, run once on first use."""
    return by_mode(run_python, server, direct_execd_server)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", SDK_MODES)
def test_python_sdk(python_results: Callable[[str], dict[str, Result]], mode: str, scenario: str) -> None:
    check("python", lambda: python_results(mode), scenario)

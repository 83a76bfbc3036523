"""The shared client scenario list (scenarios.py) through `opensandbox-mcp` (1.1.1, unchanged,
over stdio), in direct mode and with `--use-server-proxy`, against a real `sandgate serve`.

One MCP server process and session per mode; each scenario is a few tool calls, made from the
test thread through an anyio blocking portal that owns the session. The tools it lacks are in
`scenarios.NOT_OFFERED["mcp"]`; what it expresses only in part is said at the scenario.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conformance.conftest import API_HOST
from tests.conformance.scenarios import (
    MODES,
    SCENARIOS,
    Result,
    check,
    check_execd_endpoint,
    run_in_order,
    steps_of,
)
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
VENV_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
DIR = "/tmp/mcp-conformance"
CALL_TIMEOUT_S = 60.0


class ToolError(AssertionError):
    pass


@asynccontextmanager
async def mcp_session(server: SandgateServer, mode: str) -> AsyncIterator[ClientSession]:
    args = [
        "--transport",
        "stdio",
        "--domain",
        server.domain,
        f"--api-key={server.api_key}",  # one word: a key may start with '-' (argparse: an option)
        "--protocol",
        "http",
    ]
    if mode == "server_proxy":
        args.append("--use-server-proxy")
    params = StdioServerParameters(command=str(VENV_BIN / "opensandbox-mcp"), args=args, env=server.env())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


class McpClient:
    """Each public method is one scenario the MCP server offers, in SCENARIOS order."""

    def __init__(
        self, server: SandgateServer, mode: str, portal: BlockingPortal, session: ClientSession
    ) -> None:
        self.server = server
        self.mode = mode
        self.portal = portal
        self.session = session
        self.id = ""
        self.killed = False

    def _tool(self, name: str, **arguments: Any) -> Any:
        """Call a tool; its structured result (or its JSON text), or ToolError with its text."""
        if name != "sandbox_create":
            arguments.setdefault("sandbox_id", self.id)
        result = self.portal.call(lambda: self.session.call_tool(name, arguments, CALL_TIMEOUT_S))
        text = "".join(getattr(part, "text", "") for part in result.content)
        if result.is_error:
            raise ToolError(f"{name}({arguments}): {text}")
        if result.structured_content is not None:
            content = result.structured_content
            return content.get("result", content) if set(content) == {"result"} else content
        return json.loads(text)

    def _run(self, command: str, **options: Any) -> Any:
        return self._tool("command_run", command=command, **options)

    def _stdout(self, execution: Any) -> list[str]:
        return [m["text"] for m in execution["logs"]["stdout"]]

    def _exists(self, path: str) -> bool:
        return self._run(f"test -e {path}").get("exit_code") == 0

    def create(self) -> None:
        created = self._tool(
            "sandbox_create",
            image=self.server.sandbox_image,
            entrypoint=["sleep", "infinity"],
            resource={"cpu": "1", "memory": "512Mi"},
            env={"GREETING": "hello from create"},
            metadata={"suite": "mcp"},
            network_policy={"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]},
        )
        self.id = created["sandbox_id"]
        info = self._tool("sandbox_get_info")
        assert info["status"]["state"] == "Running" and info["metadata"] == {"suite": "mcp"}, info
        assert self._stdout(self._run('printf %s "$GREETING"')) == ["hello from create"]

    def command_stream(self) -> None:
        """MCP answers once the command ended; the stream is its ordered messages."""
        execution = self._run('for i in 1 2 3; do echo "out $i"; echo "err $i" >&2; sleep 0.05; done')
        assert execution["exit_code"] == 0 and execution["complete"], execution
        assert self._stdout(execution) == ["out 1", "out 2", "out 3"]
        assert [m["text"] for m in execution["logs"]["stderr"]] == ["err 1", "err 2", "err 3"]

    def command_exit_code(self) -> None:
        execution = self._run("echo broken >&2; exit 3")
        assert execution["exit_code"] == 3 and execution["error"]["value"] == "3", execution
        assert [m["text"] for m in execution["logs"]["stderr"]] == ["broken"]

    def command_background(self) -> None:
        """No status or logs tool: the command's own file shows it ran on after the answer."""
        started = self._run(
            f"mkdir -p {DIR}; echo started > {DIR}/bg; sleep 0.5; echo finished >> {DIR}/bg", background=True
        )
        assert started["id"], started
        deadline = time.monotonic() + 15
        while (content := self._cat(f"{DIR}/bg")) != "started\nfinished":
            assert time.monotonic() < deadline, f"the background command did not finish: {content!r}"
            time.sleep(0.1)

    def _read(self, path: str) -> str:
        return str(self._tool("file_read", path=path)["content"])

    def _cat(self, path: str) -> str:
        """A file that may not exist yet, read without a failing tool call (the MCP server
        renders a failing call's traceback, which takes seconds to minutes)."""
        return "\n".join(self._stdout(self._run(f"cat {path} 2>/dev/null")))

    def command_interrupt(self) -> None:
        """No status tool: the interrupted command's process is gone (kill -0 fails)."""
        started = self._run(f"mkdir -p {DIR}; echo $$ > {DIR}/pid; exec sleep 60", background=True)
        until_pid = time.monotonic() + 15
        while not (pid := self._cat(f"{DIR}/pid").strip()):
            assert time.monotonic() < until_pid, "the background command never started"
            time.sleep(0.1)
        assert self._tool("command_interrupt", execution_id=started["id"])["status"] == "interrupted"
        deadline = time.monotonic() + 15
        while self._run(f"kill -0 {pid}")["exit_code"] == 0:
            assert time.monotonic() < deadline, "the interrupt did not stop the command"
            time.sleep(0.1)

    def files_write_read(self) -> None:
        """Text only (file_write takes a string); no info or list tool: search shows both."""
        self._tool("file_write", path=f"{DIR}/a.txt", content="alpha\nbeta\n", mode=644)
        assert self._read(f"{DIR}/a.txt") == "alpha\nbeta\n"
        (found,) = self._tool("file_search", path=DIR, pattern="*.txt")
        assert (found["path"], found["size"], found["mode"]) == (f"{DIR}/a.txt", 11, 644)

    def create_directories(self) -> None:
        self._tool("file_create_directories", entries=[{"path": f"{DIR}/d1/d2", "mode": 750}])
        assert self._stdout(self._run(f"stat -c %a:%F {DIR}/d1/d2")) == ["750:directory"]

    def delete_files(self) -> None:
        self._tool("file_write", path=f"{DIR}/gone.txt", content="soon gone")
        self._tool("file_delete", paths=[f"{DIR}/gone.txt"])
        assert not self._exists(f"{DIR}/gone.txt")

    def delete_directories(self) -> None:
        self._tool("file_write", path=f"{DIR}/tree/sub/leaf.txt", content="leaf")
        self._tool("file_delete_directories", paths=[f"{DIR}/tree"])
        assert not self._exists(f"{DIR}/tree")

    def replace_move_chmod(self) -> None:
        """No permissions tool: replace and move only."""
        self._tool("file_write", path=f"{DIR}/r.txt", content="hello world")
        replaced = self._tool(
            "file_replace_contents",
            entries=[{"path": f"{DIR}/r.txt", "old_content": "world", "new_content": "sandgate"}],
        )
        assert replaced[0]["replaced_count"] == 1, replaced
        self._tool("file_move", entries=[{"src": f"{DIR}/r.txt", "dest": f"{DIR}/moved.txt"}])
        assert self._read(f"{DIR}/moved.txt") == "hello sandgate"
        assert not self._exists(f"{DIR}/r.txt")

    def metrics(self) -> None:
        metrics = self._tool("sandbox_get_metrics")
        assert metrics["cpu_count"] > 0 and metrics["memory_total_in_mib"] > 0, metrics

    def endpoints(self) -> None:
        execd = self._tool("sandbox_get_endpoint", port=44772)
        check_execd_endpoint(self.server, self.id, self.mode, execd)

    def connect(self) -> None:
        connected = self._tool("sandbox_connect")
        assert connected["sandbox_id"] == self.id, connected
        assert self._stdout(self._run("echo connected")) == ["connected"]

    def kill(self) -> None:
        assert self._tool("sandbox_kill")["status"]
        self.killed = True
        with self.server.client() as client:  # not by a failing tool call (see _cat)
            assert client.get(f"/v1/sandboxes/{self.id}").status_code == 404

    def close(self) -> None:
        if self.id and not self.killed:
            with contextlib.suppress(ToolError):
                self._tool("sandbox_kill")


def run_mcp(server: SandgateServer, mode: str) -> dict[str, Result]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(mcp_session(server, mode)) as session,
    ):
        client = McpClient(server, mode, portal, session)
        try:
            return run_in_order("mcp", steps_of(client))
        finally:
            client.close()


@pytest.fixture(scope="module")
def mcp_results(server: SandgateServer) -> Callable[[str], dict[str, Result]]:
    """The scenarios' results of one mode, run once on first use."""
    return functools.cache(lambda mode: run_mcp(server, mode))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", MODES)
def test_mcp(mcp_results: Callable[[str], dict[str, Result]], mode: str, scenario: str) -> None:
    check("mcp", lambda: mcp_results(mode), scenario)

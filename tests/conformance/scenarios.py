"""The one list of client scenarios every OpenSandbox client runs against sandgate.

Each client implements every scenario under the same name, in direct and server-proxy mode:
the JS SDK in tests/js/scenarios.mjs (driven by test_js_sdk.py), the Python SDK in
test_sdk_scenarios.py. Each implementation's names are checked to be exactly this list, so a
scenario added here fails until every client runs it. The order is the order they run in, on
one sandbox: `create` first, `pause_resume`, `connect` and `kill` last. osb and the MCP server
(test_osb_scenarios.py, test_mcp_scenarios.py) run it too; what a client cannot express at all
is in `NOT_OFFERED` and reported as skipped with the reason.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest

from tests.support.server import SandgateServer

SCENARIOS: dict[str, str] = {
    "create": "create with metadata, env and a networkPolicy; the info says Running",
    "command_stream": "a command's stdout and stderr arrive through the stream handlers, in order",
    "command_exit_code": "a failing command reports its exit code and its stderr",
    "command_timeout": "a command past its timeout is killed and reported as failed",
    "command_background": "a background command answers at once; status and logs follow it",
    "command_interrupt": "a running command is interrupted by its id",
    "session_run": "a session keeps its cwd and environment between runs",
    "session_delete": "a deleted session can no longer run",
    "files_write_read": "write files, read them back as text and bytes, file info, list and search",
    "create_directories": "createDirectories with a mode makes nested directories",
    "delete_files": "deleteFiles removes files",
    "delete_directories": "deleteDirectories removes a directory tree",
    "replace_move_chmod": "replace contents, move a file, change its mode",
    "metrics": "cpu and memory metrics of the sandbox",
    "endpoints": "the execd endpoint and its URL, as the mode says (direct or through the server)",
    "egress": "egress policy get, patch (new rule first) and delete",
    "credential_vault": "create a credential and a binding; the state never shows the value",
    "pause_resume": "pause then resume; files survive and commands run again",
    "connect": "connect to the sandbox by id from a new client",
    "kill": "kill; the sandbox is gone",
}

# client -> {scenario: why the client cannot express it}: skipped for that client, with the reason.
# What a client can express of a scenario only in part is said where the client implements it.
NOT_OFFERED: dict[str, dict[str, str]] = {
    "mcp": {
        "command_timeout": "command_run has no timeout parameter",
        "session_run": "opensandbox-mcp has no session tools",
        "session_delete": "opensandbox-mcp has no session tools",
        "egress": "opensandbox-mcp has no egress tools",
        "credential_vault": "opensandbox-mcp has no credential-vault tools",
        "pause_resume": "opensandbox-mcp has no pause or resume tool",
    },
}

# runtime -> {scenario: why the runtime cannot offer it}: skipped for every client on it, with the
# reason (the client still runs the step; its outcome is not a result of the client).
NOT_ON_RUNTIME: dict[str, dict[str, str]] = {
    "kubernetes": {
        "pause_resume": "the kubernetes runtime refuses pause and resume: the API cannot freeze a Pod",
    },
}

Result = dict[str, Any]  # {"scenario": name, "ok": bool, "error": text when not ok}


def steps_of(client: object) -> dict[str, Callable[[], None]]:
    """A client object's scenario methods (named as the scenarios), in list order."""
    return {name: getattr(client, name) for name in SCENARIOS if hasattr(type(client), name)}


def offered(client: str) -> list[str]:
    return [name for name in SCENARIOS if name not in NOT_OFFERED.get(client, {})]


def run_in_order(client: str, steps: Mapping[str, Callable[[], None]]) -> dict[str, Result]:
    """Run a client's scenarios in list order; a failure is recorded and the next one runs."""
    assert list(steps) == offered(client), f"{client}'s scenarios {list(steps)} are not the list"
    results: dict[str, Result] = {}
    for name, step in steps.items():
        try:
            step()
            results[name] = {"scenario": name, "ok": True}
        except Exception:  # reported per scenario by `check`
            results[name] = {"scenario": name, "ok": False, "error": traceback.format_exc()}
    return results


def egress_endpoint_path(sandbox_id: str, mode: str) -> str:
    """Where the 18080 endpoint points: the proxied egress port in server-proxy mode, as
    OpenSandbox answers (sandgate serves the egress API there too)."""
    return f"/sandboxes/{sandbox_id}/" + ("proxy/18080" if mode == "server_proxy" else "egress")


def check_execd_endpoint(
    server: SandgateServer, sandbox_id: str, mode: str, endpoint: Mapping[str, Any]
) -> None:
    """Direct mode: the endpoint and its headers alone reach execd (no API key); server-proxy
    mode: the server's /proxy route, opened by the API key."""
    headers = dict(endpoint.get("headers") or {})
    if mode == "server_proxy":
        assert endpoint["endpoint"].endswith(f"/sandboxes/{sandbox_id}/proxy/44772"), endpoint
        headers["OPEN-SANDBOX-API-KEY"] = server.api_key
    ping = httpx.get(f"http://{endpoint['endpoint']}/ping", headers=headers, trust_env=False)
    assert ping.status_code == 200, ping.text


# How a client reaches the sandboxes: its direct mode (the 44772 endpoint is the host's reverse
# proxy, opened by the execd token), its server-proxy mode, and its direct mode against a server
# with `execd_endpoint = "direct"` (the endpoint is execd itself).
MODES = ("direct", "server_proxy")
SDK_MODES = (*MODES, "direct_execd")
Runner = Callable[[SandgateServer, str], dict[str, Result]]


def by_mode(
    run: Runner, server: SandgateServer, direct_server: SandgateServer
) -> Callable[[str], dict[str, Result]]:
    """`run(server, mode)` once per mode of SDK_MODES."""

    @functools.cache
    def results(mode: str) -> dict[str, Result]:
        return run(direct_server, "direct") if mode == "direct_execd" else run(server, mode)

    return results


def check(
    client: str, results: Callable[[], Mapping[str, Result]], scenario: str, runtime: str = "local"
) -> None:
    """One scenario's outcome as a test: skipped where the client or the runtime does not offer it."""
    if scenario in NOT_OFFERED.get(client, {}):
        pytest.skip(f"{client}: {NOT_OFFERED[client][scenario]}")
    if scenario in NOT_ON_RUNTIME.get(runtime, {}):
        pytest.skip(f"{runtime}: {NOT_ON_RUNTIME[runtime][scenario]}")
    result = results()[scenario]
    assert result["ok"], f"{client}: {scenario}: {SCENARIOS[scenario]}\n{result['error']}"

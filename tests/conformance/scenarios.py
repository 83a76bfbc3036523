"""The one list of client scenarios every OpenSandbox client runs against sandgate.

Each client implements every scenario under the same name, in direct and server-proxy mode:
the JS SDK in tests/js/scenarios.mjs (driven by test_js_sdk.py), the Python SDK in
test_sdk_scenarios.py. Each implementation's names are checked to be exactly this list, so a
scenario added here fails until every client runs it. The order is the order they run in, on
one sandbox: `create` first, `pause_resume`, `connect` and `kill` last.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

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

Result = dict[str, Any]  # {"scenario": name, "ok": bool, "error": text when not ok}


def run_in_order(steps: Mapping[str, Callable[[], None]]) -> dict[str, Result]:
    """Run a client's scenarios in list order; a failure is recorded and the next one runs."""
    assert list(steps) == list(SCENARIOS), f"the client's scenarios {list(steps)} are not the list"
    results: dict[str, Result] = {}
    for name, step in steps.items():
        try:
            step()
            results[name] = {"scenario": name, "ok": True}
        except Exception:  # reported per scenario by `check`
            results[name] = {"scenario": name, "ok": False, "error": traceback.format_exc()}
    return results


def check(results: Mapping[str, Result], scenario: str, client: str) -> None:
    result = results[scenario]
    assert result["ok"], f"{client}: {scenario}: {SCENARIOS[scenario]}\n{result['error']}"

"""The one list of client scenarios every OpenSandbox client runs against sandgate.

Each client implements every scenario under the same name: the JS SDK in tests/js/scenarios.mjs
(direct and server-proxy mode, driven by test_js_sdk.py). A test checks that each
implementation's names are exactly this list, so a scenario added here fails until every
client runs it. The order is the order they run in, on one sandbox: `create`
first, `pause_resume`, `connect` and `kill` last. A scenario a client cannot express (the MCP
server has no egress tool) is listed in `NOT_OFFERED` with the reason.
"""

from __future__ import annotations

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

# client -> {scenario: why the client cannot express it}
NOT_OFFERED: dict[str, dict[str, str]] = {}

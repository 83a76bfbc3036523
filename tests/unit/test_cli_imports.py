"""The CLI's import graph: `--help`, `policy check` and `policy explain` import no server stack.

Measured in bench/bench_cli.py; held here by what gets imported, not by a clock (a loaded
machine makes any time limit flaky, while an import that sneaks back in is exactly the bug).
"""

from __future__ import annotations

import http.server
import json
import socket
import socketserver
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar

from sandgate.lifecycle.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {
    "mitmproxy",
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "docker",
    "pyroute2",
    "hvac",
    "cryptography",
}

# Runs the CLI in-process in a fresh interpreter, then reports which top-level packages it imported.
PROBE = """
import json, sys
from sandgate.lifecycle.cli import main
try:
    main(sys.argv[1:], prog_name="sandgate")
except SystemExit:
    pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})), file=sys.stderr)
"""


def imported_by(*args: str, stdin: str | None = None) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1])), done.stdout


def test_help_and_policy_commands_import_no_server_stack() -> None:
    policy = str(ROOT / "examples" / "policy.yaml")
    for args in (
        ("--help",),
        ("policy", "--help"),
        ("policy", "check", policy),
        ("policy", "explain", policy, "https://api.example.com/v1/x"),
        ("sandbox", "--help"),
        ("logs", "--help"),
    ):
        modules, stdout = imported_by(*args)
        assert stdout, f"sandgate {' '.join(args)} printed nothing"
        assert modules.isdisjoint(HEAVY), f"sandgate {' '.join(args)} imported {modules & HEAVY}"
    top_help, _ = imported_by("--help")
    assert top_help.isdisjoint({"pydantic", "yaml", "sandgate.policy"}), "--help imports only click"


def test_the_listed_help_is_each_commands_own() -> None:
    """`--help` lists COMMANDS' help without importing the modules; it must say what they say."""
    for name, (_, _, listed) in COMMANDS.items():
        command = main.get_command(None, name)  # type: ignore[arg-type]
        assert command is not None
        assert listed == command.get_short_help_str(limit=80), f"update COMMANDS[{name!r}]"


def test_host_side_commands_import_no_web_stack(tmp_path: Path) -> None:
    """`logs` and `vault` read the state dir; they build their parts in lifecycle/wiring.py, which
    imports a server's parts only when it builds them."""
    server_stack = {"mitmproxy", "fastapi", "starlette", "uvicorn", "docker", "pyroute2"}
    state = str(tmp_path / "state")
    # what each command must have imported to do its work (the index; the local vault's cipher)
    for args, worked in ((("logs",), "sqlite3"), (("vault", "list"), "cryptography")):
        modules, _ = imported_by("--state-dir", state, *args)
        assert worked in modules, f"sandgate {' '.join(args)} did not run"
        assert modules.isdisjoint(server_stack), (
            f"sandgate {' '.join(args)} imported {modules & server_stack}"
        )


class _ControlHandler(http.server.BaseHTTPRequestHandler):
    """A stand-in for the proxy's control socket that records what it was asked (the point of
    the test is what the CLI imports to talk to it, not the proxy)."""

    asked: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.asked.append(
            f"{self.command} {self.path} {self.rfile.read(int(self.headers['content-length']))!r}"
        )
        body = b'{"refreshed": 1}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


class _UnixHTTPServer(socketserver.UnixStreamServer):
    def get_request(self) -> tuple[socket.socket, str]:
        sock, _ = super().get_request()
        return sock, "unix"


def test_vault_put_tells_the_proxy_without_loading_it(tmp_path: Path) -> None:
    """`sandgate vault put` tells a running proxy over its control socket through the proxy's
    contract (httpx), never loading mitmproxy or the proxy's web server."""
    from sandgate.proxy import control_socket

    state = tmp_path / "state"
    state.mkdir()
    server = _UnixHTTPServer(str(control_socket(state)), _ControlHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        modules, _ = imported_by("--state-dir", str(state), "vault", "put", "api-token", stdin="s3cret\n")
    finally:
        server.shutdown()
        server.server_close()
    assert _ControlHandler.asked == ['POST /vault/changed b\'{"names":["api-token"]}\'']
    assert "httpx" in modules
    assert modules.isdisjoint({"mitmproxy", "fastapi", "starlette", "uvicorn"}), modules

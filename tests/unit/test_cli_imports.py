"""The CLI's import graph: `--help`, `policy check` and `policy explain` import no server stack.

Measured in bench/bench_cli.py; held here by what gets imported, not by a clock (a loaded
machine makes any time limit flaky, while an import that sneaks back in is exactly the bug).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def imported_by(*args: str) -> tuple[set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120, cwd=ROOT
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

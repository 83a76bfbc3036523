"""The README's quickstart, run as written: each line of its command block goes through bash in
the repository, against the package's real server and test internet. Only what names this
machine differs: the server's address and its key file (the README's are the defaults), and the
sandbox id the create printed for `<id>`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.conftest import API_HOST, PATCHED_HOST
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[2]
README_DOMAIN = "127.0.0.1:8080"
README_KEY_FILE = "/var/lib/sandgate/api_key"


def quickstart_commands() -> list[str]:
    """The lines of the quickstart's second sh block (the one that talks to the server)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [line for line in blocks[1].splitlines() if line.strip()]


@pytest.fixture
def example_names(internet: Internet) -> Iterator[None]:
    """example.com and www.example.com on the test origin (the package's names kept)."""
    kept = {API_HOST: [ORIGIN_V4], PATCHED_HOST: [ORIGIN_V4]}
    internet.set_names({**kept, "example.com": [ORIGIN_V4], "www.example.com": [ORIGIN_V4]})
    try:
        yield
    finally:
        internet.set_names(kept)


def test_the_readme_quickstart_runs_as_written(
    server: SandgateServer, example_names: None, tmp_path: Path
) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(server.api_key + "\n")
    env = {**server.env(), "SANDGATE_STATE_DIR": str(server.state_dir)}
    del env["OPEN_SANDBOX_DOMAIN"], env["OPEN_SANDBOX_API_KEY"]  # the README's export sets them
    export, *commands = quickstart_commands()
    assert (
        export == f"export OPEN_SANDBOX_DOMAIN={README_DOMAIN} OPEN_SANDBOX_API_KEY=$(cat {README_KEY_FILE})"
    )
    prelude = export.replace(README_DOMAIN, server.domain).replace(README_KEY_FILE, str(key_file))
    sandbox_id = "<id>"
    outputs: list[str] = []
    try:
        for command in commands:
            done = subprocess.run(
                ["bash", "-c", f"{prelude}\n{command.replace('<id>', sandbox_id)}"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            refused = "refused: not in the policy" in command
            assert done.returncode == (6 if refused else 0), f"{command}\n{done.stdout}{done.stderr}"
            outputs.append(done.stdout + done.stderr if refused else done.stdout)
            if " sandbox create " in command:
                sandbox_id = json.loads(done.stdout)["id"]
    finally:
        if sandbox_id != "<id>":
            with server.client() as client:
                client.delete(f"/v1/sandboxes/{sandbox_id}")
    by_command = dict(zip(commands, outputs, strict=True))
    curls = [output.strip() for command, output in by_command.items() if "curl" in command]
    assert curls == ["200", "curl: (6) Could not resolve host: www.example.com"]  # as the README says
    logs = next(output for command, output in by_command.items() if " logs " in command)
    assert "www.example.com" in logs and "deny" in logs and "example.com" in logs
    assert "Linux" in next(output for command, output in by_command.items() if "uname" in command)
    assert by_command[commands[-1]].strip() == f"deleted {sandbox_id}"

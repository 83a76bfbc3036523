"""`sandgate vault ...`, the real command (tests/support/cli.py): no output and no state file
holds a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.vault import generate_master_key, secret_forms
from tests.support.cli import Ran, sandgate

SECRET = "sk-CLI_test-secret/value+42"
ROTATED = "sk-CLI_rotated-secret/value+43"


class Cli:
    """Runs `sandgate` with a fresh state dir and keeps every byte it printed."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.outputs: list[bytes] = []

    def __call__(self, *args: str, stdin: str = "", ok: bool = True, **env: str) -> Ran:
        done = sandgate(*args, stdin=stdin, env={"SANDGATE_STATE_DIR": str(self.state_dir), **env})
        self.outputs += [done.stdout.encode(), done.stderr.encode()]
        assert (done.returncode == 0) == ok, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr}"
        return done


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "state")


def assert_no_value_anywhere(cli: Cli, *values: str) -> None:
    state = [p.read_bytes() for p in cli.state_dir.rglob("*") if p.is_file()]
    assert state and cli.outputs
    for value in values:
        for form in secret_forms(value):
            for blob in cli.outputs + state:
                assert form not in blob, f"found {form!r}"


def test_session_with_key_file(cli: Cli) -> None:
    """A full CLI session; at the end every byte printed and every state file is searched for the secrets."""
    assert "stored github (version 1)" in cli("vault", "put", "github", stdin=SECRET + "\n").stdout
    assert "stored github (version 2)" in cli("vault", "put", "github", stdin=ROTATED).stdout
    cli("vault", "put", "other", stdin="user:" + SECRET)
    assert "never from the command line" in cli("vault", "put", "x", SECRET, ok=False).stderr
    assert "empty value" in cli("vault", "put", "x", stdin="", ok=False).stderr
    assert "invalid secret name" in cli("vault", "put", "bad name", stdin=SECRET, ok=False).stderr
    listed = cli("vault", "list").stdout.splitlines()
    assert listed[0].split() == ["NAME", "VERSION", "UPDATED"]
    assert [line.split()[:2] for line in listed[1:]] == [["github", "2"], ["other", "1"]]
    key_before = (cli.state_dir / "vault.key").read_bytes()
    assert "rotated the master key" in cli("vault", "rotate-key").stdout
    assert (cli.state_dir / "vault.key").read_bytes() != key_before
    assert '"name":"github","version":2' in cli("vault", "list", "--json").stdout
    assert "removed github" in cli("vault", "rm", "github").stdout
    assert "no credential named 'github'" in cli("vault", "rm", "github", ok=False).stderr
    cli("vault", "rm", "github", "--missing-ok")
    assert_no_value_anywhere(cli, SECRET, ROTATED, "user:" + SECRET)
    (cli.state_dir / "vault.key").unlink()
    assert "key file" in cli("vault", "list", ok=False).stderr


def test_session_with_key_from_environment(cli: Cli) -> None:
    old, new = generate_master_key(), generate_master_key()
    cli("vault", "put", "github", stdin=SECRET, SANDGATE_VAULT_KEY=old)
    assert not (cli.state_dir / "vault.key").exists()
    cli("vault", "rotate-key", stdin=new, SANDGATE_VAULT_KEY=old)
    wrong = cli("vault", "list", ok=False, SANDGATE_VAULT_KEY=old).stderr
    assert wrong.startswith("Error: the master key does not open")
    assert "not base64" in cli("vault", "list", ok=False, SANDGATE_VAULT_KEY="%%%").stderr
    generated = cli("vault", "rotate-key", "--generate", SANDGATE_VAULT_KEY=new).stdout.strip()
    assert "github" in cli("vault", "list", SANDGATE_VAULT_KEY=generated).stdout
    assert_no_value_anywhere(cli, SECRET)

"""`sandgate sandbox ...` and `sandgate egress ...` against the running server (osb-style config)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server import SandgateServer

pytestmark = pytest.mark.root


def sandgate(server: SandgateServer, *args: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sandgate.lifecycle.cli", *args],
        env=server.env(), capture_output=True, text=text, timeout=60,
    )  # fmt: skip


def test_sandbox_and_egress_commands(server: SandgateServer) -> None:
    created = sandgate(server, "sandbox", "create", "-m", "via=cli", "-o", "json")
    assert created.returncode == 0, created.stderr
    sandbox_id = json.loads(created.stdout)["id"]
    try:
        assert sandbox_id in sandgate(server, "sandbox", "list").stdout
        ran = sandgate(server, "sandbox", "exec", sandbox_id, "echo", "cli-exec")
        assert ran.stdout.strip() == "cli-exec" and ran.returncode == 0
        assert sandgate(server, "sandbox", "exec", sandbox_id, "sh", "-c", "exit 4").returncode == 4

        assert sandgate(server, "egress", "set", sandbox_id, "--rule", "allow=a.example.com").returncode == 0
        patched = sandgate(
            server, "egress", "patch", sandbox_id, "--rule", "deny=b.example.com", "-o", "json"
        )
        assert [r["target"] for r in json.loads(patched.stdout)["policy"]["egress"]] == [
            "b.example.com",
            "a.example.com",
        ]
        sandgate(server, "egress", "delete", sandbox_id, "b.example.com")
        shown = json.loads(sandgate(server, "egress", "get", sandbox_id, "-o", "json").stdout)
        assert [r["target"] for r in shown["policy"]["egress"]] == ["a.example.com"] and shown[
            "revision"
        ] == 4
        bad = sandgate(server, "egress", "set", sandbox_id, "--rule", "allow=")
        assert bad.returncode != 0 and "action=target" in bad.stderr
    finally:
        assert sandgate(server, "sandbox", "rm", sandbox_id).returncode == 0


def test_egress_set_file_reports_mistakes_at_their_line(server: SandgateServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\negress:\n  - {action: allow, target: a.example.com}\n"
        "  - {action: alow, target: b.example.com}\n"
    )
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\negress:\n  - {action: allow, target: a.example.com}\n")
    sandbox_id = json.loads(sandgate(server, "sandbox", "create", "-o", "json").stdout)["id"]
    try:
        refused = sandgate(server, "egress", "set", sandbox_id, "--file", str(bad))
        assert refused.returncode == 2
        assert refused.stdout == f"{bad}:4:6: action: input should be 'allow', 'deny' or 'ask'\n"
        assert "<api>" not in refused.stdout + refused.stderr
        shown = json.loads(sandgate(server, "egress", "get", sandbox_id, "-o", "json").stdout)
        assert shown["revision"] == 1 and shown["policy"]["egress"] == []  # nothing was sent
        assert sandgate(server, "egress", "set", sandbox_id, "--file", str(good)).returncode == 0
    finally:
        assert sandgate(server, "sandbox", "rm", sandbox_id).returncode == 0


def test_sandbox_exec_passes_argv_and_output_exactly(server: SandgateServer) -> None:
    """argv reaches the sandbox word for word (no shell), lines keep their breaks, bytes stay bytes."""
    created = sandgate(server, "sandbox", "create", "-o", "json")
    sandbox_id = json.loads(created.stdout)["id"]
    try:

        def run(*argv: str, mode: str = "--exact") -> subprocess.CompletedProcess[bytes]:
            return sandgate(server, "sandbox", "exec", sandbox_id, mode, "--", *argv, text=False)

        for mode in ("--exact", "--stream"):
            quoted = run("echo", "a  b;id -u", mode=mode)
            assert (quoted.returncode, quoted.stdout) == (0, b"a  b;id -u\n"), (mode, quoted)
            assert run("seq", "1", "5", mode=mode).stdout == b"1\n2\n3\n4\n5\n", mode
            blank = run("printf", "x\\n\\ny\\n", mode=mode)
            assert blank.stdout == b"x\n\ny\n", (mode, blank)
            failed = run("sh", "-c", "echo out; echo err >&2; exit 3", mode=mode)
            assert (failed.returncode, failed.stdout, failed.stderr) == (3, b"out\n", b"err\n"), mode
        every_byte = run("python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)) * 3)")
        assert every_byte.returncode == 0 and every_byte.stdout == bytes(range(256)) * 3
        no_newline = run("printf", "%s", "tail")
        assert no_newline.stdout == b"tail"
        missing = run("no-such-command-here")
        assert missing.returncode == 127 and b"no-such-command-here" in missing.stderr
        leftovers = run("sh", "-c", "ls -a /tmp | grep -F .sandgate-exec-; true", mode="--stream")
        assert leftovers.stdout == b"", leftovers  # the exact mode's output files are removed
    finally:
        sandgate(server, "sandbox", "rm", sandbox_id)

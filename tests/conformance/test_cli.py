"""`sandgate sandbox ...` and `sandgate egress ...` against the running server (osb-style config)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.server import SandgateServer

pytestmark = pytest.mark.root


def sandgate(server: SandgateServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sandgate.lifecycle.cli", *args],
        env=server.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_sandbox_and_egress_commands(server: SandgateServer) -> None:
    created = sandgate(server, "sandbox", "create", "-m", "via=cli", "-o", "json")
    assert created.returncode == 0, created.stderr
    sandbox_id = json.loads(created.stdout)["id"]
    try:
        assert sandbox_id in sandgate(server, "sandbox", "list").stdout
        ran = sandgate(server, "sandbox", "exec", sandbox_id, "echo", "cli-exec")
        assert ran.stdout.strip() == "cli-exec" and ran.returncode == 0
        assert sandgate(server, "sandbox", "exec", sandbox_id, "exit", "4").returncode == 4

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

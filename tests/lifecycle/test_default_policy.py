"""The operator's default policy (`default_policy`): a create that carries no networkPolicy gets
it (unset: deny everything, unlike OpenSandbox, which leaves egress open); a create with its own
policy gets its own. Proven from the proxy's side: the DNS answers' audit records for a name the
default allows and one it does not. A default policy file with a fault stops the server from
starting, with the file:line of the fault."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.audit import dns_decision
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root

DEFAULT = """\
# the fleet's default: one index and the operator's preset for its files, nothing else
include: [preset:files]
egress:
  - action: allow
    target: index.example.test
"""
PRESET = """\
preset: {version: 1, description: the index's file host, risk: uploads leave through it}
egress:
  - action: allow
    target: files.example.test
    ports: [443]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandgateServer]:
    root = tmp_path_factory.mktemp("default-policy")
    (root / "default.yaml").write_text(DEFAULT)
    (root / "presets").mkdir()
    (root / "presets" / "files.yaml").write_text(PRESET)
    settings = {
        "SANDGATE_DEFAULT_POLICY": str(root / "default.yaml"),
        "SANDGATE_PRESET_DIRS": f'["{root}/presets"]',
    }
    with sandgate_server(root, settings) as running:
        yield running


def test_a_create_without_a_policy_gets_the_default(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox()["id"]
    policy = server.client().get(f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy").json()
    assert [rule["target"] for rule in policy["policy"]["egress"]] == [
        "index.example.test",
        "files.example.test",
    ]
    server.run(sandbox_id, "getent hosts index.example.test files.example.test other.example.test")
    assert dns_decision(server.state_dir, sandbox_id, "index.example.test") == "allow"
    assert dns_decision(server.state_dir, sandbox_id, "files.example.test") == "allow"  # from the preset
    assert dns_decision(server.state_dir, sandbox_id, "other.example.test") == "deny"


def test_a_create_with_its_own_policy_does_not_get_the_default(server: SandgateServer) -> None:
    own = {"defaultAction": "deny", "egress": [{"action": "allow", "target": "own.example.test"}]}
    sandbox_id = server.create_sandbox(networkPolicy=own)["id"]
    server.run(sandbox_id, "getent hosts own.example.test index.example.test")
    assert dns_decision(server.state_dir, sandbox_id, "own.example.test") == "allow"
    assert dns_decision(server.state_dir, sandbox_id, "index.example.test") == "deny"


def test_a_policy_sent_later_may_include_the_operators_presets(server: SandgateServer) -> None:
    sandbox_id = server.create_sandbox()["id"]
    url = f"/v1/sandboxes/{sandbox_id}/egress/sandgate-policy"
    with server.client() as client:
        sent = client.put(url, json={"policy": {"include": ["preset:files"], "egress": []}})
        unknown = client.put(url, json={"policy": {"include": ["preset:nope"], "egress": []}})
    assert sent.status_code == 200, sent.text
    assert [rule["target"] for rule in sent.json()["policy"]["egress"]] == ["files.example.test"]
    assert unknown.status_code == 400 and "unknown preset 'nope'" in unknown.text and "files" in unknown.text


def test_a_faulty_default_policy_stops_the_server_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "default.yaml"
    bad.write_text("egress:\n  - action: allow\n    target: index.example.test\n    ports: [99999]\n")
    done = subprocess.run(
        [sys.executable, "-m", "sandgate.lifecycle.cli", "--state-dir", str(tmp_path / "state"), "serve"],
        env={"PATH": "/usr/bin:/bin", "SANDGATE_DEFAULT_POLICY": str(bad)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"setting default_policy: {bad}:4:5: port 99999 is out of range" in done.stderr, done.stderr
    assert not (tmp_path / "state" / "proxy.json").exists()  # nothing was started

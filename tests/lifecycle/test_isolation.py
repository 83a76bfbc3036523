"""Which isolation a sandbox gets (lifecycle/isolation.py, the settings), and that a server
which cannot give gvisor refuses it, never starts the sandbox as standard instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.isolation import ISOLATION_KEY, choose
from sandgate.lifecycle.settings import load_settings
from tests.support.server import SandgateServer, sandgate_server


def test_the_extension_wins_over_the_servers_default() -> None:
    assert choose({ISOLATION_KEY: "gvisor"}, "standard", ("standard", "gvisor")) == "gvisor"
    assert choose({}, "gvisor", ("standard", "gvisor")) == "gvisor"
    assert choose({"other": "x"}, "standard", ("standard",)) == "standard"


def test_unknown_and_unavailable_isolations_are_refused() -> None:
    with pytest.raises(LifecycleError, match="choose one of standard, gvisor") as unknown:
        choose({ISOLATION_KEY: "kata"}, "standard", ("standard", "gvisor"))
    assert unknown.value.kind == "invalid"
    with pytest.raises(LifecycleError, match="apt-get install runsc") as missing:
        choose({ISOLATION_KEY: "gvisor"}, "standard", ("standard",))
    assert missing.value.kind == "unsupported"


def test_opensandbox_secure_runtime_maps_onto_isolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SANDGATE_ISOLATION", raising=False)
    config = tmp_path / "config.toml"
    config.write_text('[secure_runtime]\ntype = "gvisor"\ndocker_runtime = "runsc"\n')
    assert load_settings(config).isolation == "gvisor"
    config.write_text('isolation = "standard"\n[secure_runtime]\ntype = "gvisor"\n')
    assert load_settings(config).isolation == "standard"  # the own setting wins
    config.write_text('[secure_runtime]\ntype = "kata"\n')
    with pytest.raises(ValueError, match=r"setting secure_runtime: .*'kata' has no sandgate isolation"):
        load_settings(config)


@pytest.mark.root
def test_a_server_without_runsc_refuses_gvisor_and_says_what_to_install(tmp_path: Path) -> None:
    with sandgate_server(tmp_path, {"SANDGATE_RUNSC": "/nonexistent/runsc"}) as server:
        body = {"image": {"uri": "sandgate/host"}, "entrypoint": ["sleep", "infinity"], "resourceLimits": {}}
        with server.client() as client:
            refused = client.post("/v1/sandboxes", json={**body, "extensions": {ISOLATION_KEY: "gvisor"}})
            assert refused.status_code == 400, refused.text
            assert "apt-get install runsc" in refused.json()["message"]
            assert client.get("/v1/sandboxes").json()["items"] == []  # nothing started instead
        created = server.create_sandbox()
        assert created["extensions"] == {ISOLATION_KEY: "standard"}
        records = [json.loads(line) for line in server.state_dir.glob("audit*.jsonl").__next__().open()]
        [create] = [r for r in records if r["event"] == "create" and r["sandbox"] == created["id"]]
        assert json.loads(create["detail"])["isolation"] == "standard"


@pytest.mark.root
def test_a_server_defaulting_to_gvisor_without_runsc_refuses_to_start(tmp_path: Path) -> None:
    server = SandgateServer(
        tmp_path / "state", {"SANDGATE_ISOLATION": "gvisor", "SANDGATE_RUNSC": "/nonexistent/runsc"}
    )
    try:
        with pytest.raises(
            RuntimeError, match=r"setting `isolation` .* is 'gvisor', which this host's local runtime"
        ):
            server.start()
    finally:
        server.stop()
        server.remove_leftovers()

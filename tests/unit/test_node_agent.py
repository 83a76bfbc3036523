"""The node agent's pure parts (lifecycle/node.py, node_client.py) and the memory vault: what
they promise without a cluster. The agent on a real cluster: tests/kubernetes/test_node_proxy.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cryptography import x509
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sandgate.lifecycle.node import (
    NodeAgent,
    NodeAgentConfig,
    NodeEntry,
    NodeError,
    node_app,
    read_audit,
    read_token,
)
from sandgate.lifecycle.settings import KubernetesSettings
from sandgate.proxy import SandboxEntry, VaultValues, ensure_ca
from sandgate.vault import MemoryStore, SecretNotFound

SECRET = "sk-unit-0123456789abcdef"
POLICY = {
    "version": 1,
    "defaultAction": "deny",
    "egress": [{"action": "allow", "target": "api.example.com"}],
    "bindings": [
        {
            "name": "api",
            "credential": "token",
            "match": {"hosts": ["api.example.com"]},
            "auth": {"type": "bearer"},
        }
    ],
}


def test_memory_store_keeps_values_in_memory_and_versions_them() -> None:
    store = MemoryStore()
    assert store.put("token", "one").version == 1
    assert store.put("token", SECRET).version == 2
    assert store.reveal("token") == SECRET
    assert SECRET not in repr(store)
    assert [info.name for info in store.list()] == ["token"]
    assert store.delete("token") and not store.delete("token")
    with pytest.raises(SecretNotFound):
        store.reveal("token")


def test_pushed_values_never_show_in_a_repr_or_an_error() -> None:
    pushed = NodeEntry.model_validate(
        {
            "entry": {"sandbox_id": "s", "address": "10.232.0.5", "policy": POLICY},
            "secrets": {"token": SECRET},
        }
    )
    assert SECRET not in repr(pushed) and SECRET not in pushed.model_dump_json()
    assert json.loads(pushed.revealed_json())["secrets"] == {"token": SECRET}
    values = VaultValues.model_validate({"values": {"token": SECRET}})
    assert SECRET not in repr(values) and json.loads(values.revealed_json())["values"] == {"token": SECRET}
    with pytest.raises(ValidationError) as refused:
        NodeEntry.model_validate({"entry": {"address": "x"}, "secrets": {"token": SECRET}, "extra": SECRET})
    assert SECRET not in str(refused.value)


def test_the_vault_names_an_entry_reads_follow_its_credential_map() -> None:
    entry = SandboxEntry(
        sandbox_id="s", address="10.232.0.5", policy=POLICY, credentials={"token": "team-token"}
    )
    assert entry.vault_names() == {"team-token"}
    assert entry.model_copy(update={"credentials": {}}).vault_names() == {"token"}


def write_lines(path: Path, *ids: str) -> None:
    with path.open("a") as handle:
        for record_id in ids:
            handle.write(json.dumps({"id": record_id}) + "\n")


def test_the_audit_cursor_reads_whole_lines_and_follows_a_rotation(tmp_path: Path) -> None:
    live = tmp_path / "audit.jsonl"
    write_lines(live, "a", "b")
    with live.open("a") as handle:
        handle.write('{"id": "cut')  # a line being written: not shipped yet
    first = read_audit(tmp_path, 0, 0, 1 << 20)
    assert [json.loads(line)["id"] for line in first.lines] == ["a", "b"]
    assert first.file == live.stat().st_ino
    with live.open("a") as handle:
        handle.write('"}\n')
    os.replace(live, tmp_path / "audit.jsonl.1")  # the proxy rotates
    write_lines(live, "c")
    second = read_audit(tmp_path, first.file, first.offset, 1 << 20)
    assert [json.loads(line)["id"] for line in second.lines] == ["cut"]
    third = read_audit(tmp_path, second.file, second.offset, 1 << 20)
    assert [json.loads(line)["id"] for line in third.lines] == ["c"] and third.file == live.stat().st_ino
    assert read_audit(tmp_path, third.file, third.offset, 1 << 20).lines == []


def test_a_cursor_whose_file_is_gone_restarts_at_the_oldest_kept(tmp_path: Path) -> None:
    write_lines(tmp_path / "audit.jsonl", "a")
    assert [json.loads(line)["id"] for line in read_audit(tmp_path, 123456789, 40, 1 << 20).lines] == ["a"]


def test_node_agent_settings_come_whole() -> None:
    with pytest.raises(ValidationError, match="node_agent_ca and node_agent_token_file"):
        KubernetesSettings.model_validate({"node_agent_port": 15443})
    with pytest.raises(ValidationError, match="need node_agent_port"):
        KubernetesSettings.model_validate({"node_agent_ca": "/etc/ca.pem"})
    whole = {"node_agent_port": 15443, "node_agent_ca": "/ca.pem", "node_agent_token_file": "/token"}
    assert KubernetesSettings.model_validate(whole).node_agent_port == 15443


def test_the_agent_serves_the_certificate_of_the_ca_its_proxy_signs_with(tmp_path: Path) -> None:
    """The CA the server hands a Pod (GET /v1/ca) is the one in the state dir the node's proxy
    reads (its mitmproxy confdir), made on the node: the answer carries no key."""
    state_dir = tmp_path / "state"
    config = NodeAgentConfig(state_dir, ("127.0.0.1", 0), tmp_path / "c", tmp_path / "k", tmp_path / "t")
    token = "t" * 32
    api = TestClient(node_app(NodeAgent(config), token))
    assert api.get("/v1/ca").status_code == 401
    served = api.get("/v1/ca", headers={"authorization": f"Bearer {token}"})
    assert served.status_code == 200, served.text
    proxy_ca = ensure_ca(state_dir)  # what the proxy finds at its start: the same files
    assert served.text == proxy_ca.cert.read_text()
    assert "PRIVATE KEY" not in served.text and "PRIVATE KEY" in proxy_ca.key_and_cert.read_text()
    certificate = x509.load_pem_x509_certificate(served.content)
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


@pytest.mark.parametrize(
    ("mode", "own_group", "taken"),
    [
        (0o600, True, True),
        (0o400, True, True),
        (0o440, True, True),  # a Secret mounted for a non-root Pod: group is the Pod's fsGroup
        (0o440, False, False),  # someone else's group
        (0o460, True, False),  # the group may write it
        (0o444, True, False),
        (0o604, True, False),
    ],
)
def test_a_token_file_open_beyond_its_owner_and_own_group_is_refused(
    tmp_path: Path, mode: int, own_group: bool, taken: bool
) -> None:
    path = tmp_path / "token"
    path.write_text("t" * 32 + "\n")
    os.chown(path, -1, os.getegid() if own_group else os.getegid() + 1)
    path.chmod(mode)
    if taken:
        assert read_token(path) == "t" * 32
    else:
        with pytest.raises(NodeError, match="readable by group or others"):
            read_token(path)

"""The vault's secrets live where docs/operations.md says and nowhere else: with the master key
or the OpenBao credentials given as settings, a serve that opens the vault (the server for the
vault CLI, the proxy for a binding) leaves none of them in any file under the state dir, in the
proxy's command line or in its environment. They reach the proxy through a pipe."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import hvac
import pytest

from sandgate.vault import generate_master_key
from tests.support.openbao import OpenBao, openbao_dev_server
from tests.support.server import SANDGATE, SandgateServer, sandgate_server

pytestmark = pytest.mark.root
CREDENTIAL = "api-token"
DOCUMENTED = {"api_key", "vault.key"}  # and the CA key, which holds none of these values
POLICY = (
    "version: 1\ndefaultAction: deny\negress:\n  - {action: allow, target: api.example.test}\n"
    f"bindings:\n  - name: api\n    credential: {CREDENTIAL}\n"
    "    match: {hosts: [api.example.test]}\n    auth: {type: bearer}\n"
)


@pytest.fixture(scope="module")
def bao() -> Iterator[OpenBao]:
    with openbao_dev_server() as server:
        yield server


def approle(bao: OpenBao) -> tuple[str, str]:
    """An AppRole that may use the KV mount: (role id, secret id)."""
    client = hvac.Client(url=bao.addr, token=bao.root_token)
    if "approle/" not in client.sys.list_auth_methods():
        client.sys.enable_auth_method("approle")
    client.sys.create_or_update_policy(
        "sandgate", 'path "secret/*" { capabilities = ["create", "read", "update", "delete", "list"] }'
    )
    client.auth.approle.create_or_update_approle("sandgate", token_policies=["sandgate"])
    role_id = client.auth.approle.read_role_id("sandgate")["data"]["role_id"]
    secret_id = client.auth.approle.generate_secret_id("sandgate")["data"]["secret_id"]
    return role_id, secret_id


def settings_for(backend: str, bao: OpenBao) -> tuple[dict[str, str], list[str]]:
    """The server's environment for `backend` and the secret values in it."""
    if backend == "local":
        key = generate_master_key()
        return {"SANDGATE_VAULT_KEY": key}, [key]
    openbao = {"SANDGATE_VAULT_BACKEND": "openbao", "SANDGATE_OPENBAO_ADDR": bao.addr}
    if backend == "openbao-token":
        return {**openbao, "SANDGATE_OPENBAO_TOKEN": bao.root_token}, [bao.root_token]
    role_id, secret_id = approle(bao)
    return {**openbao, "SANDGATE_OPENBAO_ROLE_ID": role_id, "SANDGATE_OPENBAO_SECRET_ID": secret_id}, [
        secret_id
    ]


def sandgate(server: SandgateServer, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [*SANDGATE, *args],
        env={**server.server_env(), **server.env()},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"sandgate {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def files_holding(state_dir: Path, values: list[str]) -> list[str]:
    found = []
    for path in sorted(state_dir.rglob("*")):
        # a sandbox's filesystem image is read through its mount (sandboxes/<id>/disk) instead
        if path.is_file() and not path.is_symlink() and path.name not in DOCUMENTED and path.suffix != ".img":
            data = path.read_bytes()
            found += [f"{path}: value {n}" for n, value in enumerate(values) if value.encode() in data]
    return found


@pytest.mark.parametrize("backend", ["local", "openbao-token", "openbao-approle"])
def test_no_vault_secret_in_any_state_file(backend: str, bao: OpenBao, tmp_path: Path) -> None:
    env, secrets = settings_for(backend, bao)
    with sandgate_server(tmp_path, env) as server:
        sandgate(server, "vault", "put", CREDENTIAL, stdin="value-of-the-credential")
        sandbox_id = server.create_sandbox()["id"]
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        # the proxy reads the binding's credential from the vault when the policy is pushed: this
        # succeeds only if the secrets that open the vault reached it
        sandgate(server, "egress", "set", sandbox_id, "--file", str(policy))
        proxy = Path("/proc", str(server.proxy_pid()))
        process_text = (proxy / "cmdline").read_bytes() + (proxy / "environ").read_bytes()
        assert not [value for value in secrets if value.encode() in process_text]
        assert b"--secrets-fd" in (proxy / "cmdline").read_bytes()
        assert not files_holding(server.state_dir, secrets)
        server.stop()
    assert not files_holding(server.state_dir, secrets)

"""No secret in any log: a realistic first session, then every file it left is searched.

A server starts as on a first start (API key and vault master key generated into the state dir)
and logs every request (`--log-level info`). The session: console login (form POST), console
pages, the sandgate CLI against the API (create, list, egress set, vault put, exec), a sandbox
whose requests get a credential injected from the vault and one inline in its credential
vault, `sandgate logs` (table, JSON, OCSF, summary), a server restart. Then the API key, the
vault master key and both credential values must appear nowhere: not in serve's output, the
proxy's log, the audit log and its index, the database, any other file of the state dir (the
key files themselves excepted), nor in anything a CLI command printed.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conformance.conftest import API_HOST
from tests.support.internet import DNS_ADDR, Internet
from tests.support.server import SANDGATE, SandgateServer, sandgate_server

pytestmark = pytest.mark.root
VAULT_SECRET = "vault-value-7f3a9c"  # stored with `sandgate vault put`
INLINE_SECRET = "inline-value-51d2e0"  # sent inline to the credential-vault API
KEY_FILES = {"api_key", "vault.key"}  # where the two keys are meant to be (mode 0600)


def cli(server: SandgateServer, outputs: list[str], *args: str, stdin: str | None = None) -> str:
    env = {**server.env(), "SANDGATE_STATE_DIR": str(server.state_dir)}
    done = subprocess.run(
        [*SANDGATE, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, f"sandgate {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def console_session(server: SandgateServer, sandbox_id: str) -> None:
    with httpx.Client(base_url=server.base_url, trust_env=False, timeout=30) as browser:
        login = browser.post("/console/login", data={"key": server.api_key, "next": "/console"})
        assert login.status_code == 303 and login.headers["location"] == "/console"
        cookie = browser.cookies["sandgate_console"]
        assert server.api_key not in cookie  # a session token, not the key
        for path in ("/console", f"/console/sandboxes/{sandbox_id}", "/console/feed", "/console/changes"):
            assert browser.get(path).status_code == 200, path
        assert browser.post("/console/logout").status_code == 303
        assert browser.get("/console", follow_redirects=False).status_code == 303  # session ended


def run_session(server: SandgateServer, tmp_path: Path, outputs: list[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"version: 1\ndefaultAction: deny\negress:\n  - {{action: allow, target: {API_HOST}}}\n"
        f"bindings:\n  - name: api\n    credential: api-token\n    match: {{hosts: [{API_HOST}], "
        "paths: ['/echo/vault']}\n    auth: {type: bearer}\n"
    )
    cli(server, outputs, "vault", "put", "api-token", stdin=VAULT_SECRET)
    created = json.loads(cli(server, outputs, "sandbox", "create", "-o", "json"))
    sandbox_id = created["id"]
    cli(server, outputs, "sandbox", "list")
    cli(server, outputs, "egress", "set", sandbox_id, "--file", str(policy))
    with server.client() as client:
        egress = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()
    vault = {
        "credentials": [{"name": "inline", "source": {"type": "inline", "value": INLINE_SECRET}}],
        "bindings": [
            {
                "name": "inline",
                "match": {"hosts": [API_HOST], "paths": ["/echo/inline"]},
                "auth": {"type": "bearer", "credential": "inline"},
            }
        ],
    }
    answer = httpx.post(
        f"http://{egress['endpoint']}/credential-vault", json=vault, headers=egress["headers"]
    )
    assert answer.status_code == 201, answer.text
    for path in ("/echo/vault", "/echo/inline"):
        seen = cli(
            server, outputs, "sandbox", "exec", sandbox_id, "--", "curl", "-sS", f"https://{API_HOST}{path}"
        )
        assert json.loads(seen)["headers"]["authorization"] == "Bearer [REDACTED]"  # scrubbed back
    console_session(server, sandbox_id)
    for args in ((), ("-o", "json"), ("-o", "ocsf"), ("--summary",), ("--sandbox", sandbox_id)):
        cli(server, outputs, "logs", "--limit", "1000", *args)
    server.restart()  # start-up lines and re-adoption are logged too
    cli(server, outputs, "sandbox", "list")
    server.stop()  # the sandbox keeps running: its files are searched too


def in_a_root(path: Path, state_dir: Path) -> bool:
    """Inside a sandbox's merged root (its upper layer, searched as well, holds what it wrote)."""
    parts = path.relative_to(state_dir).parts
    return parts[0] == "sandboxes" and parts[2:3] == ("root",)


def searched_files(state_dir: Path) -> dict[Path, bytes]:
    return {
        path: path.read_bytes()
        for path in sorted(state_dir.rglob("*"))
        if path.is_file()
        and not path.is_symlink()
        and path.name not in KEY_FILES
        and not in_a_root(path, state_dir)
        and path.suffix != ".img"  # a sandbox's filesystem image: its files are read through its mount
    }


def test_no_secret_in_any_log_file_or_output(internet: Internet, tmp_path: Path) -> None:
    extra = {"SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]), "SANDGATE_UPSTREAM_CA": str(internet.ca_cert)}
    outputs: list[str] = []
    with sandgate_server(tmp_path, extra, generated_key=True, log_level="info") as server:
        run_session(server, tmp_path, outputs)
        vault_key = (server.state_dir / "vault.key").read_text().strip()
        secrets = {
            "API key": server.api_key,
            "vault key": vault_key,
            "vault key (hex)": base64.b64decode(vault_key).hex(),
            "vault credential": VAULT_SECRET,
            "inline credential": INLINE_SECRET,
        }
        searched = searched_files(server.state_dir)  # the sandbox still runs: its files too
        serve_output = server.log_path.read_text(errors="replace")
    assert len(secrets["API key"]) >= 32 and all(secrets.values())
    assert "GET /console HTTP/1.1" in serve_output  # the access log was on: it had its chance
    assert f"sandgate: console on {server.base_url}/console (log in with the API key)" in serve_output
    searched[Path("serve output")] = serve_output.encode()
    searched.update({Path(f"cli output {n}"): text.encode() for n, text in enumerate(outputs)})
    names = {p.name for p in searched}
    assert {"proxy.log", "audit.jsonl", "sandgate.db", "audit-index.db", "output.log"} <= names
    hits = [
        f"{what} in {path}"
        for path, data in searched.items()
        for what, secret in secrets.items()
        if secret.encode() in data
    ]
    assert hits == []

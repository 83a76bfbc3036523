"""The audit log as a reviewer reads it (issue 16): what it says is what the proxy decided, it
holds no secret, and nothing a sandbox sends can forge a row or act on the reviewer's terminal.

Each case runs from inside a real sandbox through the real proxy, then reads the evidence the
way a reviewer does: the JSONL, the SQLite index, `sandgate logs` (table, JSON, OCSF, follow)
and the `/v1/audit` API.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import CredentialProxyConfig, NetworkPolicy, NetworkRule

from sandgate.lifecycle.audit import AuditFilter, AuditIndex
from tests.adversarial.conftest import (
    BOUND_HOST,
    EXFIL_ZONE,
    OPEN_HOST,
    SANDBOX_IMAGE,
    SANDBOX_LIFETIME,
    ZONE,
    Attacker,
    connection,
    find_leak,
)
from tests.support.audit import audit_records
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SANDGATE, SandgateServer

pytestmark = pytest.mark.root

# A host only the report-mode sandbox asks for (the denied host must never reach an origin:
# test_zz_nothing_leaked checks that).
REPORT_HOST = "report.example.com"
PATH_SECRET = "bot-7781:" + os.urandom(12).hex()  # a Telegram-style token that travels in the path
PATH_PLACEHOLDER = "SANDGATE_BOT_TOKEN"
# A row a forger would like the reviewer to read, smuggled in a DNS name (labels split at dots;
# names are recorded lower-cased).
FORGED_ROW = "2026-01-01 00:00:00.000  sbx-forged  request  allow  get api.example.com/granted"
# Terminal controls in a request target: OSC (set the window title), CSI (clear the screen, move
# the cursor), a C1 CSI and a bidi override that would reverse what follows (both sent as UTF-8;
# the attack script sends the payload's characters as latin-1 bytes).
HOSTILE_PATH = "/x\x1b]0;PWNED\x07\x1b[2J\x1b[H" + "\x9b1m\u202egnp.txt".encode().decode("latin-1")
TERMINAL_BYTES = ("\x1b", "\x07", "\x9b", "\u202e")


def logs(server: SandgateServer, *args: str) -> str:
    """`sandgate logs` as a reviewer runs it on the host, against the server's state dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDGATE_")}
    done = subprocess.run(
        [*SANDGATE, "--state-dir", str(server.state_dir), "logs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def index_records(server: SandgateServer, **where: Any) -> list[dict[str, Any]]:
    index = AuditIndex(server.state_dir / "audit-index.db", server.state_dir / "audit.jsonl")
    try:
        index.ingest()
        return index.page(AuditFilter(**where), 1000).records
    finally:
        index.close()


def api_records(server: SandgateServer, **params: str) -> list[dict[str, Any]]:
    with server.client() as client:
        response = client.get("/v1/audit", params={"limit": "1000", **params})
    assert response.status_code == 200, response.text
    return response.json()["records"]  # type: ignore[no-any-return]


def wait_for(found: Any, timeout: float = 10.0) -> Any:
    """Poll `found()` until it returns something truthy (the index lags the JSONL a little)."""
    deadline = time.monotonic() + timeout
    while not (result := found()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return result


def run(sandbox: SandboxSync, command: str) -> str:
    execution = sandbox.commands.run(command, opts=RunCommandOpts(timeout=timedelta(seconds=60)))
    return "".join(m.text for m in execution.logs.stdout)


def allowing(server: SandgateServer, host: str) -> SandboxSync:
    """A new sandbox whose policy allows `host` only (credential vault on)."""
    return SandboxSync.create(
        SANDBOX_IMAGE,
        entrypoint=["sleep", "infinity"],
        network_policy=NetworkPolicy(defaultAction="deny", egress=[NetworkRule(action="allow", target=host)]),
        credential_proxy=CredentialProxyConfig(enabled=True),
        connection_config=connection(server),
        timeout=SANDBOX_LIFETIME,
        ready_timeout=timedelta(seconds=30),
    )


@pytest.fixture(scope="module")
def reporter(server: SandgateServer, internet: Internet) -> Iterator[SandboxSync]:
    """A sandbox whose sandgate policy is in report mode: it denies everything but enforces nothing."""
    internet.set_names({**ZONE, REPORT_HOST: [ORIGIN_V4]})
    sandbox = allowing(server, OPEN_HOST)
    try:
        with server.client() as client:
            url = f"/v1/sandboxes/{sandbox.id}/egress/sandgate-policy"
            current = client.get(url).json()
            changed = client.put(url, json={"policy": {**current["policy"], "mode": "report"}})
            assert changed.status_code == 200, changed.text
        yield sandbox
    finally:
        sandbox.kill()
        sandbox.close()
        internet.set_names(ZONE)


def test_report_mode_is_recorded_as_report_everywhere(server: SandgateServer, reporter: SandboxSync) -> None:
    # Denied by the policy, let through by report mode: plain HTTP and pass-through TLS.
    assert run(reporter, f"curl -sS --max-time 10 http://{REPORT_HOST}/").strip() == "hello from origin"
    assert run(reporter, f"curl -sSk --max-time 10 https://{REPORT_HOST}/").strip() == "hello from origin"
    wanted = {("request", "report", "default"), ("connection", "report", "default")}

    def reported() -> list[dict[str, Any]]:
        """The sandbox's records of REPORT_HOST once both kinds are in the server's log (a node's
        records arrive there through the shipper, a poll after they were written on the node)."""
        found = [
            json.loads(line)
            for line in (server.state_dir / "audit.jsonl").read_text().split("\n")
            if f'"{reporter.id}"' in line and f'"{REPORT_HOST}"' in line
        ]
        return (
            found
            if wanted <= {(r["kind"], r["decision"], r["reason"]) for r in found if r["event"] is None}
            else []
        )

    written = wait_for(reported)
    assert written, audit_records(server.state_dir, reporter.id)
    assert {r["decision"] for r in written} == {"report"}, written  # DNS too; never "allow"
    # The index, the API, `sandgate logs` (table, JSON, OCSF) all say report.
    indexed = wait_for(
        lambda: index_records(server, sandbox=reporter.id, decision="report", host=REPORT_HOST)
    )
    assert {r["id"] for r in written} <= {r["id"] for r in indexed}
    api = api_records(server, sandbox=reporter.id, decision="report", host=REPORT_HOST)
    assert {r["id"] for r in written} <= {r["id"] for r in api}
    assert not api_records(server, sandbox=reporter.id, decision="allow", host=REPORT_HOST)
    ocsf = api_records(server, sandbox=reporter.id, decision="report", format="ocsf")
    assert ocsf and {(e["disposition_id"], e["disposition"], e["action"]) for e in ocsf} == {
        (17, "Logged", "Allowed")
    }
    table = logs(server, "--sandbox", reporter.id, "--host", REPORT_HOST).splitlines()
    # one row per record: a forwarded request's write-ahead line and its whole line share an id
    assert len(table) - 1 >= len({r["id"] for r in written}) and all(
        " report " in row for row in table[1:]
    ), table
    as_json = [json.loads(line) for line in logs(server, "--sandbox", reporter.id, "-o", "json").splitlines()]
    assert {r["decision"] for r in as_json if r["host"] == REPORT_HOST} == {"report"}
    exported = [json.loads(line) for line in logs(server, "--decision", "report", "-o", "ocsf").splitlines()]
    assert {e["metadata"]["uid"] for e in exported} >= {r["id"] for r in written}


@pytest.fixture(scope="module")
def bot(server: SandgateServer) -> Iterator[SandboxSync]:
    """A sandbox whose credential travels in the path: `/echo/bot/<placeholder>/sendMessage`."""
    sandbox = allowing(server, BOUND_HOST)
    try:
        substitution = {"credential": "bot-token", "placeholder": PATH_PLACEHOLDER, "in": ["path"]}
        sandbox.credential_vault.create(
            credentials=[{"name": "bot-token", "source": {"type": "inline", "value": PATH_SECRET}}],
            bindings=[
                {
                    "name": "bot",
                    "match": {"hosts": [BOUND_HOST], "paths": ["/echo/bot/*"]},
                    "auth": {"type": "passthrough", "substitutions": [substitution]},
                }
            ],
        )
        yield sandbox
    finally:
        sandbox.kill()
        sandbox.close()


def test_a_path_placeholders_secret_is_in_no_record_index_or_cli_output(
    server: SandgateServer, bot: SandboxSync, attacker: Attacker
) -> None:
    mark = len(attacker.internet.origin_requests())
    path = f"/echo/bot/{PATH_PLACEHOLDER}/sendMessage"
    echoed = run(bot, f"curl -sS --max-time 10 https://{BOUND_HOST}{path}")
    assert json.loads(echoed)["path"] == "/echo/bot/[REDACTED]/sendMessage"  # substituted, scrubbed back
    assert any(PATH_SECRET in str(r) for r in attacker.origin_requests_since(mark))  # the origin got it
    records = wait_for(lambda: index_records(server, sandbox=bot.id, binding="bot"))
    assert [(r["method"], r["path"]) for r in records] == [("GET", path)]
    evidence = {
        "audit.jsonl": (server.state_dir / "audit.jsonl").read_text(),
        "index": json.dumps(index_records(server, sandbox=bot.id)),
        "api": json.dumps(api_records(server, sandbox=bot.id)),
        "logs": logs(server, "--sandbox", bot.id),
        "logs -o json": logs(server, "--sandbox", bot.id, "-o", "json"),
        "logs -o ocsf": logs(server, "--sandbox", bot.id, "-o", "ocsf"),
    }
    for where, text in evidence.items():
        assert PATH_SECRET not in text and PATH_SECRET.split(":")[1] not in text, where
        assert find_leak(text) is None, where


def test_forged_rows_and_terminal_escapes_are_shown_escaped(
    server: SandgateServer, attacker: Attacker
) -> None:
    """A DNS name with a newline and a path with OSC/CSI/C1/bidi bytes, sent from the sandbox:
    every view prints each record on one row with the bytes escaped visibly."""
    forged_name = f"ok\n{FORGED_ROW}.{EXFIL_ZONE}"
    follow = subprocess.Popen(
        [*SANDGATE, "--state-dir", str(server.state_dir), "logs", "--sandbox", attacker.sandbox.id, "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("SANDGATE_")},
    )
    followed: list[str] = []
    reader = threading.Thread(
        target=lambda: followed.extend(line.decode("utf-8", "replace") for line in follow.stdout or ()),
        daemon=True,
    )
    reader.start()
    try:
        assert wait_for(lambda: followed, 30), "logs -f printed nothing"  # it follows from here on
        dns = attacker.attack("dns", name=forged_name, qtype="A")
        assert dns["answered"], dns
        request = f"GET {HOSTILE_PATH} HTTP/1.1\r\nHost: {OPEN_HOST}\r\nConnection: close\r\n\r\n"
        sent = attacker.attack("raw", host=OPEN_HOST, port=80, payload=request)
        assert sent["connected"], sent
        hostile = wait_for(
            lambda: [
                r for r in index_records(server, sandbox=attacker.sandbox.id) if "PWNED" in (r["path"] or "")
            ]
        )
        forged = wait_for(
            lambda: [
                r
                for r in index_records(server, sandbox=attacker.sandbox.id, kind="dns")
                if FORGED_ROW in (r["host"] or "")
            ]
        )
        assert hostile and forged
        assert "\n" in forged[0]["host"] and "\x1b" in hostile[0]["path"]  # the index keeps the truth
        assert wait_for(lambda: [1 for row in followed if "ok\\n2026" in row], 30)
        assert wait_for(lambda: [1 for row in followed if f"{OPEN_HOST}/x" in row], 30)
    finally:
        follow.terminate()
        follow.wait(10)
        reader.join(10)
    table = logs(server, "--sandbox", attacker.sandbox.id, "--limit", "1000")
    dns_rows = logs(server, "--sandbox", attacker.sandbox.id, "--kind", "dns", "--host", forged[0]["host"])
    for name, text in {
        "table": table,
        "follow": "".join(followed),
        "dns": dns_rows,
    }.items():
        assert not any(byte in text for byte in TERMINAL_BYTES), (name, text)
        if name != "dns":  # that view has the DNS records only; follow's columns may be narrower
            assert f"GET {OPEN_HOST}/x\\x1" in text, (name, text)
        rows = [row for row in text.splitlines() if "ok\\n2026" in row]  # the forged name's records
        assert rows and all(row.startswith("20") and " dns " in row for row in rows), rows
        assert not any(row.startswith("2026-01-01 00:00:00.000") for row in text.splitlines()), name
    assert "/x\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[H\\x9b1m\\u202e" in table
    assert len(dns_rows.splitlines()) == 1 + len(forged)  # header + one row per record
    # JSON export keeps the exact text, escaped by the encoder (no raw control bytes either).
    exported = logs(server, "--sandbox", attacker.sandbox.id, "-o", "json", "--limit", "1000")
    assert not any(byte in exported for byte in TERMINAL_BYTES)
    assert any(json.loads(line)["host"] == forged_name.rstrip(".") for line in exported.splitlines())

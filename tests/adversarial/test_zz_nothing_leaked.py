"""Runs last in the package (module order): after every attack above, the evidence as a whole.

The secret is in no product log line and no file of the state dir but the encrypted vault; no
canary was ever reached; no origin ever saw a request straight from a sandbox address, a request
for the denied host, or the credential anywhere but the bound host over TLS; the test internet's
resolver never saw a name of the exfiltration zone."""

from __future__ import annotations

import os
from ipaddress import ip_address
from pathlib import Path

import pytest

from tests.adversarial.conftest import (
    BOUND_HOST,
    DENIED_HOST,
    EXFIL_ZONE,
    LONG_LIVED_AND_MINTED,
    SECRET,
    Attacker,
    Canaries,
    find_leak,
    sandbox_range,
)
from tests.adversarial.test_identity import FRONTED_PATH
from tests.support.internet import ORIGIN_V4

pytestmark = pytest.mark.root


def state_files(root: Path) -> list[Path]:
    """Regular files under the state dir, not descending into mount points but a sandbox's own
    filesystem (`disk`, which holds what the sandbox wrote): a running sandbox's root is mounted
    there, and its lower layer is the host's whole root. Filesystem images (`disks/*.img`, the
    same bytes as `disk`, sparse at gigabytes) are read through their mounts instead."""
    found = []
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d == "disk" or not os.path.ismount(os.path.join(directory, d))]
        found += [
            Path(directory, f)
            for f in files
            if Path(directory, f).is_file() and not Path(directory, f).is_symlink() and not f.endswith(".img")
        ]
    return found


def test_the_secret_is_in_no_log_line_and_no_state_file(attacker: Attacker) -> None:
    assert_the_secret_is_nowhere(attacker, min_records=100)


def assert_the_secret_is_nowhere(attacker: Attacker, min_records: int) -> None:
    """No form of the secret in serve's log, any state file or any audit record, after at least
    `min_records` records (the attacks ran)."""
    server = attacker.server
    scanned = []
    for path in [server.log_path, *state_files(server.state_dir)]:
        data = path.read_bytes()
        scanned.append(path.name)
        assert find_leak(data) is None, f"the secret is in {path}"
    assert "audit.jsonl" in scanned and "proxy.log" in scanned
    records = attacker.audit()
    assert len(records) > min_records and not [r for r in records if SECRET in str(r)]


def test_no_long_lived_secret_or_minted_token_in_a_log_line_or_state_file(attacker: Attacker) -> None:
    """AWS keys, OAuth2 client secrets, refresh tokens, private keys and every token the test
    authorization server issued (test_aws_sigv4, test_minted_tokens): none in any log or state file."""
    server = attacker.server
    hunted = [value for value in LONG_LIVED_AND_MINTED if len(value) >= 8]
    assert len(hunted) > 10, "test_aws_sigv4 and test_minted_tokens ran first and gave their values"
    for path in [server.log_path, *state_files(server.state_dir)]:
        data = path.read_bytes()
        found = [value[:6] + "..." for value in hunted if value.encode() in data]
        assert not found, f"{found} in {path}"


def test_no_canary_was_ever_reached(canaries: Canaries) -> None:
    assert canaries.hits() == []


def test_origins_saw_only_proxied_requests_and_the_credential_only_where_bound(
    attacker: Attacker, request: pytest.FixtureRequest
) -> None:
    seen = attacker.internet.origin_requests()
    assert seen, "the suite made allowed requests too"
    sandboxes = sandbox_range(request, attacker.server)
    direct = [r for r in seen if ip_address(r["client"].rpartition(":")[0].strip("[]")) in sandboxes]
    assert not direct, "a sandbox reached an origin directly"
    denied = [r for r in seen if r["headers"].get("host", "").startswith(DENIED_HOST)]
    assert [r["path"] for r in denied] == [FRONTED_PATH], denied  # only the documented fronting trade-off
    carrying = [r for r in seen if SECRET in str(r)]
    assert carrying and all(
        r["server"] == f"{ORIGIN_V4}:443" and r["headers"]["host"] == BOUND_HOST for r in carrying
    ), carrying


def test_the_resolver_never_saw_the_exfiltration_zone(attacker: Attacker) -> None:
    assert not [q for q in attacker.internet.dns_queries() if EXFIL_ZONE in q["name"]]

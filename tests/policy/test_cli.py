"""`sandgate policy check|explain|fmt` as a user runs them (no state dir, no config): the real
command in this process (tests/support/cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import Ran
from tests.support.cli import sandgate as run_sandgate

EXAMPLE = Path(__file__).parents[2] / "examples" / "policy.yaml"
TESTDATA = Path(__file__).parent / "testdata"


def sandgate(*args: str) -> Ran:
    state_dir = {"SANDGATE_STATE_DIR": "/nonexistent/sandgate-state"}  # must not be needed
    return run_sandgate("policy", *args, env=state_dir)


def test_check_ok_and_errors_with_exit_codes() -> None:
    ok = sandgate("check", str(EXAMPLE))
    assert ok.returncode == 0 and ok.stdout.startswith(f"ok {EXAMPLE} (6 rules, 2 bindings)")
    bad = sandgate("check", str(EXAMPLE), str(TESTDATA / "bad_cidr.yaml"), str(TESTDATA / "unknown_key.yaml"))
    assert bad.returncode == 2
    assert f"{TESTDATA / 'bad_cidr.yaml'}:3:20: '203.0.113.0/33' is not a valid CIDR" in bad.stdout
    assert (
        f"{TESTDATA / 'unknown_key.yaml'}:5:5: unknown key 'method' (hint: did you mean 'methods'?)"
        in bad.stdout
    )


def test_explain_says_how_minted_and_signed_bindings_are_injected() -> None:
    example = EXAMPLE.with_name("minted-and-signed.yaml")
    assert sandgate("check", str(example)).returncode == 0
    s3 = sandgate("explain", str(example), "https://s3.us-east-1.amazonaws.example.com/bucket", "-X", "PUT")
    assert "binding s3: awsSigV4: re-signed with the real key for s3 in us-east-1" in s3.stdout, s3.stdout
    minted = sandgate("explain", str(example), "https://api.example.com/reports/1")
    expected = "binding reports: oauth2 client_credentials: a token minted by the proxy from auth.example.com"
    assert expected in minted.stdout, minted.stdout


def test_explain_text_and_json() -> None:
    allowed = sandgate("explain", str(EXAMPLE), "https://api.github.com/repos/acme/app")
    assert allowed.returncode == 0
    assert allowed.stdout.splitlines()[0].startswith("allow GET https://api.github.com/repos/acme/app")
    assert f"rule={EXAMPLE}:12" in allowed.stdout and "bindings=github" in allowed.stdout
    denied = sandgate(
        "explain", str(EXAMPLE), "https://api.github.com/repos/acme/app", "--method", "DELETE", "-o", "json"
    )
    assert denied.returncode == 1
    assert json.loads(denied.stdout) == {
        "decision": "deny",
        "reason": "method_not_allowed",
        "rule": f"{EXAMPLE}:12",
        "inspect": True,
        "bindings": [],
        "detail": None,
    }


def test_explain_connection_level_and_metadata_address() -> None:
    conn = sandgate("explain", str(EXAMPLE), "https://packages.example.com", "--connection")
    assert conn.stdout.startswith("allow connection packages.example.com:443") and "inspect=no" in conn.stdout
    meta = sandgate("explain", str(EXAMPLE), "http://169.254.169.254/latest/meta-data/")
    assert meta.returncode == 1 and meta.stdout.startswith("deny ")


def test_fmt_prints_checks_and_writes_canonical_yaml(tmp_path: Path) -> None:
    messy = tmp_path / "p.yaml"
    messy.write_text(
        '{"egress": [{"target": "API.Example.com.", "action": "Allow"}], "defaultAction": "deny"}'
    )
    printed = sandgate("fmt", str(messy))
    assert printed.returncode == 0 and "- {action: allow, target: api.example.com}" in printed.stdout
    assert sandgate("fmt", "--check", str(messy)).returncode == 1
    assert sandgate("fmt", "--write", str(messy)).returncode == 0
    assert messy.read_text() == printed.stdout
    assert sandgate("fmt", "--check", str(messy)).returncode == 0
    assert sandgate("fmt", str(TESTDATA / "bad_cidr.yaml")).returncode == 2

"""`sandgate policy suggest` on a real audit log (what a report-mode run of a small workload
writes) and `sandgate policy diff`: the file it writes passes `policy check`, allows through
`policy explain` every request the workload made, refuses one it did not make, never opens an
always-denied address it tried, and keeps a newline in an SNI inside its comment."""

from __future__ import annotations

from pathlib import Path

from sandgate.proxy import AuditRecord, append_record, audit_path
from tests.support.cli import sandgate

SANDBOX = "sbx-learn-0001"


def record(kind: str, decision: str, reason: str, host: str, **facts: object) -> AuditRecord:
    fields = {"kind": kind, "decision": decision, "reason": reason, "host": host, **facts}
    return AuditRecord.model_validate({"sandbox": SANDBOX, "client": "10.0.0.2", **fields})


def workload(state: Path) -> None:
    """A pip install from an index, a git clone over HTTPS (passed through), a bound API call,
    a lookup of a name it never connected to, and a try at the metadata address."""
    https = {"scheme": "https", "port": 443}
    records = [
        *(
            record("request", "report", "default", "index.example.test", method="GET", path=path, **https)
            for path in ("/simple/requests/", "/packages/ab/requests-2.0.whl")
        ),
        record("connection", "report", "default", "git.example.test", sni="git.example.test", port=443),
        record(
            "request",
            "allow",
            "rule",
            "api.example.test",
            method="POST",
            path="/v1/chat",
            rule="p.yaml:3",
            binding="api-key",
            **https,
        ),
        record("dns", "report", "default", "lookup.example.test"),
        record(
            "request",
            "deny",
            "always_denied_range",
            "169.254.169.254",
            scheme="http",
            port=80,
            method="GET",
            path="/latest/meta-data",
        ),
        record("dns", "deny", "invalid_host", "evil\n  - action: allow"),
        record("request", "report", "default", "other.example.test", port=443),
    ]
    for one in records:
        append_record(audit_path(state), one)


def test_suggest_learns_the_workload_and_nothing_more(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    workload(state)
    suggested = tmp_path / "suggested.yaml"
    ran = sandgate(
        "--state-dir", str(state), "policy", "suggest", "--sandbox", SANDBOX[:8], "-o", str(suggested)
    )
    assert ran.returncode == 0, ran.stderr
    text = suggested.read_text()
    assert sandgate("policy", "check", str(suggested)).returncode == 0, text
    for method, url in (
        ("GET", "https://index.example.test/simple/requests/"),
        ("GET", "https://index.example.test/packages/ab/requests-2.0.whl"),
        ("GET", "https://git.example.test/acme/repo.git/info/refs"),
        ("POST", "https://api.example.test/v1/chat"),
    ):
        assert sandgate("policy", "explain", str(suggested), url, "-X", method).returncode == 0, (url, text)
    for method, url in (
        ("DELETE", "https://index.example.test/simple/requests/"),  # a method it never used
        ("GET", "https://api.example.test/v1/admin"),  # a path it never asked for
        ("GET", "https://exfil.example.test/"),  # a host it never reached
        ("GET", "http://169.254.169.254/latest/meta-data"),
    ):
        assert sandgate("policy", "explain", str(suggested), url, "-X", method).returncode == 1, (url, text)
    assert "not suggested: 169.254.169.254:80 was refused as always_denied_range" in text
    assert "# #   - name: api-key" not in text and "#   - name: api-key" in text  # left for a human
    assert "evil\\n  - action: allow" in text and "\n  - action: allow\n" not in text.split("egress:")[0]


def test_diff_between_the_suggestion_and_a_policy(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    workload(state)
    suggested = tmp_path / "suggested.yaml"
    sandgate("--state-dir", str(state), "policy", "suggest", "--sandbox", SANDBOX, "-o", str(suggested))
    assert sandgate("policy", "diff", str(suggested), str(suggested)).returncode == 0
    live = tmp_path / "live.yaml"
    live.write_text("egress:\n  - action: allow\n    target: api.example.test\n")
    ran = sandgate("policy", "diff", str(suggested), str(live))
    assert ran.returncode == 1
    assert "+- action: allow\n+  target: git.example.test\n" in ran.stdout, ran.stdout
    assert sandgate("policy", "diff", str(suggested)).returncode == 2  # neither OTHER nor --sandbox


def test_suggest_for_a_sandbox_without_records_says_so(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    ran = sandgate("--state-dir", str(state), "policy", "suggest", "--sandbox", "nobody")
    assert ran.returncode == 1 and "no audit records of sandbox nobody" in ran.stderr

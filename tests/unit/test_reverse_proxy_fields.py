"""The reverse proxy's field filter alone (lifecycle/api/sandbox_proxy.py), for the cases the wire tests in
tests/lifecycle/test_reverse_proxy.py cannot observe from inside execd."""

from __future__ import annotations

from sandgate.lifecycle.api.sandbox_proxy import end_to_end, upstream_headers
from sandgate.lifecycle.sandbox_state import SandboxState
from sandgate.lifecycle.sandbox_store import SandboxRecord, utcnow

API_KEY = "api-key-0123456789"


def record() -> SandboxRecord:
    return SandboxRecord(
        id="sb", image="sandgate/host", entrypoint=[], created_at=utcnow(), state=SandboxState.RUNNING,
        address="10.0.0.2", egress_token="egress-token-abc", execd_token="execd-token-xyz",
    )  # fmt: skip


def test_execd_gets_only_what_it_reads_and_its_token() -> None:
    fields = [("Authorization", "Basic dXNlcjpwdw=="), ("X-EXECD-ACCESS-TOKEN", "guess"),
              ("OPEN-SANDBOX-API-KEY", API_KEY), ("X-Corp-Gateway-Key", "k-123"), ("Accept", "*/*"),
              ("Content-Type", "application/json"), ("Range", "bytes=0-1")]  # fmt: skip
    assert upstream_headers(fields, record(), 44772, API_KEY) == [
        ("Content-Type", "application/json"), ("Range", "bytes=0-1"), ("via", "1.1 sandgate"),
        ("X-EXECD-ACCESS-TOKEN", "execd-token-xyz"),
    ]  # fmt: skip


def test_other_ports_keep_an_authorization_of_their_own_but_never_a_token() -> None:
    fields = [("Authorization", "Basic dXNlcjpwdw=="), ("Cookie", "t=execd-token-xyz"),
              ("X-Note", "egress-token-abc"), ("OPENSANDBOX-EGRESS-AUTH", "egress-token-abc")]  # fmt: skip
    assert upstream_headers(fields, record(), 8000, API_KEY) == [
        ("Authorization", "Basic dXNlcjpwdw=="), ("via", "1.1 sandgate")
    ]  # fmt: skip


def test_connection_named_fields_and_proxy_fields_are_hops() -> None:
    fields = [("Connection", "X-A, x-b"), ("X-A", "1"), ("X-B", "2"), ("Proxy-Foo", "3"),
              ("Set-Cookie", "a"), ("Set-Cookie", "b"), ("Content-Length", "0")]  # fmt: skip
    assert end_to_end(fields) == [("Set-Cookie", "a"), ("Set-Cookie", "b"), ("Content-Length", "0")]

"""The reverse proxy's field filter alone (lifecycle/api/proxy.py), for the cases the wire tests in
tests/lifecycle/test_reverse_proxy.py cannot observe from inside execd."""

from __future__ import annotations

from sandgate.lifecycle.api.proxy import end_to_end, upstream_headers
from sandgate.lifecycle.store import SandboxRecord, utcnow

API_KEY = "api-key-0123456789"


def record() -> SandboxRecord:
    return SandboxRecord(
        id="sb", image="sandgate/host", entrypoint=[], created_at=utcnow(), state="Running",
        address="10.0.0.2", egress_token="egress-token-abc", execd_token="execd-token-xyz",
    )  # fmt: skip


def test_execd_gets_its_token_and_no_authorization_or_secret() -> None:
    fields = [("Authorization", "Basic dXNlcjpwdw=="), ("X-EXECD-ACCESS-TOKEN", "guess"),
              ("OPEN-SANDBOX-API-KEY", API_KEY), ("X-Note", "egress-token-abc"),
              ("Accept", "*/*")]  # fmt: skip
    assert upstream_headers(fields, record(), 44772, API_KEY) == [
        ("Accept", "*/*"), ("via", "1.1 sandgate"), ("X-EXECD-ACCESS-TOKEN", "execd-token-xyz")
    ]  # fmt: skip


def test_other_ports_keep_an_authorization_of_their_own_but_never_the_execd_token() -> None:
    fields = [("Authorization", "Basic dXNlcjpwdw=="), ("Cookie", "t=execd-token-xyz")]
    assert upstream_headers(fields, record(), 8000, API_KEY) == [
        ("Authorization", "Basic dXNlcjpwdw=="), ("via", "1.1 sandgate")
    ]  # fmt: skip


def test_connection_named_fields_and_proxy_fields_are_hops() -> None:
    fields = [("Connection", "X-A, x-b"), ("X-A", "1"), ("X-B", "2"), ("Proxy-Foo", "3"),
              ("Set-Cookie", "a"), ("Set-Cookie", "b"), ("Content-Length", "0")]  # fmt: skip
    assert end_to_end(fields) == [("Set-Cookie", "a"), ("Set-Cookie", "b"), ("Content-Length", "0")]

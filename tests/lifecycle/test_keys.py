"""Managed keys in a real state database (SQLite and PostgreSQL): shown once and stored as their
SHA-256 only, never starting with '-', refused once revoked, rotated or expired, their lifetime
checked."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.keys import KeyBook, parse_lifetime
from tests.support.postgres import Postgres


@pytest.fixture
def book(database: Path | str) -> KeyBook:
    return KeyBook(database)


def stored_bytes(database: Path | str, postgres: Callable[[], Postgres]) -> bytes:
    """Everything the database holds, as its files (SQLite) or its table's rows (PostgreSQL)."""
    if isinstance(database, Path):
        return b"".join(path.read_bytes() for path in database.parent.iterdir())
    return repr(postgres().run("SELECT * FROM api_keys")).encode()


def test_a_key_is_stored_as_its_digest_only(
    book: KeyBook, database: Path | str, request: pytest.FixtureRequest
) -> None:
    rows = [book.create("alpha", "operator", "ci")[1] for _ in range(200)]
    assert not any(key.startswith("-") for key in rows) and len(set(rows)) == 200
    stored = stored_bytes(database, lambda: request.getfixturevalue("postgres"))
    for key in rows[:20]:
        assert key.encode() not in stored
        assert hashlib.sha256(key.encode()).hexdigest().encode() in stored
    row = book.resolve(rows[0])
    assert row is not None and (row.tenant, row.role, row.name) == ("alpha", "operator", "ci")
    assert "key" not in row.to_json() and row.to_json()["state"] == "active"


def test_a_wrong_secret_under_a_real_id_is_refused(book: KeyBook) -> None:
    row, key = book.create("alpha", "reviewer")
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    assert book.resolve(forged) is None and book.resolve(key) is not None
    assert book.resolve("") is None and book.resolve(f"sgk_{row.id}_") is None


def test_revoke_and_rotate_are_at_once(book: KeyBook) -> None:
    row, key = book.create("beta", "operator", ttl=timedelta(days=30))
    successor, new_key = book.rotate(row.id)
    assert book.resolve(key) is None and book.resolve(new_key) is not None
    assert (successor.tenant, successor.role) == ("beta", "operator") and successor.id != row.id
    assert successor.expires_at is not None and successor.expires_at - successor.created_at == timedelta(
        days=30
    )
    book.revoke(successor.id)
    assert book.resolve(new_key) is None
    assert {r.id: r.to_json()["state"] for r in book.list()} == {row.id: "revoked", successor.id: "revoked"}


def test_an_expired_key_is_refused(book: KeyBook) -> None:
    _row, key = book.create("alpha", "operator", ttl=timedelta(seconds=0.5))
    assert book.resolve(key) is not None
    deadline = time.monotonic() + 10
    while book.resolve(key) is not None:
        assert time.monotonic() < deadline, "the key outlived its lifetime"
        time.sleep(0.05)
    assert book.list()[0].to_json()["state"] == "expired"


@pytest.mark.parametrize(
    ("tenant", "role", "lifetime"),
    [("Alpha", "operator", None), ("-x", "operator", None), ("a", "root", None), ("a", "operator", "0d"),
     ("a", "operator", "1y"), ("a", "operator", "-3d")],
)  # fmt: skip
def test_bad_input_is_refused_and_changes_nothing(
    book: KeyBook, tenant: str, role: str, lifetime: str | None
) -> None:
    with pytest.raises(LifecycleError) as refused:
        book.create(tenant, role, ttl=parse_lifetime(lifetime) if lifetime else None)
    assert refused.value.kind == "invalid" and book.list() == []
    assert parse_lifetime("90d") == timedelta(days=90) and parse_lifetime("30m") == timedelta(minutes=30)


def test_an_endpoint_token_opens_its_sandbox_and_kind_only_while_its_key_lives(book: KeyBook) -> None:
    from sandgate.lifecycle.api.auth import Gate

    gate = Gate("the-server-key", book)
    row, _key = book.create("alpha", "operator")
    token = gate.endpoint_token(row.principal, None, "execd", "sbx-1")
    assert token.startswith("sgx_") and gate.endpoint_principal(token, "execd", "sbx-1")[0] == row.principal
    assert gate.endpoint_principal(token, "execd", "sbx-2") == (None, None)  # another sandbox
    assert gate.endpoint_principal(token, "egress", "sbx-1") == (None, None)  # another API
    assert Gate("another-server-key", book).endpoint_principal(token, "execd", "sbx-1") == (None, None)
    payload, _, mac = token.removeprefix("sgx_").rpartition(".")
    forged = "sgx_" + payload[:-1] + ("B" if payload.endswith("A") else "A") + "." + mac  # mac kept
    assert gate.endpoint_principal(forged, "execd", "sbx-1") == (None, None)
    book.revoke(row.id)
    assert gate.endpoint_principal(token, "execd", "sbx-1") == (None, None)

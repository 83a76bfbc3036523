"""The store on SQLite and PostgreSQL: records round-trip, revisions guard concurrent writers, state
survives reopen."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import pg8000.dbapi
import pytest

from sandgate.lifecycle.credential_state import VaultState
from sandgate.lifecycle.database import DatabaseError
from sandgate.lifecycle.sandbox_state import IllegalMove, SandboxState
from sandgate.lifecycle.sandbox_store import NotFound, RevisionConflict, SandboxRecord, SandboxStore, utcnow
from sandgate.policy import Policy
from tests.support.postgres import Postgres
from tests.support.server import SANDGATE, SandgateServer


def record(sandbox_id: str = "sb1") -> SandboxRecord:
    now = utcnow()
    return SandboxRecord(
        id=sandbox_id,
        image="sandgate/host",
        entrypoint=["tail", "-f", "/dev/null"],
        created_at=now,
        expires_at=now + timedelta(minutes=5),
        metadata={"team": "x"},
        address="10.213.0.2",
        egress_token="tok",
    )


def test_sandbox_round_trip_and_survives_reopen(database: Path | str) -> None:
    store = SandboxStore(database)
    original = record().moved("start", "execd answered").moved("pause")
    store.put_sandbox(original)
    store.close()
    reopened = SandboxStore(database)
    assert reopened.get_sandbox("sb1") == original
    assert reopened.get_sandbox("sb1").state is SandboxState.PAUSED
    assert [r.id for r in reopened.list_sandboxes()] == ["sb1"]
    if isinstance(database, Path):
        assert oct(database.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    ("verbs", "state"),
    [(["start"], "Running"), (["start", "pause"], "Paused"), (["start", "pause", "resume"], "Running")],
)
def test_every_move_of_the_table(verbs: list[str], state: str) -> None:
    moved = record()
    for verb in verbs:
        moved = moved.moved(verb)
    assert moved.state == state and moved.transition_at is not None


ILLEGAL = [
    ([], "pause"),
    ([], "resume"),
    (["start"], "resume"),
    (["start"], "start"),
    (["start", "pause"], "pause"),
]


@pytest.mark.parametrize(("verbs", "illegal"), ILLEGAL)
def test_a_move_the_table_lacks_is_refused(verbs: list[str], illegal: str) -> None:
    moved = record()
    for verb in verbs:
        moved = moved.moved(verb)
    with pytest.raises(IllegalMove, match=f"cannot {illegal} a sandbox that is {moved.state}"):
        moved.moved(illegal)


def test_missing_sandbox_raises_not_found(database: Path | str) -> None:
    with pytest.raises(NotFound):
        SandboxStore(database).get_sandbox("nope")


def test_revisions_increase_and_conflicts_are_refused(database: Path | str) -> None:
    store = SandboxStore(database)
    store.put_sandbox(record())
    assert store.put_policy("sb1", Policy(defaultAction="deny"), expected_revision=0) == 1
    assert store.put_policy("sb1", Policy(defaultAction="allow"), expected_revision=1) == 2
    with pytest.raises(RevisionConflict) as raised:
        store.put_policy("sb1", Policy(defaultAction="deny"), expected_revision=1)
    assert raised.value.current == 2
    stored = store.get_policy("sb1")
    assert stored is not None and stored.revision == 2 and stored.document == Policy(defaultAction="allow")


# Columns as a database written before the documents were typed holds them (to_document's key order).
OLD_POLICY = (
    '{"version": 1, "defaultAction": "deny", "mode": "enforce", "egress": [{"action": "allow", '
    '"target": "api.example.com", "methods": ["GET"]}], "bindings": [{"name": "gh", "match": '
    '{"hosts": ["api.example.com"], "schemes": ["https"], "ports": [443], "methods": ["GET"], '
    '"paths": ["/*"]}, "auth": {"type": "bearer", "credential": "tok"}}]}'
)
OLD_VAULT = (
    '{"credentials": [{"name": "tok", "sourceType": "inline", "revision": 1, "entry": "sb.sb1.tok.r1"}], '
    '"bindings": [{"name": "gh", "revision": 1, "binding": {"name": "gh", "match": {"schemes": ["https"], '
    '"hosts": ["api.example.com"], "methods": ["GET", "POST", "PUT", "PATCH", "DELETE"], "paths": ["/*"]}, '
    '"auth": {"type": "bearer", "credential": "tok"}}}]}'
)


def test_documents_of_an_older_database_read_typed_and_write_back_the_same_json(database: Path | str) -> None:
    store = SandboxStore(database)
    store.put_sandbox(record())
    with store.transaction() as db:
        db.execute("INSERT INTO policies VALUES ('sb1', 1, ?, '2026-01-01T00:00:00+00:00')", (OLD_POLICY,))
        db.execute("INSERT INTO vaults VALUES ('sb1', 1, ?, '2026-01-01T00:00:00+00:00')", (OLD_VAULT,))
    policy, vault = store.get_policy("sb1"), store.get_vault("sb1")
    assert policy is not None and policy.document.bindings[0].name == "gh"
    assert vault is not None and vault.document.entries() == {"tok": "sb.sb1.tok.r1"}
    store.put_policy("sb1", policy.document, expected_revision=1)
    store.put_vault("sb1", vault.document, expected_revision=1)
    with store.transaction() as db:
        columns = db.one("SELECT p.document, v.state FROM policies p JOIN vaults v USING (sandbox_id)")
    assert tuple(columns) == (OLD_POLICY, OLD_VAULT)


def test_deleting_a_sandbox_deletes_its_policy_and_vault(database: Path | str) -> None:
    store = SandboxStore(database)
    store.put_sandbox(record())
    store.put_policy("sb1", Policy(), expected_revision=0)
    store.put_vault("sb1", VaultState(), expected_revision=0)
    store.delete_sandbox("sb1")
    assert store.get_policy("sb1") is None and store.get_vault("sb1") is None


def test_an_expired_sandbox_leaves_a_tombstone_for_a_week(database: Path | str) -> None:
    store = SandboxStore(database)
    expired = utcnow() - timedelta(seconds=1)
    for sandbox_id in ("expired", "deleted", "old"):
        store.put_sandbox(record(sandbox_id))
    store.delete_sandbox("old", expired)
    store._db.execute(
        "UPDATE tombstones SET deleted_at = ? WHERE id = 'old'", ((utcnow() - timedelta(days=8)).isoformat(),)
    )
    store.delete_sandbox("expired", expired)  # also drops tombstones older than TOMBSTONE_DAYS
    store.delete_sandbox("deleted")
    assert store.expired_at("expired") == expired
    assert store.expired_at("deleted") is None and store.expired_at("old") is None
    with pytest.raises(NotFound):
        store.get_sandbox("expired")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (
            "postgresql://sandgate:pw-s3cret-value@127.0.0.1:1/sandgate",
            "cannot open PostgreSQL 127.0.0.1:1/sandgate",
        ),
        ("postgresql://sandgate:pw-s3cret-value@db.example.test/x?sslmode=require", "sslmode 'require'"),
    ],
)
def test_a_database_that_cannot_be_opened_is_named_without_its_password(url: str, reason: str) -> None:
    with pytest.raises(DatabaseError) as raised:
        SandboxStore(url)
    assert reason in str(raised.value) and "pw-s3cret-value" not in repr(raised.value)
    assert raised.value.__cause__ is None  # `from None`: no driver exception (and its args) chained


def test_the_wrong_password_is_refused_by_postgresql(postgres: Postgres) -> None:
    wrong = postgres.url.replace(postgres.password, "not-the-password")
    with pytest.raises(DatabaseError, match="password authentication failed") as raised:
        SandboxStore(wrong)
    assert "not-the-password" not in str(raised.value)


@pytest.mark.root
def test_serve_with_an_unreachable_database_exits_with_the_reason_and_no_password(tmp_path: Path) -> None:
    url = "postgresql://sandgate:pw-s3cret-value@127.0.0.1:1/sandgate"  # nothing listens on port 1
    server = SandgateServer(tmp_path / "state", {"SANDGATE_DATABASE_URL": url})
    served = subprocess.run(
        [*SANDGATE, "serve"], env=server.server_env(), capture_output=True, text=True, timeout=120
    )
    assert served.returncode == 1
    assert "Error: cannot open PostgreSQL 127.0.0.1:1/sandgate" in served.stderr, served.stderr
    assert "Traceback" not in served.stderr and "pw-s3cret-value" not in served.stdout + served.stderr


def test_a_cut_connection_is_opened_again_and_a_cut_transaction_writes_nothing(postgres: Postgres) -> None:
    """PostgreSQL restarted under the store (a fast shutdown cuts every connection, as a failover
    does): the next statement runs on a new connection; a transaction cut in its middle is an
    error and leaves nothing (read back from PostgreSQL's side)."""
    postgres.run("DROP SCHEMA public CASCADE", "CREATE SCHEMA public")
    store = SandboxStore(postgres.url)
    store.put_sandbox(record("before"))
    postgres.restart()
    assert store.get_sandbox("before").id == "before"
    with pytest.raises(pg8000.dbapi.Error), store.transaction() as db:
        db.execute("INSERT INTO sandbox_tenants VALUES ('cut', 'tenant-x')")
        postgres.restart()
        db.execute("SELECT 1")
    assert postgres.run("SELECT id FROM sandbox_tenants WHERE id = 'cut'") == []
    assert store.tenant_of("cut") is None and store.list_sandboxes()[0].id == "before"

"""The SQLite store: records round-trip, revisions guard concurrent writers, state survives reopen."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from sandgate.lifecycle.sandbox_store import NotFound, RevisionConflict, SandboxRecord, SandboxStore, utcnow


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


def test_sandbox_round_trip_and_survives_reopen(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    store = SandboxStore(db)
    original = record().with_state("Running", "READY")
    store.put_sandbox(original)
    store.close()
    reopened = SandboxStore(db)
    assert reopened.get_sandbox("sb1") == original
    assert [r.id for r in reopened.list_sandboxes()] == ["sb1"]
    assert oct(db.stat().st_mode & 0o777) == "0o600"


def test_missing_sandbox_raises_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        SandboxStore(tmp_path / "s.db").get_sandbox("nope")


def test_revisions_increase_and_conflicts_are_refused(tmp_path: Path) -> None:
    store = SandboxStore(tmp_path / "s.db")
    store.put_sandbox(record())
    assert store.put_policy("sb1", {"defaultAction": "deny"}, expected_revision=0) == 1
    assert store.put_policy("sb1", {"defaultAction": "allow"}, expected_revision=1) == 2
    with pytest.raises(RevisionConflict) as raised:
        store.put_policy("sb1", {"defaultAction": "deny"}, expected_revision=1)
    assert raised.value.current == 2
    stored = store.get_policy("sb1")
    assert stored is not None and stored.revision == 2 and stored.document == {"defaultAction": "allow"}


def test_deleting_a_sandbox_deletes_its_policy_and_vault(tmp_path: Path) -> None:
    store = SandboxStore(tmp_path / "s.db")
    store.put_sandbox(record())
    store.put_policy("sb1", {}, expected_revision=0)
    store.put_vault("sb1", {"credentials": []}, expected_revision=0)
    store.delete_sandbox("sb1")
    assert store.get_policy("sb1") is None and store.get_vault("sb1") is None


def test_an_expired_sandbox_leaves_a_tombstone_for_a_week(tmp_path: Path) -> None:
    store = SandboxStore(tmp_path / "db.sqlite")
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

"""Control-plane state in SQLite or PostgreSQL (database.py): sandboxes, their policies,
credential-vault state, tokens.

Rules:
1. The database holds no secret value. Credential values live in the vault; the database keeps
   only vault entry names. Endpoint tokens are stored because a restarted server must honour
   the tokens clients already hold; the state dir is 0700 and masked from every sandbox.
2. Every write is one transaction; a change of policy or vault state bumps its revision in the
   same statement that stores it, so a crash never leaves a half-applied revision.
3. The store knows nothing of runtimes, networks or HTTP: it is the record, not the actor.
4. Documents go in and come out typed (`Policy`, `VaultState`); their JSON form, the one stored
   since the first release, exists only in this module's columns.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sandgate.lifecycle.credential_state import VaultState
from sandgate.lifecycle.database import Database, open_database
from sandgate.lifecycle.principals import DEFAULT_TENANT
from sandgate.lifecycle.sandbox_state import SandboxState, move
from sandgate.policy import Policy, policy_from_dict, to_document

SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    record TEXT NOT NULL,          -- JSON of SandboxRecord (no secrets)
    state TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS policies (
    sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id) ON DELETE CASCADE,
    revision INTEGER NOT NULL,
    document TEXT NOT NULL,        -- the sandgate policy document (JSON), bindings included
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS vaults (
    sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id) ON DELETE CASCADE,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL,           -- JSON of VaultState (names and bindings, never values)
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sandbox_tenants (  -- whose a sandbox was, kept after its deletion
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandbox_tenants_by_tenant ON sandbox_tenants(tenant);
CREATE TABLE IF NOT EXISTS tenant_ceilings (  -- a tenant's ceiling: every policy of its sandboxes within it
    tenant TEXT PRIMARY KEY,
    document TEXT NOT NULL,        -- the sandgate policy document (JSON)
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tombstones (  -- sandboxes deleted because they expired
    id TEXT PRIMARY KEY,
    expired_at TEXT NOT NULL,
    deleted_at TEXT NOT NULL
);
"""
TOMBSTONE_DAYS = 7  # how long "expired at T" is remembered after the deletion


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class SandboxRecord:
    """One sandbox as the control plane remembers it."""

    id: str
    image: str
    entrypoint: list[str]
    created_at: datetime
    state: SandboxState = SandboxState.PENDING
    reason: str | None = None
    message: str | None = None
    transition_at: datetime | None = None
    expires_at: datetime | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, str] = field(default_factory=dict)
    platform: dict[str, str] | None = None
    resource_limits: dict[str, str] = field(default_factory=dict)
    address: str | None = None
    gateway: str | None = None
    netns: str | None = None
    egress_token: str = ""
    execd_token: str = ""  # "" for sandboxes made before execd tokens: their execd has none
    credential_proxy: bool = False
    tenant: str = DEFAULT_TENANT  # whose it is (lifecycle/principals.py); older records: default

    def moved(self, verb: str, message: str | None = None) -> SandboxRecord:
        """This record after the move `verb` (sandbox_state.MOVES); IllegalMove if not allowed."""
        chosen = move(self.state, verb)
        return replace(
            self, state=chosen.target, reason=chosen.reason, message=message, transition_at=utcnow()
        )

    def to_json(self) -> str:
        data = self.__dict__.copy()
        for key in ("created_at", "transition_at", "expires_at"):
            data[key] = data[key].isoformat() if data[key] else None
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> SandboxRecord:
        data = json.loads(text)
        for key in ("created_at", "transition_at", "expires_at"):
            data[key] = datetime.fromisoformat(data[key]) if data[key] else None
        data["state"] = SandboxState(data["state"])
        return cls(**data)


@dataclass(frozen=True)
class Revisioned[Document]:
    """A stored document (a sandbox's policy or vault state) and the revision it was stored as."""

    revision: int
    document: Document


class NotFound(KeyError):
    pass


class SandboxStore:
    """The database's tables; safe to share between threads (one connection behind a lock).
    `target`: the SQLite file, or a PostgreSQL URL (database.py)."""

    def __init__(self, target: Path | str) -> None:
        self._db: Database = open_database(target)
        self._db.script(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def transaction(self) -> AbstractContextManager[Database]:
        return self._db.transaction()

    # sandboxes
    def put_sandbox(self, record: SandboxRecord) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO sandboxes(id, record, state, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET record=excluded.record, state=excluded.state",
                (record.id, record.to_json(), record.state, record.created_at.isoformat()),
            )

    def create_sandbox(self, record: SandboxRecord, policy: Policy) -> None:
        """A new sandbox's record and its first policy revision, in one transaction (rule 2)."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO sandboxes(id, record, state, created_at) VALUES (?, ?, ?, ?)",
                (record.id, record.to_json(), record.state, record.created_at.isoformat()),
            )
            db.execute(
                "INSERT INTO policies(sandbox_id, revision, document, updated_at) VALUES (?, 1, ?, ?)",
                (record.id, json.dumps(to_document(policy)), utcnow().isoformat()),
            )
            db.execute(
                "INSERT INTO sandbox_tenants VALUES (?, ?) "
                "ON CONFLICT(id) DO UPDATE SET tenant=excluded.tenant",
                (record.id, record.tenant),
            )

    def get_sandbox(self, sandbox_id: str) -> SandboxRecord:
        row = self._db.one("SELECT record FROM sandboxes WHERE id = ?", (sandbox_id,))
        if row is None:
            raise NotFound(sandbox_id)
        return SandboxRecord.from_json(row[0])

    def list_sandboxes(self) -> list[SandboxRecord]:
        rows = self._db.execute("SELECT record FROM sandboxes ORDER BY created_at, id")
        return [SandboxRecord.from_json(row[0]) for row in rows]

    def tenant_of(self, sandbox_id: str) -> str | None:
        """Whose the sandbox is or was (None: never created here)."""
        row = self._db.one("SELECT tenant FROM sandbox_tenants WHERE id = ?", (sandbox_id,))
        if row is None:  # a sandbox of a server before tenants: its record says (default)
            try:
                return self.get_sandbox(sandbox_id).tenant
            except NotFound:
                return None
        return str(row[0])

    def tenant_sandboxes(self, tenant: str) -> list[str]:
        """Every sandbox the tenant has or had (an audit query's scope)."""
        rows = self._db.execute("SELECT id FROM sandbox_tenants WHERE tenant = ?", (tenant,))
        live = [r.id for r in self.list_sandboxes() if r.tenant == tenant]
        return sorted({row[0] for row in rows} | set(live))

    # tenants' ceilings
    def tenant_ceiling(self, tenant: str) -> Policy | None:
        row = self._db.one("SELECT document FROM tenant_ceilings WHERE tenant = ?", (tenant,))
        return policy_from_dict(json.loads(row[0]), f"the stored ceiling of tenant {tenant}") if row else None

    def put_tenant_ceiling(self, tenant: str, ceiling: Policy | None) -> None:
        """Set (or with None remove) the tenant's ceiling."""
        with self.transaction() as db:
            db.execute("DELETE FROM tenant_ceilings WHERE tenant = ?", (tenant,))
            if ceiling is not None:
                db.execute(
                    "INSERT INTO tenant_ceilings VALUES (?, ?, ?)",
                    (tenant, json.dumps(to_document(ceiling)), utcnow().isoformat()),
                )

    def tenants(self) -> list[str]:
        """Every tenant with a sandbox (now or before) or a ceiling."""
        rows = self._db.execute("SELECT tenant FROM sandbox_tenants UNION SELECT tenant FROM tenant_ceilings")
        return sorted({row[0] for row in rows} | {r.tenant for r in self.list_sandboxes()})

    def delete_sandbox(self, sandbox_id: str, expired_at: datetime | None = None) -> None:
        """Delete the record; with `expired_at`, keep a tombstone saying when it expired (older
        tombstones are dropped in the same transaction)."""
        now = utcnow()
        with self.transaction() as db:
            db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))
            if expired_at is not None:
                db.execute(
                    "INSERT INTO tombstones(id, expired_at, deleted_at) VALUES (?, ?, ?) ON CONFLICT(id) "
                    "DO UPDATE SET expired_at=excluded.expired_at, deleted_at=excluded.deleted_at",
                    (sandbox_id, expired_at.isoformat(), now.isoformat()),
                )
                cutoff = now - timedelta(days=TOMBSTONE_DAYS)
                db.execute("DELETE FROM tombstones WHERE deleted_at < ?", (cutoff.isoformat(),))

    def expired_at(self, sandbox_id: str) -> datetime | None:
        """When a sandbox deleted for its expiry expired (None if it did not, or long ago)."""
        row = self._db.one("SELECT expired_at FROM tombstones WHERE id = ?", (sandbox_id,))
        return datetime.fromisoformat(row[0]) if row else None

    # policies and vault state: one revisioned JSON document per sandbox and table
    def get_policy(self, sandbox_id: str) -> Revisioned[Policy] | None:
        stored = self._get_revisioned("policies", "document", sandbox_id)
        if stored is None:
            return None
        policy = policy_from_dict(stored.document, f"the stored policy of sandbox {sandbox_id}")
        return Revisioned(stored.revision, policy)

    def put_policy(self, sandbox_id: str, policy: Policy, expected_revision: int | None) -> int:
        document = to_document(policy)
        return self._put_revisioned("policies", "document", sandbox_id, document, expected_revision)

    def get_vault(self, sandbox_id: str) -> Revisioned[VaultState] | None:
        stored = self._get_revisioned("vaults", "state", sandbox_id)
        return Revisioned(stored.revision, VaultState.model_validate(stored.document)) if stored else None

    def put_vault(self, sandbox_id: str, state: VaultState, expected_revision: int | None) -> int:
        return self._put_revisioned("vaults", "state", sandbox_id, state.to_document(), expected_revision)

    def delete_vault(self, sandbox_id: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM vaults WHERE sandbox_id = ?", (sandbox_id,))

    # a column's JSON, as stored (rule 4)
    def _get_revisioned(self, table: str, column: str, sandbox_id: str) -> Revisioned[dict[str, Any]] | None:
        row = self._db.one(f"SELECT revision, {column} FROM {table} WHERE sandbox_id = ?", (sandbox_id,))
        return Revisioned(row[0], json.loads(row[1])) if row else None

    def _put_revisioned(
        self, table: str, column: str, sandbox_id: str, document: dict[str, Any], expected: int | None
    ) -> int:
        """Store `document` as the next revision; `expected` is the revision the caller read
        (0 = none yet, None = do not check). Raises RevisionConflict when someone was faster."""
        with self.transaction() as db:
            row = db.one(f"SELECT revision FROM {table} WHERE sandbox_id = ?", (sandbox_id,))
            current = row[0] if row else 0
            if expected is not None and expected != current:
                raise RevisionConflict(current, expected)
            db.execute(
                f"INSERT INTO {table}(sandbox_id, revision, {column}, updated_at) VALUES (?, ?, ?, ?) "
                f"ON CONFLICT(sandbox_id) DO UPDATE SET revision=excluded.revision, "
                f"{column}=excluded.{column}, updated_at=excluded.updated_at",
                (sandbox_id, current + 1, json.dumps(document), utcnow().isoformat()),
            )
            return current + 1


class RevisionConflict(Exception):
    def __init__(self, current: int, expected: int) -> None:
        super().__init__(f"revision is {current}, not the expected {expected}; re-read and retry")
        self.current = current
        self.expected = expected

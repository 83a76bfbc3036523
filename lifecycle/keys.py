"""Managed API keys: each belongs to a tenant, has a role, an id and maybe an expiry; stored hashed.

Rules:
1. A key is `sgk_<id>_<secret>`: the id (12 hex) finds its row, the secret (256 random bits) is
   what proves it. It never starts with '-' (a command line would take it for an option).
2. Only the SHA-256 of the whole key is stored. A slow password hash (bcrypt, argon2) guards
   secrets people choose, which are guessable; a 256-bit random key cannot be guessed from its
   digest at any hashing speed, and every API call checks its key, where a slow hash would cost
   tens of milliseconds of CPU per call. Digests are compared in constant time.
3. A key is shown once, by `create` and `rotate`; `rotate` revokes the old key and makes a new
   one with the same tenant, role and lifetime. `revoke` is immediate: the caller (the server)
   closes what the key has open (api/streams.py).
4. The rows live in the server's state database (the same one as the sandboxes: SQLite or
   PostgreSQL, database.py), in their own table, one transaction per write.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sandgate.lifecycle.database import open_database
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.principals import ROLES, Principal

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    digest TEXT NOT NULL,          -- sha256 hex of the whole key (rule 2)
    tenant TEXT NOT NULL,
    role TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    revoked_at TEXT
);
"""
KEY_TEXT = r"sgk_(?P<id>[0-9a-f]{12})_[A-Za-z0-9_-]{43}"  # a key, wherever it is written
KEY_FORMAT = re.compile(f"^{KEY_TEXT}$")
TENANT_FORMAT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


LIFETIME = re.compile(r"^(\d+)(m|h|d)$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def parse_lifetime(text: str) -> timedelta:
    """`90d`, `12h`, `30m`: a key's lifetime."""
    found = LIFETIME.match(text.strip())
    if found is None or int(found[1]) == 0:
        raise LifecycleError("invalid", f"lifetime {text!r}: give a positive number of m, h or d (e.g. 90d)")
    return timedelta(**{_UNITS[found[2]]: int(found[1])})


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def check_tenant(tenant: str) -> str:
    if not TENANT_FORMAT.match(tenant):
        raise LifecycleError(
            "invalid", f"tenant {tenant!r} must be 1-63 of a-z, 0-9 and '-', starting with a letter or digit"
        )
    return tenant


@dataclass(frozen=True)
class ManagedKey:
    """A key's row, never its secret."""

    id: str
    tenant: str
    role: str
    name: str
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    @property
    def principal(self) -> Principal:
        return Principal(id=self.id, tenant=self.tenant, role=self.role, via="key")

    def usable(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("created_at", "expires_at", "revoked_at"):
            data[name] = data[name].isoformat() if data[name] else None
        data["state"] = "revoked" if self.revoked_at else ("active" if self.usable(now()) else "expired")
        return data


def now() -> datetime:
    return datetime.now(UTC)


class KeyBook:
    """The managed keys in the database at `target` (a SQLite file or a PostgreSQL URL)."""

    def __init__(self, target: Path | str) -> None:
        self._db = open_database(target)
        self._db.script(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def create(
        self, tenant: str, role: str, name: str = "", ttl: timedelta | None = None
    ) -> tuple[ManagedKey, str]:
        """A new key (row, the key itself: shown once)."""
        if role not in ROLES:
            raise LifecycleError("invalid", f"role {role!r} is not one of {', '.join(ROLES)}")
        if ttl is not None and ttl <= timedelta(0):
            raise LifecycleError("invalid", "a key's lifetime must be positive")
        key_id = secrets.token_hex(6)
        secret = f"sgk_{key_id}_{secrets.token_urlsafe(32)}"
        created = now()
        row = ManagedKey(key_id, check_tenant(tenant), role, name, created, created + ttl if ttl else None)
        self._db.execute(
            "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
            (row.id, digest(secret), row.tenant, row.role, row.name, _text(row.created_at),
             _text(row.expires_at)),
        )  # fmt: skip
        return row, secret

    def get(self, key_id: str) -> ManagedKey:
        found = self._db.one(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
        if found is None:
            raise LifecycleError("not_found", f"no key {key_id!r}")
        return _row(found)

    def list(self) -> list[ManagedKey]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at")
        return [_row(found) for found in rows]

    def revoke(self, key_id: str) -> ManagedKey:
        row = self.get(key_id)
        if row.revoked_at is None:
            self._db.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?", (_text(now()), key_id))
        return self.get(key_id)

    def rotate(self, key_id: str) -> tuple[ManagedKey, str]:
        """Revoke `key_id` and make its successor (same tenant, role, name and lifetime)."""
        old = self.revoke(key_id)
        ttl = old.expires_at - old.created_at if old.expires_at else None
        return self.create(old.tenant, old.role, old.name, ttl)

    def resolve(self, key: str) -> ManagedKey | None:
        """The usable key row `key` proves, or None (unknown, wrong secret, revoked, expired)."""
        match = KEY_FORMAT.match(key)
        if match is None:
            return None
        found = self._db.one(f"SELECT {_COLUMNS}, digest FROM api_keys WHERE id = ?", (match["id"],))
        if found is None or not hmac.compare_digest(found[-1], digest(key)):
            return None
        row = _row(found[:-1])
        return row if row.usable(now()) else None


_COLUMNS = "id, tenant, role, name, created_at, expires_at, revoked_at"


def _text(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _row(found: Sequence[Any]) -> ManagedKey:
    key_id, tenant, role, name, created, expires, revoked = found
    return ManagedKey(
        key_id, tenant, role, name, datetime.fromisoformat(created),
        datetime.fromisoformat(expires) if expires else None,
        datetime.fromisoformat(revoked) if revoked else None,
    )  # fmt: skip

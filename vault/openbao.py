"""Secrets in HashiCorp Vault or OpenBao (KV version 2), through hvac.

Rules:
1. Each secret is one KV v2 path `<prefix>/<name>` under `<mount>` holding `{"value": ...}`;
   versions and timestamps are KV v2's own metadata, so `bao kv metadata get` agrees with us.
2. Values are cached in memory for `cache_ttl` seconds, so a rotation made elsewhere (the
   `bao` CLI, another sandgate) is picked up within the TTL; this process's own writes drop the
   cached value at once. `cache_ttl=0` reads through on every reveal.
3. Token or AppRole auth. With AppRole, an expired or revoked token is renewed by logging in
   again once per failing call.
4. Errors name the server, the path and what to check, never a value.
5. hvac (and requests under it) is imported on first use: a local-vault process (the proxy,
   every CLI call) does not pay its import time.
"""

from __future__ import annotations

import builtins
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sandgate.vault.errors import SecretNotFound, VaultError
from sandgate.vault.models import SecretInfo, check_name

REQUEST_TIMEOUT = 10.0
_FRACTION = re.compile(r"\.(\d{1,6})\d*")


class OpenBaoStore:
    """A SecretStore on a Vault/OpenBao KV v2 mount."""

    def __init__(
        self,
        addr: str,
        token: str | None = None,
        role_id: str | None = None,
        secret_id: str | None = None,
        mount: str = "secret",
        prefix: str = "sandgate",
        cache_ttl: float = 30.0,
    ) -> None:
        if not token and not role_id:
            raise VaultError(
                f"OpenBao at {addr}: give a token (SANDGATE_OPENBAO_TOKEN) or an AppRole "
                "(SANDGATE_OPENBAO_ROLE_ID and SANDGATE_OPENBAO_SECRET_ID)"
            )
        self.addr = addr
        self.mount = mount
        self.prefix = prefix.strip("/")
        self.cache_ttl = cache_ttl
        self._role = (role_id, secret_id) if role_id else None
        import hvac

        self._client = hvac.Client(url=addr, token=token, timeout=REQUEST_TIMEOUT)
        self._cache: dict[str, tuple[float, str]] = {}
        self._cache_lock = threading.Lock()
        if self._role:
            self._login()

    def __repr__(self) -> str:
        return f"OpenBaoStore({self.addr!r}, mount={self.mount!r}, prefix={self.prefix!r})"

    # -- the SecretStore protocol ------------------------------------------------------------

    def put(self, name: str, value: str) -> SecretInfo:
        check_name(name)
        if not value:
            raise VaultError(f"refusing to store an empty value for {name!r}")
        self._call(
            f"write {self._path(name)}",
            lambda kv: kv.create_or_update_secret(
                path=self._path(name), secret={"value": value}, mount_point=self.mount
            ),
        )
        self._forget(name)
        info = self._info(name)
        if info is None:
            raise VaultError(
                f"OpenBao at {self.addr}: {self._where(name)} vanished right after it was written"
            )
        return info

    def delete(self, name: str) -> bool:
        check_name(name)
        existed = self._info(name) is not None
        if existed:
            self._call(
                f"delete {self._path(name)}",
                lambda kv: kv.delete_metadata_and_all_versions(path=self._path(name), mount_point=self.mount),
            )
        self._forget(name)
        return existed

    def list(self) -> builtins.list[SecretInfo]:
        infos = (self._info(name) for name in self._names())
        return [info for info in infos if info is not None]

    def reveal(self, name: str) -> str:
        check_name(name)  # a name is a path segment: never `..` or `/`
        now = time.monotonic()
        with self._cache_lock:
            cached = self._cache.get(name)
        if cached and now - cached[0] < self.cache_ttl:
            return cached[1]
        value = self._read_value(name)
        with self._cache_lock:
            self._cache[name] = (now, value)
        return value

    # -- KV v2 -----------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _where(self, name: str) -> str:
        return f"{self.mount}/{self._path(name)}"

    def _names(self) -> builtins.list[str]:
        listed = self._call(
            f"list {self.prefix}/",
            lambda kv: kv.list_secrets(path=self.prefix, mount_point=self.mount),
            missing=lambda: None,
        )
        keys = listed["data"]["keys"] if listed else []
        return sorted(key for key in keys if not key.endswith("/"))

    def _info(self, name: str) -> SecretInfo | None:
        """Metadata of the current version, or None when the secret is absent or soft-deleted."""
        meta = self._call(
            f"read metadata of {self._where(name)}",
            lambda kv: kv.read_secret_metadata(path=self._path(name), mount_point=self.mount),
            missing=lambda: None,
        )
        if meta is None:
            return None
        data = meta["data"]
        current = data["versions"].get(str(data["current_version"]), {})
        if not current or current.get("deletion_time") or current.get("destroyed"):
            return None
        return SecretInfo(
            name=name,
            version=data["current_version"],
            created_at=_parse_time(data["created_time"]),
            updated_at=_parse_time(data["updated_time"]),
        )

    def _read_value(self, name: str) -> str:
        secret = self._call(
            f"read {self._where(name)}",
            lambda kv: kv.read_secret_version(
                path=self._path(name), mount_point=self.mount, raise_on_deleted_version=True
            ),
            missing=lambda: None,
        )
        value = (secret or {}).get("data", {}).get("data", {}).get("value")
        if not isinstance(value, str):
            raise SecretNotFound(name, f"OpenBao {self.addr} ({self._where(name)})")
        return value

    def _forget(self, name: str) -> None:
        with self._cache_lock:
            self._cache.pop(name, None)

    # -- transport and auth ----------------------------------------------------------------

    def _login(self) -> None:
        import hvac.exceptions
        import requests

        assert self._role is not None
        role_id, secret_id = self._role
        try:
            self._client.auth.approle.login(role_id=role_id, secret_id=secret_id)
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise VaultError(
                f"OpenBao at {self.addr}: AppRole login failed ({type(exc).__name__}); check "
                "SANDGATE_OPENBAO_ROLE_ID / SANDGATE_OPENBAO_SECRET_ID and that approle is enabled"
            ) from None

    def _call(
        self, what: str, request: Callable[[Any], Any], missing: Callable[[], Any] | None = None
    ) -> Any:
        """Run one KV v2 request; 404 -> `missing()`, a 403 with AppRole -> log in again once."""
        import hvac.exceptions
        import requests

        for attempt in (1, 2):
            try:
                return request(self._client.secrets.kv.v2)
            except hvac.exceptions.InvalidPath:
                if missing is None:
                    raise VaultError(f"OpenBao at {self.addr}: cannot {what}: path not found") from None
                return missing()
            except hvac.exceptions.Forbidden:
                if self._role and attempt == 1:
                    self._login()
                    continue
                raise VaultError(
                    f"OpenBao at {self.addr}: permission denied to {what}; the token or AppRole policy must "
                    f"allow it on {self.mount}/data/{self.prefix}/* and {self.mount}/metadata/{self.prefix}/*"
                ) from None
            except hvac.exceptions.VaultError as exc:
                raise VaultError(
                    f"OpenBao at {self.addr}: cannot {what}: {type(exc).__name__}: {exc}"
                ) from None
            except requests.RequestException as exc:
                raise VaultError(
                    f"cannot reach OpenBao at {self.addr} to {what} ({type(exc).__name__}); "
                    "check SANDGATE_OPENBAO_ADDR and that the server is up and unsealed"
                ) from None
        raise AssertionError("unreachable")


def _parse_time(text: str) -> datetime:
    """KV v2 timestamps carry nanoseconds; Python keeps microseconds."""
    parsed = datetime.fromisoformat(_FRACTION.sub(r".\1", text).replace("Z", "+00:00"))
    return parsed.astimezone(UTC)

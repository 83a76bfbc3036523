"""The local vault: one encrypted file in the state dir.

Rules:
1. No value is ever written in plaintext. The file holds one AES-256-GCM ciphertext of all
   entries under a random data key; the data key is stored wrapped (AES-256-GCM) by the master
   key, which comes from `SANDGATE_VAULT_KEY` or from a key file (0600) created on first start.
2. The file is all or nothing: every byte is authenticated (the header is the ciphertext's
   associated data, base64 must be canonical), so a flipped or cut byte is refused with
   `VaultTampered` and nothing of the file is used.
3. Writes are atomic (temp file, fsync, rename, directory fsync) and serialised by a lock
   file, so a crash leaves the old or the new vault, never a mix. Readers need no lock.
4. Readers notice writers: the decrypted entries are cached under the file's identity (device,
   inode, size, mtime); every read checks it, so a value rotated by another process (the
   control plane) is what the next `reveal` (in the proxy) returns.

A master-key rotation writes the new key beside the old one (`vault.key.new`) before the vault
and renames it over the old key after; a reader whose key no longer fits re-reads the key file
(under the lock, so never mid-rotation) and finishes a rotation that crashed in between.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandgate.vault.errors import SecretNotFound, VaultError, VaultKeyError, VaultTampered
from sandgate.vault.models import SecretInfo, check_name

KEY_BYTES = 32
NONCE_BYTES = 12
FORMAT: Final = "sandgate-vault"
FORMAT_VERSION: Final = 1
WRAP_AAD = b"sandgate-vault/v1/data-key"


class _Envelope(BaseModel):
    """The file on disk: a header (authenticated) and two ciphertexts."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal["sandgate-vault"]
    v: Literal[1]
    key_id: str
    wrapped_key: str
    nonce: str
    ciphertext: str

    def header(self) -> bytes:
        return _header(self.key_id)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str = Field(repr=False)  # never in a traceback's locals or a debug print
    version: int
    created_at: datetime
    updated_at: datetime

    def info(self, name: str) -> SecretInfo:
        return SecretInfo(
            name=name, version=self.version, created_at=self.created_at, updated_at=self.updated_at
        )


class _Contents(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entries: dict[str, _Entry] = {}


class _Loaded:
    """The decrypted vault as read at one file identity, with its data key for the next write."""

    def __init__(self, contents: _Contents, data_key: bytes, identity: tuple[int, ...] | None) -> None:
        self.contents = contents
        self.data_key = data_key
        self.identity = identity


def generate_master_key() -> str:
    """A new random master key, base64, as SANDGATE_VAULT_KEY expects."""
    return base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def decode_master_key(text: str, source: str = "SANDGATE_VAULT_KEY") -> bytes:
    """The 32 key bytes of a base64 (standard or URL-safe) master key, or VaultKeyError."""
    cleaned = text.strip()
    try:
        key = base64.b64decode(cleaned.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        raise VaultKeyError(
            f"{source} is not base64; generate a key with `sandgate vault rotate-key --generate`"
        ) from None
    if len(key) != KEY_BYTES:
        raise VaultKeyError(f"{source} decodes to {len(key)} bytes; the master key must be {KEY_BYTES} bytes")
    return key


def key_id(master_key: bytes) -> str:
    """A short public fingerprint of a master key (HMAC, so it reveals nothing of the key)."""
    return hmac.new(master_key, b"sandgate vault key id", hashlib.sha256).hexdigest()[:16]


class LocalStore:
    """Secrets in one encrypted file; see the module docstring for the rules."""

    def __init__(self, path: Path, master_key: bytes | None = None, key_file: Path | None = None) -> None:
        self.path = Path(path)
        self.key_file = Path(key_file) if key_file else self.path.with_suffix(".key")
        self._key_is_explicit = master_key is not None
        self._lock = threading.Lock()
        self._held = threading.local()  # this thread's flock depth (see _file_lock)
        self._loaded: _Loaded | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if master_key is not None:
            self._master = _checked_key(master_key, "the master key")
        else:
            self._master = self._master_from_key_file()
        self._read()  # a wrong key or a tampered file is reported at open, not at first use

    def __repr__(self) -> str:
        return f"LocalStore({str(self.path)!r})"

    # -- the SecretStore protocol ------------------------------------------------------------

    def put(self, name: str, value: str) -> SecretInfo:
        check_name(name)
        if not value:
            raise VaultError(f"refusing to store an empty value for {name!r}")
        with self._writing() as loaded:
            now = datetime.now(UTC)
            old = loaded.contents.entries.get(name)
            entry = _Entry(
                value=value,
                version=old.version + 1 if old else 1,
                created_at=old.created_at if old else now,
                updated_at=now,
            )
            loaded.contents.entries[name] = entry
        return entry.info(name)

    def delete(self, name: str) -> bool:
        check_name(name)
        with self._writing() as loaded:
            return loaded.contents.entries.pop(name, None) is not None

    def list(self) -> builtins.list[SecretInfo]:
        entries = self._read().contents.entries
        return [entries[name].info(name) for name in sorted(entries)]

    def reveal(self, name: str) -> str:
        entry = self._read().contents.entries.get(check_name(name))
        if entry is None:
            raise SecretNotFound(name, str(self.path))
        return entry.value

    # -- master key ------------------------------------------------------------------------

    def rotate_key(self, new_master_key: bytes | None = None) -> None:
        """Re-encrypt everything under a new master key and a new data key.

        With a key file, a new key is generated into it. With an explicit master key (from
        SANDGATE_VAULT_KEY) the caller must pass the new key and update the environment.
        """
        if self._key_is_explicit and new_master_key is None:
            raise VaultKeyError(
                "the master key comes from SANDGATE_VAULT_KEY, so the new key must be given: "
                "pass it on stdin to `sandgate vault rotate-key`, then set SANDGATE_VAULT_KEY to it"
            )
        new_key = _checked_key(new_master_key or secrets.token_bytes(KEY_BYTES), "the new master key")
        with self._file_lock():
            loaded = self._read()
            pending = self._pending_key_file()
            if not self._key_is_explicit:
                _write_atomically(pending, base64.b64encode(new_key) + b"\n")
            self._write(_Loaded(loaded.contents, secrets.token_bytes(KEY_BYTES), None), new_key)
            self._master = new_key
            if not self._key_is_explicit:
                os.replace(pending, self.key_file)
                _fsync_dir(self.key_file.parent)

    # -- reading -------------------------------------------------------------------------

    def _read(self) -> _Loaded:
        """The current contents; decrypts only when the file changed since the last read."""
        with self._lock:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                if self._loaded is None or self._loaded.identity is not None:
                    self._loaded = _Loaded(_Contents(), secrets.token_bytes(KEY_BYTES), None)
                return self._loaded
            with os.fdopen(fd, "rb") as handle:
                stat = os.fstat(handle.fileno())
                identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
                if self._loaded is None or self._loaded.identity != identity:
                    self._loaded = self._decrypt(handle.read(), identity)
            return self._loaded

    def _decrypt(self, raw: bytes, identity: tuple[int, ...]) -> _Loaded:
        envelope = self._parse_envelope(raw)
        data_key = self._unwrap(envelope)
        try:
            plaintext = AESGCM(data_key).decrypt(
                _b64(envelope.nonce, self.path), _b64(envelope.ciphertext, self.path), envelope.header()
            )
            contents = _Contents.model_validate_json(plaintext)
        except (InvalidTag, ValidationError):
            raise self._tampered("its contents fail authentication") from None
        return _Loaded(contents, data_key, identity)

    def _parse_envelope(self, raw: bytes) -> _Envelope:
        try:
            return _Envelope.model_validate_json(raw)
        except ValidationError:
            raise self._tampered("it is not a complete sandgate vault file") from None

    def _unwrap(self, envelope: _Envelope) -> bytes:
        """The data key; tells a wrong master key apart from a modified file."""
        wrapped = _b64(envelope.wrapped_key, self.path)
        master_matches = hmac.compare_digest(envelope.key_id, key_id(self._master))
        if not master_matches and self._adopt_rotated_key(envelope.key_id):
            master_matches = True
        try:
            data_key = AESGCM(self._master).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], WRAP_AAD)
        except InvalidTag:
            if master_matches:
                raise self._tampered("its wrapped data key fails authentication") from None
            raise VaultKeyError(
                f"the master key does not open {self.path} (key id {key_id(self._master)}, the file "
                f"was written with {envelope.key_id}): set SANDGATE_VAULT_KEY to the key it was "
                f"written with, or restore {self.key_file}"
            ) from None
        if not master_matches:
            raise self._tampered("its key id was changed")
        return data_key

    def _tampered(self, what: str) -> VaultTampered:
        return VaultTampered(
            f"refusing {self.path}: {what} (modified, truncated or corrupted); nothing of it was used. "
            "Restore it from a backup, or move it away to start an empty vault"
        )

    # -- writing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _writing(self) -> Iterator[_Loaded]:
        """Read-modify-write under the lock file; the change is written only if the block succeeds."""
        with self._file_lock():
            loaded = self._read()
            staged = _Loaded(loaded.contents.model_copy(deep=True), loaded.data_key, loaded.identity)
            yield staged
            self._write(staged, self._master)

    def _write(self, loaded: _Loaded, master: bytes) -> None:
        kid = key_id(master)
        wrap_nonce, nonce = secrets.token_bytes(NONCE_BYTES), secrets.token_bytes(NONCE_BYTES)
        wrapped = wrap_nonce + AESGCM(master).encrypt(wrap_nonce, loaded.data_key, WRAP_AAD)
        plaintext = loaded.contents.model_dump_json().encode()
        envelope = _Envelope(
            format=FORMAT,
            v=FORMAT_VERSION,
            key_id=kid,
            wrapped_key=_b64e(wrapped),
            nonce=_b64e(nonce),
            ciphertext=_b64e(AESGCM(loaded.data_key).encrypt(nonce, plaintext, _header(kid))),
        )
        _write_atomically(self.path, envelope.model_dump_json().encode())
        with self._lock:
            self._loaded = None  # the next read picks up the new file identity

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """The writers' lock (flock on its own open file, so threads exclude each other too);
        re-entrant within a thread, where a second flock would deadlock."""
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._held.depth = 1
            yield
        finally:
            self._held.depth = 0
            os.close(fd)

    # -- key file ------------------------------------------------------------------------

    def _master_from_key_file(self) -> bytes:
        if self.key_file.exists():
            return _read_key_file(self.key_file)
        if self.path.exists():
            raise VaultKeyError(
                f"{self.path} exists but its key file {self.key_file} is missing and no master key was "
                "given: restore the key file, or set SANDGATE_VAULT_KEY to the key the vault was written with"
            )
        key = secrets.token_bytes(KEY_BYTES)
        if not _create_exclusively(self.key_file, base64.b64encode(key) + b"\n"):
            return _read_key_file(self.key_file)  # another process created it first
        return key

    def _pending_key_file(self) -> Path:
        return self.key_file.with_name(self.key_file.name + ".new")

    def _adopt_rotated_key(self, file_key_id: str) -> bool:
        """The file needs another key from the key file: another process rotated it, or crashed
        after writing the vault but before renaming `vault.key.new` (then finish that rename).

        Taken under the lock file: a rotation in progress holds it, so afterwards the key files
        are either complete or left by a crash.
        """
        if self._key_is_explicit:
            return False
        with self._file_lock():
            for candidate in (self.key_file, self._pending_key_file()):
                if not candidate.exists():
                    continue
                key = _read_key_file(candidate)
                if hmac.compare_digest(key_id(key), file_key_id):
                    if candidate != self.key_file:
                        os.replace(candidate, self.key_file)
                        _fsync_dir(self.key_file.parent)
                    self._master = key
                    return True
        return False


def _header(file_key_id: str) -> bytes:
    """The associated data of the contents: binds the format, version and key id to them."""
    return f"{FORMAT}/v{FORMAT_VERSION}/{file_key_id}".encode()


def _checked_key(key: bytes, what: str) -> bytes:
    if len(key) != KEY_BYTES:
        raise VaultKeyError(f"{what} must be {KEY_BYTES} bytes, got {len(key)}")
    return key


def _read_key_file(path: Path) -> bytes:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise VaultKeyError(
            f"key file {path} is readable by others (mode {mode:04o}); run `chmod 600 {path}`"
        )
    return decode_master_key(path.read_text(), f"key file {path}")


def _b64e(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _b64(text: str, path: Path) -> bytes:
    """Strict base64: a non-canonical encoding (one a flipped bit can produce) is tampering."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        data = None
    if data is None or _b64e(data) != text:
        raise VaultTampered(f"refusing {path}: a field is not valid base64 (modified or corrupted)")
    return data


def _write_atomically(path: Path, data: bytes) -> None:
    """Temp file (0600) in the same directory, fsync, rename over `path`, fsync the directory."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _create_exclusively(path: Path, data: bytes) -> bool:
    """Like _write_atomically, but False (and nothing written) when `path` already exists."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    _write_atomically(temp, data)
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    finally:
        temp.unlink()
    _fsync_dir(path.parent)
    return True


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

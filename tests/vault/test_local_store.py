"""LocalStore against real files: encryption at rest, keys, tamper detection, two processes."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandgate.vault import (
    InvalidSecretName,
    LocalStore,
    SecretNotFound,
    VaultError,
    VaultKeyError,
    VaultTampered,
    decode_master_key,
    generate_master_key,
    open_store,
    secret_forms,
)

SECRET = "ghp_TestSecretValue_0123456789abcdef"


def files_bytes(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def assert_nowhere(directory: Path, value: str) -> None:
    forms = secret_forms(value) | {value.encode().hex().encode()}
    for path, data in files_bytes(directory).items():
        for form in forms:
            assert form not in data, f"{path} contains a form of the secret: {form!r}"


@pytest.fixture
def key() -> bytes:
    return os.urandom(32)


def test_round_trip_versions_and_metadata(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "vault.enc")
    first = store.put("github", SECRET)
    second = store.put("github", SECRET + "-rotated")
    store.put("openai", "sk-other-value-123")
    assert (first.version, second.version) == (1, 2)
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    assert [(i.name, i.version) for i in store.list()] == [("github", 2), ("openai", 1)]
    assert "value" not in type(first).model_fields
    assert store.reveal("github") == SECRET + "-rotated"
    assert sorted(store.reveal(meta.name) for meta in store.list()) == sorted(
        [SECRET + "-rotated", "sk-other-value-123"]
    )
    assert store.delete("github") is True
    assert store.delete("github") is False
    with pytest.raises(SecretNotFound, match="no secret named 'github'"):
        store.reveal("github")


def test_state_dir_never_holds_a_value(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "vault.enc")
    store.put("a", SECRET)
    store.put("b", "user:" + SECRET)
    store.put("a", SECRET + "x")  # rotated: the old value must not linger either
    store.rotate_key()
    assert {p.name for p in tmp_path.iterdir()} == {"vault.enc", "vault.key", "vault.enc.lock"}
    for value in (SECRET, SECRET + "x", "user:" + SECRET):
        assert_nowhere(tmp_path, value)


def test_files_are_private(tmp_path: Path) -> None:
    LocalStore(tmp_path / "vault.enc").put("a", SECRET)
    assert (tmp_path / "vault.enc").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "vault.key").stat().st_mode & 0o777 == 0o600


def test_wrong_master_key_is_a_clear_error(tmp_path: Path, key: bytes) -> None:
    LocalStore(tmp_path / "vault.enc", master_key=key).put("a", SECRET)
    with pytest.raises(VaultKeyError, match=r"master key does not open .*vault.enc"):
        LocalStore(tmp_path / "vault.enc", master_key=os.urandom(32))


def test_missing_master_key_is_a_clear_error(tmp_path: Path, key: bytes) -> None:
    LocalStore(tmp_path / "vault.enc", master_key=key).put("a", SECRET)
    with pytest.raises(VaultKeyError, match=r"key file .*vault.key is missing and no master key"):
        LocalStore(tmp_path / "vault.enc")


def test_malformed_master_keys(tmp_path: Path) -> None:
    with pytest.raises(VaultKeyError, match="not base64"):
        decode_master_key("not base64 at all!")
    with pytest.raises(VaultKeyError, match="decodes to 16 bytes"):
        decode_master_key(base64.b64encode(bytes(16)).decode())
    with pytest.raises(VaultKeyError, match="must be 32 bytes"):
        LocalStore(tmp_path / "vault.enc", master_key=b"short")
    assert len(decode_master_key(generate_master_key())) == 32


def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    LocalStore(tmp_path / "vault.enc").put("a", SECRET)
    (tmp_path / "vault.key").chmod(0o644)
    with pytest.raises(VaultKeyError, match=r"readable by others .*chmod 600"):
        LocalStore(tmp_path / "vault.enc")


def test_every_flipped_byte_is_refused(tmp_path: Path, key: bytes) -> None:
    path = tmp_path / "vault.enc"
    LocalStore(path, master_key=key).put("a", SECRET)
    original = path.read_bytes()
    for index in range(len(original)):
        tampered = bytearray(original)
        tampered[index] ^= 0x01
        path.write_bytes(bytes(tampered))
        with pytest.raises(VaultTampered, match=r"refusing .*vault.enc"):
            LocalStore(path, master_key=key)
    path.write_bytes(original)
    assert LocalStore(path, master_key=key).reveal("a") == SECRET


@pytest.mark.parametrize("cut", [0, 1, 40, "half", -2, -1])
def test_truncated_file_is_refused(tmp_path: Path, key: bytes, cut: int | str) -> None:
    path = tmp_path / "vault.enc"
    LocalStore(path, master_key=key).put("a", SECRET)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 if cut == "half" else int(cut)])
    with pytest.raises(VaultTampered, match="not a complete sandgate vault file"):
        LocalStore(path, master_key=key)


def test_tampering_under_an_open_reader_is_refused_not_served_stale(tmp_path: Path, key: bytes) -> None:
    path = tmp_path / "vault.enc"
    reader = LocalStore(path, master_key=key)
    reader.put("a", SECRET)
    assert reader.reveal("a") == SECRET
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x04
    path.write_bytes(bytes(data))
    with pytest.raises(VaultTampered):
        reader.reveal("a")


def test_a_second_instance_sees_rotation_at_the_next_reveal(tmp_path: Path) -> None:
    writer = LocalStore(tmp_path / "vault.enc")
    writer.put("token", "value-one-111")
    reader = LocalStore(tmp_path / "vault.enc")
    assert reader.reveal("token") == "value-one-111"
    writer.put("token", "value-two-222")
    assert reader.reveal("token") == "value-two-222"
    writer.delete("token")
    with pytest.raises(SecretNotFound):
        reader.reveal("token")


def test_another_process_sees_rotation_at_the_next_reveal(tmp_path: Path) -> None:
    """The proxy is a separate process that keeps its LocalStore open."""
    writer = LocalStore(tmp_path / "vault.enc")
    writer.put("token", "value-one-111")
    reader_code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from sandgate.vault import LocalStore
        store = LocalStore(Path({str(tmp_path / "vault.enc")!r}))
        for line in sys.stdin:
            print(store.reveal(line.strip()), flush=True)
        """
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", reader_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdin and reader.stdout
        reader.stdin.write("token\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "value-one-111"
        writer.put("token", "value-two-222")
        reader.stdin.write("token\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "value-two-222"
    finally:
        reader.kill()
        reader.wait(timeout=10)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    LocalStore(tmp_path / "vault.enc")  # creates the key file before the race
    writer_code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from sandgate.vault import LocalStore
        store = LocalStore(Path({str(tmp_path / "vault.enc")!r}))
        for i in range(15):
            store.put(f"{{sys.argv[1]}}-{{i}}", f"value-{{sys.argv[1]}}-{{i}}")
        """
    )
    writers = [subprocess.Popen([sys.executable, "-c", writer_code, tag]) for tag in ("left", "right")]
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    store = LocalStore(tmp_path / "vault.enc")
    assert len(store.list()) == 30
    assert store.reveal("right-14") == "value-right-14"


def test_rotate_key_with_key_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "vault.enc")
    store.put("a", SECRET)
    old_key = (tmp_path / "vault.key").read_text()
    store.rotate_key()
    assert (tmp_path / "vault.key").read_text() != old_key
    assert LocalStore(tmp_path / "vault.enc").reveal("a") == SECRET
    with pytest.raises(VaultKeyError):
        LocalStore(tmp_path / "vault.enc", master_key=decode_master_key(old_key))


def test_an_open_reader_follows_a_key_rotation(tmp_path: Path) -> None:
    """The proxy keeps its store open while `sandgate vault rotate-key` runs in another process."""
    reader = LocalStore(tmp_path / "vault.enc")
    writer = LocalStore(tmp_path / "vault.enc")
    writer.put("a", SECRET)
    assert reader.reveal("a") == SECRET
    writer.rotate_key()
    writer.put("a", SECRET + "-2")
    assert reader.reveal("a") == SECRET + "-2"
    reader.put("b", SECRET)  # and writes with the new key
    assert LocalStore(tmp_path / "vault.enc").reveal("b") == SECRET


def test_concurrent_first_starts_agree_on_one_key(tmp_path: Path) -> None:
    starter_code = textwrap.dedent(
        f"""
        from pathlib import Path
        from sandgate.vault import LocalStore
        LocalStore(Path({str(tmp_path / "vault.enc")!r})).put("k", "v-" + __import__("os").urandom(4).hex())
        """
    )
    starters = [subprocess.Popen([sys.executable, "-c", starter_code]) for _ in range(3)]
    assert [s.wait(timeout=60) for s in starters] == [0, 0, 0]
    assert LocalStore(tmp_path / "vault.enc").list()[0].version == 3


def test_rotate_explicit_key_needs_the_new_key(tmp_path: Path, key: bytes) -> None:
    store = LocalStore(tmp_path / "vault.enc", master_key=key)
    store.put("a", SECRET)
    with pytest.raises(VaultKeyError, match="new key must be given"):
        store.rotate_key()
    new_key = os.urandom(32)
    store.rotate_key(new_key)
    assert store.reveal("a") == SECRET
    assert LocalStore(tmp_path / "vault.enc", master_key=new_key).reveal("a") == SECRET
    with pytest.raises(VaultKeyError):
        LocalStore(tmp_path / "vault.enc", master_key=key)


def test_interrupted_key_rotation_is_finished_on_open(tmp_path: Path) -> None:
    """A crash after the vault was re-encrypted but before the new key file was renamed."""
    store = LocalStore(tmp_path / "vault.enc")
    store.put("a", SECRET)
    old_key = (tmp_path / "vault.key").read_bytes()
    store.rotate_key()
    new_key_file = tmp_path / "vault.key.new"
    os.replace(tmp_path / "vault.key", new_key_file)
    (tmp_path / "vault.key").write_bytes(old_key)
    (tmp_path / "vault.key").chmod(0o600)
    assert LocalStore(tmp_path / "vault.enc").reveal("a") == SECRET
    assert not new_key_file.exists()
    assert (tmp_path / "vault.key").read_bytes() != old_key


def test_bad_names_and_empty_values(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "vault.enc")
    for name in ("", "../etc", "has space", "-dash", "x" * 129):
        with pytest.raises(InvalidSecretName, match="invalid secret name"):
            store.put(name, SECRET)
    with pytest.raises(VaultError, match="empty value"):
        store.put("ok", "")


def test_open_store_local(tmp_path: Path) -> None:
    key = generate_master_key()
    store = open_store("local", tmp_path, vault_key=key)
    store.put("a", SECRET)
    assert not (tmp_path / "vault.key").exists()  # the key came from the setting
    assert open_store("local", tmp_path, vault_key=key).reveal("a") == SECRET
    with pytest.raises(VaultKeyError):
        open_store("local", tmp_path)
    with pytest.raises(VaultError, match="no address"):
        open_store("openbao", tmp_path)

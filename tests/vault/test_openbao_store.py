"""OpenBaoStore against a real OpenBao dev server: token and AppRole auth, KV v2, cache TTL."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import hvac
import pytest

from sandgate.vault import InvalidSecretName, OpenBaoStore, SecretNotFound, VaultError, open_store
from tests.support.openbao import OpenBao, free_port, openbao_dev_server


@pytest.fixture(scope="module")
def bao() -> Iterator[OpenBao]:
    with openbao_dev_server() as server:
        yield server


@pytest.fixture
def root(bao: OpenBao) -> hvac.Client:
    return hvac.Client(url=bao.addr, token=bao.root_token)


@pytest.fixture
def prefix() -> str:
    return "sg-" + secrets.token_hex(4)


@pytest.fixture
def approle(root: hvac.Client, prefix: str) -> dict[str, str]:
    """An AppRole whose policy covers only `secret/<prefix>/*`."""
    if "approle/" not in root.sys.list_auth_methods():
        root.sys.enable_auth_method("approle")
    policy = f"""
    path "secret/data/{prefix}/*" {{ capabilities = ["create", "read", "update", "delete"] }}
    path "secret/metadata/{prefix}/*" {{ capabilities = ["read", "list", "delete"] }}
    path "secret/metadata/{prefix}" {{ capabilities = ["list"] }}
    """
    root.sys.create_or_update_policy(name=prefix, policy=policy)
    root.auth.approle.create_or_update_approle(role_name=prefix, token_policies=[prefix], token_ttl="5m")
    role_id = root.auth.approle.read_role_id(role_name=prefix)["data"]["role_id"]
    secret_id = root.auth.approle.generate_secret_id(role_name=prefix)["data"]["secret_id"]
    return {"role_id": role_id, "secret_id": secret_id}


def token_store(bao: OpenBao, prefix: str, **kwargs: Any) -> OpenBaoStore:
    return OpenBaoStore(bao.addr, token=bao.root_token, prefix=prefix, **kwargs)


def test_round_trip_list_rotate_delete(bao: OpenBao, prefix: str) -> None:
    store = token_store(bao, prefix)
    first = store.put("github", "bao-value-one")
    second = store.put("github", "bao-value-two")
    store.put("openai", "bao-other")
    assert (first.version, second.version) == (1, 2)
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at
    assert [(i.name, i.version) for i in store.list()] == [("github", 2), ("openai", 1)]
    assert store.reveal("github") == "bao-value-two"
    assert sorted(store.reveal(meta.name) for meta in store.list()) == ["bao-other", "bao-value-two"]
    assert store.delete("github") is True
    assert store.delete("github") is False
    with pytest.raises(SecretNotFound, match="no secret named 'github'"):
        store.reveal("github")
    assert [i.name for i in store.list()] == ["openai"]


def test_a_name_cannot_leave_the_prefix(bao: OpenBao, root: hvac.Client, prefix: str) -> None:
    root.secrets.kv.v2.create_or_update_secret(path="outside", secret={"value": "outside-value"})
    with pytest.raises(InvalidSecretName):
        token_store(bao, prefix).reveal("../outside")


def test_empty_prefix_lists_nothing(bao: OpenBao, prefix: str) -> None:
    assert token_store(bao, prefix).list() == []


def test_layout_is_plain_kv_v2(bao: OpenBao, root: hvac.Client, prefix: str) -> None:
    token_store(bao, prefix).put("api", "bao-layout-value")
    read = root.secrets.kv.v2.read_secret_version(
        path=f"{prefix}/api", mount_point="secret", raise_on_deleted_version=True
    )
    assert read["data"]["data"] == {"value": "bao-layout-value"}


def test_cache_ttl_picks_up_a_rotation_made_elsewhere(bao: OpenBao, root: hvac.Client, prefix: str) -> None:
    store = token_store(bao, prefix, cache_ttl=1.0)
    store.put("api", "cached-old")
    assert store.reveal("api") == "cached-old"
    root.secrets.kv.v2.create_or_update_secret(path=f"{prefix}/api", secret={"value": "cached-new"})
    assert store.reveal("api") == "cached-old"  # within the TTL the cached value serves
    time.sleep(1.1)
    assert store.reveal("api") == "cached-new"


def test_own_writes_drop_the_cached_value(bao: OpenBao, prefix: str) -> None:
    store = token_store(bao, prefix, cache_ttl=300)
    store.put("api", "own-old")
    assert store.reveal("api") == "own-old"
    store.put("api", "own-new")
    assert store.reveal("api") == "own-new"


def test_approle_auth_and_relogin_after_revocation(
    bao: OpenBao, root: hvac.Client, prefix: str, approle: dict[str, str]
) -> None:
    store = OpenBaoStore(bao.addr, prefix=prefix, cache_ttl=0, **approle)
    store.put("api", "approle-value")
    assert store.reveal("api") == "approle-value"
    root.auth.token.revoke(store._client.token)
    assert store.reveal("api") == "approle-value"


def test_approle_outside_its_policy_is_denied(bao: OpenBao, prefix: str, approle: dict[str, str]) -> None:
    store = OpenBaoStore(bao.addr, prefix=prefix + "-other", **approle)
    with pytest.raises(VaultError, match="permission denied to write"):
        store.put("api", "denied-value")


def test_bad_approle_credentials(bao: OpenBao, approle: dict[str, str]) -> None:
    with pytest.raises(VaultError, match="AppRole login failed"):
        OpenBaoStore(bao.addr, role_id=approle["role_id"], secret_id="not-the-secret-id")


def test_bad_token_is_a_clear_error(bao: OpenBao, prefix: str) -> None:
    store = OpenBaoStore(bao.addr, token="not-a-token", prefix=prefix)
    with pytest.raises(VaultError, match="permission denied"):
        store.put("api", "x-value")


def test_unreachable_server_is_a_clear_error(prefix: str) -> None:
    store = OpenBaoStore(f"http://127.0.0.1:{free_port()}", token="t", prefix=prefix)
    with pytest.raises(VaultError, match=r"cannot reach OpenBao at http://127.0.0.1"):
        store.reveal("api")


def test_no_auth_is_a_clear_error() -> None:
    with pytest.raises(VaultError, match="give a token"):
        OpenBaoStore("http://127.0.0.1:1")


def test_open_store_openbao(bao: OpenBao, prefix: str, tmp_path: Any) -> None:
    store = open_store(
        "openbao", tmp_path, openbao_addr=bao.addr, openbao_token=bao.root_token, openbao_prefix=prefix
    )
    store.put("api", "factory-value")
    assert store.reveal("api") == "factory-value"
    assert list(tmp_path.iterdir()) == []

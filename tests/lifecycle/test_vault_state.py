"""Credential-vault state changes in OpenSandbox semantics: whole-request checks, no values kept."""

from __future__ import annotations

import json

import pytest

from sandgate.lifecycle.api.egress_models import CredentialVaultCreateRequest, CredentialVaultMutationRequest
from sandgate.lifecycle.api.vault_state import build_create, build_patch, public_state
from sandgate.lifecycle.credential_state import VaultState
from sandgate.lifecycle.errors import LifecycleError

BINDING = {
    "name": "gh",
    "match": {"hosts": ["api.example.com"]},
    "auth": {"type": "bearer", "credential": "tok"},
}


def created() -> VaultState:
    request = CredentialVaultCreateRequest.model_validate(
        {
            "credentials": [{"name": "tok", "source": {"type": "inline", "value": "s3cret-v1"}}],
            "bindings": [BINDING],
        }
    )
    state, values = build_create("sb1", request, 1)
    assert list(values.values()) == ["s3cret-v1"]
    assert "s3cret" not in json.dumps(state.to_document())
    return state


def test_create_keeps_names_and_revision_but_no_value() -> None:
    view = public_state(1, created()).model_dump(by_alias=True, exclude_none=True)
    assert view["credentials"] == [{"name": "tok", "sourceType": "inline", "revision": 1}]
    assert view["bindings"][0]["auth"] == {"type": "bearer"}
    assert view["bindings"][0]["match"]["hosts"] == ["api.example.com"]


def test_replace_writes_a_new_entry_name_for_the_new_value() -> None:
    old = created()
    patch = CredentialVaultMutationRequest.model_validate(
        {"credentials": {"replace": [{"name": "tok", "source": {"type": "inline", "value": "v2"}}]}}
    )
    state, values = build_patch("sb1", old, patch, 2)
    (entry,) = values
    assert values[entry] == "v2" and entry != old.credentials[0].entry
    assert state.credentials[0].revision == 2 and state.bindings[0].revision == 1


def test_a_null_list_in_a_create_is_empty_as_go_writes_a_nil_slice() -> None:
    request = CredentialVaultCreateRequest.model_validate({"credentials": None, "bindings": None})
    assert (request.credentials, request.bindings) == ([], [])
    with pytest.raises(ValueError, match="credentials"):
        CredentialVaultCreateRequest.model_validate({"bindings": []})  # absent is still an error


def test_the_stored_shape_is_the_one_older_databases_hold() -> None:
    document = created().to_document()
    assert document["credentials"] == [
        {"name": "tok", "sourceType": "inline", "revision": 1, "entry": "sb.sb1.tok.r1"}
    ]
    assert document["bindings"][0]["binding"]["auth"] == {"type": "bearer", "credential": "tok"}
    assert VaultState.model_validate(document) == created()


@pytest.mark.parametrize(
    ("patch", "kind"),
    [
        ({"credentials": {"delete": ["tok"]}}, "invalid"),  # the binding would dangle
        ({"credentials": {"delete": ["missing"]}}, "invalid"),
        ({"bindings": {"add": [BINDING]}}, "conflict"),
        ({"bindings": {"replace": [{**BINDING, "name": "other"}]}}, "invalid"),
    ],
)
def test_bad_patches_are_refused_whole(patch: dict, kind: str) -> None:
    with pytest.raises(LifecycleError) as raised:
        build_patch("sb1", created(), CredentialVaultMutationRequest.model_validate(patch), 2)
    assert raised.value.kind == kind

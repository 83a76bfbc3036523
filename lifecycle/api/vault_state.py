"""How OpenSandbox credential-vault create/patch requests change a sandbox's `VaultState`
(lifecycle/credential_state.py), and the state's public views.

Rules:
1. Pure: no I/O. A builder returns the next state and the values to write to the vault; the
   service does the writing, the pushing and the persisting.
2. State holds names, revisions, bindings and vault entry names, never a value. A credential's
   entry name carries the revision it was written in, so a new value never overwrites the one
   the proxy is using until the switch.
3. A request is checked whole (unique names, every reference resolves, adds do not clash,
   replaces and deletes name something that exists); the first problem found is reported with
   where it is. Host/port/header rules are checked by the policy validator on the whole policy.
"""

from __future__ import annotations

from sandgate.lifecycle.api.egress_models import (
    Credential,
    CredentialAuthMetadata,
    CredentialBindingMetadata,
    CredentialMetadata,
    CredentialVaultCreateRequest,
    CredentialVaultMutationRequest,
    CredentialVaultState,
)
from sandgate.lifecycle.credential_state import BindingEntry, CredentialEntry, VaultState
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.opensandbox_shapes import CredentialBinding

Values = dict[str, str]  # vault entry name -> the value to write


def entry_name(sandbox_id: str, credential: str, revision: int) -> str:
    """A vault entry name private to the sandbox and the revision (vault alphabet: A-Z a-z 0-9 . _ -)."""
    return f"sb.{sandbox_id}.{credential}.r{revision}"


def build_create(
    sandbox_id: str, request: CredentialVaultCreateRequest, revision: int
) -> tuple[VaultState, Values]:
    return _build(sandbox_id, {}, {}, request.credentials, request.bindings, revision)


def build_patch(
    sandbox_id: str, old: VaultState, request: CredentialVaultMutationRequest, revision: int
) -> tuple[VaultState, Values]:
    credentials = {item.name: item for item in old.credentials}
    bindings = {item.name: item for item in old.bindings}
    _apply_names(credentials, request.credentials.delete, "credentials", "delete")
    _apply_names(bindings, request.bindings.delete, "bindings", "delete")
    _apply_names(credentials, [c.name for c in request.credentials.replace], "credentials", "replace")
    _apply_names(bindings, [b.name for b in request.bindings.replace], "bindings", "replace")
    clashes = [c.name for c in request.credentials.add if c.name in credentials]
    clashes += [b.name for b in request.bindings.add if b.name in bindings]
    if clashes:
        raise LifecycleError("conflict", f"already exist: {', '.join(clashes)} (use replace to change them)")
    return _build(
        sandbox_id,
        credentials,
        bindings,
        [*request.credentials.add, *request.credentials.replace],
        [*request.bindings.add, *request.bindings.replace],
        revision,
    )


def _apply_names(
    items: dict[str, CredentialEntry] | dict[str, BindingEntry], names: list[str], where: str, verb: str
) -> None:
    """Remove `names` (for delete they are gone; for replace the new version comes back in)."""
    missing = [name for name in names if name not in items]
    if missing:
        raise LifecycleError("invalid", f"{where}.{verb}: no such name(s): {', '.join(missing)}")
    for name in names:
        del items[name]


def _build(
    sandbox_id: str,
    credentials: dict[str, CredentialEntry],
    bindings: dict[str, BindingEntry],
    new_credentials: list[Credential],
    new_bindings: list[CredentialBinding],
    revision: int,
) -> tuple[VaultState, Values]:
    _unique([c.name for c in new_credentials], "credentials")
    _unique([b.name for b in new_bindings], "bindings")
    values: Values = {}
    for credential in new_credentials:
        entry = entry_name(sandbox_id, credential.name, revision)
        values[entry] = credential.source.value
        credentials[credential.name] = CredentialEntry(
            name=credential.name, sourceType=credential.source.type, revision=revision, entry=entry
        )
    for binding in new_bindings:
        bindings[binding.name] = BindingEntry(name=binding.name, revision=revision, binding=binding)
    for item in bindings.values():
        auth = item.binding.auth
        unresolved = [name for name in auth.credential_names() if name not in credentials]
        if unresolved:
            raise LifecycleError(
                "invalid",
                f"binding {item.name!r} refers to unknown credential(s): {', '.join(unresolved)}",
            )
    return VaultState(credentials=list(credentials.values()), bindings=list(bindings.values())), values


def _unique(names: list[str], where: str) -> None:
    seen: set[str] = set()
    doubles = {name for name in names if name in seen or seen.add(name)}  # type: ignore[func-returns-value]
    if doubles:
        raise LifecycleError(
            "invalid", f"{where}: names must be unique, repeated: {', '.join(sorted(doubles))}"
        )


def credential_metadata(state: VaultState) -> list[CredentialMetadata]:
    return [
        CredentialMetadata(name=c.name, sourceType=c.source_type, revision=c.revision)
        for c in state.credentials
    ]


def binding_metadata(state: VaultState) -> list[CredentialBindingMetadata]:
    out = []
    for item in state.bindings:
        auth = item.binding.auth
        out.append(
            CredentialBindingMetadata(
                name=item.name,
                revision=item.revision,
                match=item.binding.match,
                auth=CredentialAuthMetadata(type=auth.type, name=auth.name),
            )
        )
    return out


def public_state(revision: int, state: VaultState) -> CredentialVaultState:
    return CredentialVaultState(
        revision=revision, credentials=credential_metadata(state), bindings=binding_metadata(state)
    )

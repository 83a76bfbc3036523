"""The credential-vault state of one sandbox: the document api/vault_state.py builds, the store
keeps (table `vaults`) and the egress part reads back.

Rules:
1. Names, revisions, bindings and vault entry names; never a credential value.
2. The JSON shape is the one stored since the first release (`sourceType` in camelCase), so a
   database written before these models existed reads unchanged.
3. A binding is kept in the credential-vault API's shape (`CredentialBinding`), a subset of the
   policy file's binding: it joins the sandbox's policy as JSON (`policy_bindings`), and the
   policy book validates the two together before any push.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from sandgate.lifecycle.opensandbox_shapes import CredentialBinding


class CredentialEntry(BaseModel):
    """One credential: its name in bindings and the vault entry holding its value."""

    name: str
    source_type: str = Field(alias="sourceType")
    revision: int = Field(description="the vault revision that wrote this value")
    entry: str = Field(description="the vault entry name (private to the sandbox and revision)")


class BindingEntry(BaseModel):
    """One binding: which requests get which credential, in the policy's binding shape."""

    name: str
    revision: int
    binding: CredentialBinding


class VaultState(BaseModel):
    credentials: list[CredentialEntry] = Field(default_factory=list)
    bindings: list[BindingEntry] = Field(default_factory=list)

    def entries(self) -> dict[str, str]:
        """Credential name -> vault entry name (what the proxy's entry carries)."""
        return {credential.name: credential.entry for credential in self.credentials}

    def policy_bindings(self) -> list[dict[str, Any]]:
        """The bindings as policy JSON (the policy book checks them with the policy, rule 3)."""
        return [item.binding.model_dump(by_alias=True, exclude_none=True) for item in self.bindings]

    def to_document(self) -> dict[str, Any]:
        """The stored and audited JSON form (rule 2): absent fields are left out, never null."""
        return self.model_dump(by_alias=True, exclude_none=True)

"""Wire models of the OpenSandbox egress API (`/policy`) and credential-vault API.

The 1.1.1 clients reach these through the 18080 endpoint, which sandgate serves from the
control plane (never inside the sandbox). Rules:
1. Shapes follow the OpenSandbox egress sidecar; unknown fields are refused (the sidecar's
   schema sets additionalProperties false), so a typo fails loudly instead of being ignored.
   The binding shape, which the credential-vault state keeps, is in lifecycle/opensandbox_shapes.py.
2. Credential values are write-only: they appear in requests, never in a response model.
3. A list the create request requires may be null: Go's encoding/json writes a nil slice so (the
   Go SDK's `credentials` of a vault with bindings only), and the sidecar reads it as empty.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from sandgate.lifecycle.opensandbox_shapes import (
    CredentialBinding,
    CredentialMatch,
    Name,
    NetworkPolicy,
    StrictModel,
)


class PolicyStatusResponse(StrictModel):
    status: str = "ok"
    mode: Literal["allow_all", "deny_all", "enforcing"]
    enforcement_mode: str = Field("proxy", alias="enforcementMode")
    reason: str | None = None
    policy: NetworkPolicy | None = None


class InlineCredentialSource(StrictModel):
    type: Literal["inline"] = "inline"
    value: str = Field(min_length=1, json_schema_extra={"writeOnly": True})


class Credential(StrictModel):
    name: Name
    source: InlineCredentialSource


def _null_is_empty(value: Any) -> Any:
    return [] if value is None else value


class CredentialVaultCreateRequest(StrictModel):  # rule 3
    credentials: Annotated[list[Credential], BeforeValidator(_null_is_empty)]
    bindings: Annotated[list[CredentialBinding], BeforeValidator(_null_is_empty)]


class CredentialMutationSet(StrictModel):
    add: list[Credential] = Field(default_factory=list)
    replace: list[Credential] = Field(default_factory=list)
    delete: list[str] = Field(default_factory=list)


class BindingMutationSet(StrictModel):
    add: list[CredentialBinding] = Field(default_factory=list)
    replace: list[CredentialBinding] = Field(default_factory=list)
    delete: list[str] = Field(default_factory=list)


class CredentialVaultMutationRequest(StrictModel):
    expected_revision: int | None = Field(None, alias="expectedRevision")
    credentials: CredentialMutationSet = Field(default_factory=CredentialMutationSet)
    bindings: BindingMutationSet = Field(default_factory=BindingMutationSet)


class CredentialMetadata(StrictModel):
    name: str
    source_type: str = Field(alias="sourceType")
    revision: int


class CredentialAuthMetadata(StrictModel):
    type: str
    name: str | None = None


class CredentialBindingMetadata(StrictModel):
    name: str
    revision: int
    match: CredentialMatch | None = None
    auth: CredentialAuthMetadata | None = None


class CredentialVaultState(StrictModel):
    revision: int
    credentials: list[CredentialMetadata]
    bindings: list[CredentialBindingMetadata]


class CredentialListResponse(StrictModel):
    revision: int
    credentials: list[CredentialMetadata]


class CredentialBindingListResponse(StrictModel):
    revision: int
    bindings: list[CredentialBindingMetadata]

"""Wire models of the OpenSandbox egress API (`/policy`) and credential-vault API.

The 1.1.1 clients reach these through the 18080 endpoint, which sandgate serves from the
control plane (never inside the sandbox). Rules:
1. Shapes follow the OpenSandbox egress sidecar; unknown fields are refused (the sidecar's
   schema sets additionalProperties false), so a typo fails loudly instead of being ignored.
2. Credential values are write-only: they appear in requests, never in a response model.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sandgate.lifecycle.api.models import NetworkPolicy

HeaderName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")]
# Credential names become part of vault entry names, so they use the vault's alphabet.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
BindingName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^\S+$")]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


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


class CredentialMatch(StrictModel):
    schemes: list[Literal["https", "http"]] = Field(default=["https"])
    ports: list[Annotated[int, Field(ge=1, le=65535)]] | None = None
    hosts: list[Annotated[str, StringConstraints(min_length=1)]] = Field(min_length=1)
    methods: list[str] = Field(default_factory=lambda: ["GET", "POST", "PUT", "PATCH", "DELETE"])
    paths: list[str] = Field(default_factory=lambda: ["/*"])


class CustomHeaderEntry(StrictModel):
    name: HeaderName
    credential: Name


class CredentialSubstitution(StrictModel):
    credential: Name
    placeholder: str = Field(min_length=1)
    in_: list[Literal["header", "query", "path", "body"]] = Field(alias="in", min_length=1)


class CredentialAuth(StrictModel):
    """One auth style; which fields are required depends on `type` (checked by the service)."""

    type: Literal["bearer", "basic", "apiKey", "customHeaders", "passthrough"]
    credential: Name | None = None
    name: HeaderName | None = None
    headers: list[CustomHeaderEntry] | None = None
    substitutions: list[CredentialSubstitution] | None = None

    def credential_names(self) -> list[str]:
        names = [self.credential] if self.credential else []
        names += [entry.credential for entry in self.headers or []]
        names += [entry.credential for entry in self.substitutions or []]
        return names


class CredentialBinding(StrictModel):
    name: BindingName
    match: CredentialMatch
    auth: CredentialAuth


class CredentialVaultCreateRequest(StrictModel):
    credentials: list[Credential]
    bindings: list[CredentialBinding]


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

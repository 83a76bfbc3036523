"""The OpenSandbox wire shapes that reach below the API: the policy book takes and gives the
network policy, the credential-vault state keeps the bindings.

Rules:
1. Field names on the wire are camelCase (aliases); Python code uses snake_case.
2. Lifecycle shapes (`WireModel`) ignore unknown fields, as the reference server does; the egress
   sidecar's shapes (`StrictModel`) refuse them (its schema sets additionalProperties false), so a
   typo fails loudly. Every known field is validated.
The other request and response shapes are in api/models.py and api/egress_models.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

HeaderName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")]
# Credential names become part of vault entry names, so they use the vault's alphabet.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
BindingName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^\S+$")]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class WireModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class NetworkRule(WireModel):
    action: Literal["allow", "deny"]
    target: str = Field(min_length=1, description="FQDN, `*.` wildcard, IP or CIDR")


class NetworkPolicy(WireModel):
    """The OpenSandbox egress policy shape (also the sidecar's /policy body)."""

    default_action: Literal["allow", "deny"] | None = None
    egress: list[NetworkRule] = Field(default_factory=list)

    def wire(self) -> dict[str, Any]:  # the JSON sandgate.policy reads (a superset of this shape)
        return self.model_dump(by_alias=True, exclude_none=True)


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

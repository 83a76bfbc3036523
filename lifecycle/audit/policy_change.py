"""A policy_change audit record: what was changed (`Change`, its `reason` and `event`) and its
`detail` (`PolicyChange`). Egress control writes it, the console and the OCSF export read it.

Rules:
1. `old`/`new` are whole documents, a policy's or a credential-vault state's stored JSON (rule,
   binding and vault entry names, never a value), so a reviewer can diff them (docs/audit.md).
2. One model for the writer and the reader. The writer fills every field; `to_detail` is the
   JSON every version wrote (keys sorted).
3. Reading never fails: records of older servers lack fields (then None), and a detail that is
   not a JSON object reads as an empty change.
4. A change is not a decision: `change_record` writes it (decision `allow`, `reason` and `event`
   its `Change`), and its words live here, not among the policy's reasons. A `lifecycle` record
   (a sandbox's expiry renewed) is written the same way, its detail the old and new expiry.
5. Each names its principal (`principal`: key id or OIDC subject, tenant, role), the call's
   under way (lifecycle/principals.py `acting`).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from sandgate.lifecycle.principals import acting
from sandgate.proxy import AuditRecord, RecordKind

CONTROL_PLANE = "control-plane"  # the `client` of a change: the caller's address is not recorded


class Change(StrEnum):
    """What a control-plane change did, and through which API: a policy_change record's `reason`
    and `event`. Values never change once written (older audit files keep their meaning)."""

    CREATE = "create"  # the policy a sandbox was created with
    POLICY_REPLACE = "policy replace"  # sandgate's egress API
    POLICY_PATCH = "policy patch"
    POLICY_DELETE = "policy delete"
    NETWORKPOLICY_REPLACE = "networkpolicy replace"  # OpenSandbox's egress API
    NETWORKPOLICY_PATCH = "networkpolicy patch"
    NETWORKPOLICY_DELETE = "networkpolicy delete"
    SANDGATE_POLICY_REPLACE = "sandgate-policy replace"  # a policy file sent at create or later
    VAULT_CREATE = "credential-vault create"
    VAULT_PATCH = "credential-vault patch"
    VAULT_DELETE = "credential-vault delete"
    APPROVAL_ALLOW_SANDBOX = "approval allow-sandbox"  # a reviewer allowed a host for the sandbox
    # A `lifecycle` record's: what happened to the sandbox itself.
    RENEW = "renew"  # its expiry was set through the API (renew-expiration)
    RENEW_ON_ACCESS = "renew on access"  # traffic through the server's proxy extended its expiry


class PolicyChange(BaseModel):
    model_config = ConfigDict(extra="ignore")

    actor: str | None = None
    change: str | None = None
    old_revision: int | None = None
    revision: int | str | None = None
    old_digest: str | None = None
    new_digest: str | None = None
    old: dict[str, Any] | None = None  # rule 1: the stored JSON of either document kind, as the
    new: dict[str, Any] | None = None  # server that wrote the record stored it
    isolation: str | None = None  # a create's: the sandbox's isolation (lifecycle/isolation.py)

    @property
    def has_documents(self) -> bool:
        return self.old is not None or self.new is not None

    def to_detail(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True)

    @classmethod
    def from_detail(cls, detail: str | None) -> PolicyChange:
        try:
            data = json.loads(detail or "{}")
        except ValueError:
            return cls()
        return cls.model_validate(data) if isinstance(data, dict) else cls()


def change_record(sandbox_id: str, what: Change, change: PolicyChange) -> AuditRecord:
    """The policy_change record of a change made (a change, not a decision: always `allow`)."""
    return control_plane_record("policy_change", sandbox_id, what, change.to_detail())


def control_plane_record(kind: RecordKind, sandbox_id: str, what: Change, detail: str) -> AuditRecord:
    """A record of the control plane's (`policy_change`, `lifecycle`): what it did, its JSON
    detail, and who asked (the call's principal; none for the server's own acts: expiry,
    renewal on access)."""
    return AuditRecord(
        kind=kind,
        sandbox=sandbox_id,
        client=CONTROL_PLANE,
        decision="allow",
        reason=what,
        event=what,
        detail=detail,
        principal=acting.get(),
    )

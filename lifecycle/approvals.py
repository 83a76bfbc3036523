"""Approvals as the control plane answers them: allow once, allow for the sandbox, or deny.

Rules:
1. The proxy holds the requests (proxy/approvals.py); this module lists them and answers them
   through the proxy's control socket. An id that is not held any more (answered, timed out,
   its sandbox gone) is `not_found`, and nothing changes.
2. "Allow for this sandbox" is a policy change first (an `allow` rule for the request's host,
   patched in front as `osb egress patch` would: its own revision, diff and policy_change record
   naming who), then the held request is allowed. Later requests to that host need no approval.
3. Who answered (`actor`: the API key's holder, or a console session) is in every record the
   answer produces: the request's record says "approved by ..." or "refused by ...".
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from sandgate.lifecycle.audit import Change
from sandgate.lifecycle.egress_control import EgressControl
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.opensandbox_shapes import NetworkRule
from sandgate.policy import Policy

Verdict = Literal["allow-once", "allow-sandbox", "deny"]


class PendingApproval(BaseModel):
    """A request held for a reviewer, as the API, the CLI and the console show it."""

    id: str
    sandbox: str
    method: str
    scheme: str
    host: str
    port: int
    path: str | None
    rule: str | None
    requested_at: float
    expires_at: float


class ApprovalResult(BaseModel):
    id: str
    decision: Verdict
    answered: bool  # False: the request ended (timed out) while the policy was being changed
    policy_revision: int | None = None  # the revision an allow-sandbox answer made


class ApprovalDesk:
    """Where a reviewer lists and answers held requests: the API, the CLI (through the API) and
    the console all come here."""

    def __init__(self, egress: EgressControl) -> None:
        self.egress = egress

    def pending(self) -> list[PendingApproval]:
        held = [PendingApproval.model_validate(item) for item in self.egress.proxy.approvals()]
        return sorted(held, key=lambda approval: approval.requested_at)

    def answer(
        self, approval_id: str, decision: Verdict, actor: str, ceiling: Policy | None = None
    ) -> ApprovalResult:
        """Carry out a reviewer's answer (rules 1-3); an allow-sandbox answer the ceilings refuse
        (`ceiling`: the sandbox's tenant's) is `forbidden` and leaves the request held."""
        held = next((item for item in self.pending() if item.id == approval_id), None)
        if held is None:
            raise LifecycleError(
                "not_found",
                f"approval {approval_id} is not pending: it was answered, timed out, or its sandbox "
                "is gone; nothing was changed (list the pending ones with `sandgate approvals`)",
            )
        revision = None
        if decision == "allow-sandbox":
            revision = self._allow_host(held, actor, ceiling)
        answered = self.egress.proxy.answer_approval(approval_id, decision != "deny", actor)
        if not answered and revision is None:
            raise LifecycleError("not_found", f"approval {approval_id} ended before the answer reached it")
        return ApprovalResult(id=approval_id, decision=decision, answered=answered, policy_revision=revision)

    def _allow_host(self, held: PendingApproval, actor: str, ceiling: Policy | None) -> int:
        rule = NetworkRule(action="allow", target=held.host)
        policies = self.egress.policies
        changed = self.egress.change_policy(
            held.sandbox,
            lambda current: policies.patch_rules(current, [rule]),
            actor,
            Change.APPROVAL_ALLOW_SANDBOX,
            ceiling=ceiling,
        )
        return changed.revision

"""`/approvals`: requests the proxy holds for a reviewer (`action: ask`), and their answers.

Rules: behind the API key like every route (the actor recorded is `api-key`, the audit's
principal the caller's); a caller sees and answers its own tenant's held requests; the work is
lifecycle/approvals.py's. `GET /approvals` lists what is held (oldest first); `POST
/approvals/{id}` with `{"decision": "allow-once" | "allow-sandbox" | "deny"}` answers one; an id
that is not held any more is a 404 and nothing changes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from sandgate.lifecycle.api.calls import ERRORS, call, egress_of, service_of
from sandgate.lifecycle.approvals import ApprovalDesk, ApprovalResult, PendingApproval, Verdict
from sandgate.lifecycle.principals import caller_sees

router = APIRouter(prefix="/approvals", tags=["Approvals"], responses=ERRORS)
ACTOR = "api-key"  # the auth middleware has checked the key


class ApprovalDecision(BaseModel):
    decision: Verdict


@router.get("", response_model=list[PendingApproval])
def list_approvals(request: Request) -> list[PendingApproval]:
    tenant_of = service_of(request).store.tenant_of
    return [
        held
        for held in call(ApprovalDesk(egress_of(request)).pending)
        if caller_sees(tenant_of(held.sandbox) or "")
    ]


@router.post("/{approval_id}", response_model=ApprovalResult)
def answer_approval(request: Request, approval_id: str, body: ApprovalDecision) -> ApprovalResult:
    return call(ApprovalDesk(egress_of(request)).answer, approval_id, body.decision, ACTOR)

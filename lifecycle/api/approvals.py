"""`/approvals`: requests the proxy holds for a reviewer (`action: ask`), and their answers.

Rules: behind the API key like every route (the actor recorded is `api-key`); the work is
lifecycle/approvals.py's. `GET /approvals` lists what is held (oldest first); `POST
/approvals/{id}` with `{"decision": "allow-once" | "allow-sandbox" | "deny"}` answers one; an id
that is not held any more is a 404 and nothing changes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from sandgate.lifecycle.api.calls import ERRORS, call, egress_of
from sandgate.lifecycle.approvals import ApprovalDesk, ApprovalResult, PendingApproval, Verdict

router = APIRouter(prefix="/approvals", tags=["Approvals"], responses=ERRORS)
ACTOR = "api-key"  # the auth middleware has checked the key


class ApprovalDecision(BaseModel):
    decision: Verdict


@router.get("", response_model=list[PendingApproval])
def list_approvals(request: Request) -> list[PendingApproval]:
    return call(ApprovalDesk(egress_of(request)).pending)


@router.post("/{approval_id}", response_model=ApprovalResult)
def answer_approval(request: Request, approval_id: str, body: ApprovalDecision) -> ApprovalResult:
    return call(ApprovalDesk(egress_of(request)).answer, approval_id, body.decision, ACTOR)

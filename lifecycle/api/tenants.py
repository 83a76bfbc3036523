"""`/tenants`: what an admin sets per tenant, today its ceiling: a sandgate policy every policy of
the tenant's sandboxes must also be within (beside the deployment's `policy_ceiling`; both must
allow, docs/policy.md "Ceilings").

Rules: `PUT /tenants/{tenant}/ceiling` takes `{"policy": <sandgate policy document>}`, validated
as every policy is (policy_book.py), its rules named `ceiling of tenant <t>:<n>` in a refusal; it
bounds every create and policy change (egress API, networkpolicy, sandgate-policy, approvals)
from then on. Sandboxes already running keep their policy: the answer lists those the new
ceiling would refuse (`beyond`), for the admin to narrow or delete. `GET` answers the ceiling
(an admin, or any key of that tenant: reviewers read policies), `DELETE` removes it, `GET
/tenants` lists the tenants the server knows. Each change is an `api` audit record.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from sandgate.lifecycle.api.calls import ERRORS, call, egress_of, service_of
from sandgate.lifecycle.api.errors import ApiError
from sandgate.lifecycle.keys import check_tenant
from sandgate.policy import to_document

router = APIRouter(prefix="/tenants", tags=["Tenants"], responses=ERRORS)


class CeilingBody(BaseModel):
    policy: dict[str, Any]


@router.get("")
def list_tenants(request: Request) -> list[str]:
    book = request.app.state.gate.keys
    from_keys = {row.tenant for row in book.list()} if book is not None else set()
    return sorted(set(service_of(request).store.tenants()) | from_keys)


@router.get("/{tenant}/ceiling")
def get_ceiling(request: Request, tenant: str) -> dict[str, Any]:
    ceiling = service_of(request).store.tenant_ceiling(tenant)
    if ceiling is None:
        raise ApiError(404, "NOT_FOUND", f"tenant {tenant!r} has no ceiling")
    return {"tenant": tenant, "policy": to_document(ceiling)}


@router.put("/{tenant}/ceiling")
def put_ceiling(request: Request, tenant: str, body: CeilingBody) -> dict[str, Any]:
    call(check_tenant, tenant)
    egress, store = egress_of(request), service_of(request).store
    ceiling = call(lambda: egress.parse_policy(body.policy, f"ceiling of tenant {tenant}"))
    store.put_tenant_ceiling(tenant, ceiling)
    request.scope["state"]["audit_detail"] = {"tenant": tenant, "ceiling": to_document(ceiling)}
    beyond = [
        {"sandbox": record.id, "refused": decision.reason}
        for record in store.list_sandboxes()
        if record.tenant == tenant
        and not (
            decision := egress.policies.within_ceilings(egress.policy(record.id).document, ceiling)
        ).allowed
    ]
    return {"tenant": tenant, "policy": to_document(ceiling), "beyond": beyond}


@router.delete("/{tenant}/ceiling", status_code=204, response_class=Response)
def delete_ceiling(request: Request, tenant: str) -> Response:
    service_of(request).store.put_tenant_ceiling(tenant, None)
    request.scope["state"]["audit_detail"] = {"tenant": tenant}
    return Response(status_code=204)

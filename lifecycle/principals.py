"""Who calls the control plane: a principal (a key's id or an OIDC subject, its tenant, its role),
and the principal of the call under way.

Rules:
1. Three roles. `admin`: the whole server (keys, tenants and ceilings, every tenant's sandboxes,
   vaults, settings). `operator`: its tenant's sandboxes (create, exec, files, egress within the
   tenant's ceiling). `reviewer`: read-only on its tenant (audit, console, policies) and answers
   approvals; never exec, files or vault values. What each route allows is api/access.py's table.
2. The server's first key (`<state_dir>/api_key`) is the bootstrap admin (`BOOTSTRAP`), tenant
   `default`; sandboxes made before tenants existed belong to `default` too.
3. `acting` holds the principal of the call under way (set by the auth middleware, read by the
   audit writers: a policy change, an execd call, a key change name who made it without every
   layer passing it down). Outside a call (the reaper, renewal on access) it is None.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Literal, get_args

from sandgate.proxy import Principal

Role = Literal["admin", "operator", "reviewer"]
ROLES: tuple[Role, ...] = get_args(Role)
DEFAULT_TENANT = "default"
BOOTSTRAP = Principal(id="bootstrap", tenant=DEFAULT_TENANT, role="admin", via="bootstrap")

acting: ContextVar[Principal | None] = ContextVar("acting", default=None)


def token_holder(kind: str, tenant: str) -> Principal:
    """Whoever holds a sandbox's own `kind` token (execd, egress): no key, the sandbox's tenant."""
    return Principal(id=f"{kind}-token", tenant=tenant, role="sandbox", via="sandbox-token")


def sees_every_tenant(principal: Principal) -> bool:
    return principal.role == "admin"


def may_see(principal: Principal, tenant: str) -> bool:
    """Whether `principal` may know a thing of `tenant` exists (else: 404, never 403)."""
    return sees_every_tenant(principal) or principal.tenant == tenant


def caller_sees(tenant: str) -> bool:
    """Whether the call under way may see a thing of `tenant` (lists are filtered by it); outside
    a call (the CLI reading the state, the reaper) everything is seen."""
    principal = acting.get()
    return principal is None or may_see(principal, tenant)


def caller_tenant() -> str:
    """The tenant a thing the call under way creates belongs to."""
    principal = acting.get()
    return principal.tenant if principal is not None else DEFAULT_TENANT


__all__ = [
    "BOOTSTRAP",
    "DEFAULT_TENANT",
    "ROLES",
    "Principal",
    "Role",
    "acting",
    "caller_sees",
    "caller_tenant",
    "may_see",
    "sees_every_tenant",
    "token_holder",
]

"""The egress API behind each sandbox's 18080 endpoint, served by the control plane.

OpenSandbox runs this API in a sidecar inside the sandbox; sandgate serves it here, outside the
sandbox's trust domain, at `/v1/sandboxes/{id}/egress/...`. Rules:
1. A caller proves itself with the sandbox's `OPENSANDBOX-EGRESS-AUTH` token (what the clients
   send, taken from the endpoint's headers) or with the server's API key (operators, the
   sandgate CLI). Errors are text/plain, as the sidecar's.
2. `/policy` speaks the OpenSandbox shapes; `/sandgate-policy` reads and replaces the full
   sandgate policy document (L7 rules, bindings to named vault entries).
3. Every change goes through `EgressControl.change_policy`/`change_vault` (`Service.egress`):
   validated whole, pushed to the proxy, persisted, audited.
4. The lifecycle API's `/sandboxes/{id}/networkpolicy` (what the SDK uses for template sandboxes)
   is the same policy API behind the server's API key, answering errors as `{code, message}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Request, Response

from sandgate.lifecycle.api.auth import EGRESS_AUTH_HEADER
from sandgate.lifecycle.api.calls import ERRORS, KIND_STATUS, call, egress_of, service_of
from sandgate.lifecycle.api.egress_models import (
    CredentialBindingListResponse,
    CredentialBindingMetadata,
    CredentialListResponse,
    CredentialMetadata,
    CredentialVaultCreateRequest,
    CredentialVaultMutationRequest,
    CredentialVaultState,
    PolicyStatusResponse,
)
from sandgate.lifecycle.api.errors import EgressError
from sandgate.lifecycle.api.vault_state import (
    binding_metadata,
    build_create,
    build_patch,
    credential_metadata,
    public_state,
)
from sandgate.lifecycle.audit import Change
from sandgate.lifecycle.credential_state import VaultState
from sandgate.lifecycle.egress_control import EgressControl, EgressState, PolicyEdit
from sandgate.lifecycle.errors import LifecycleError
from sandgate.lifecycle.opensandbox_shapes import NetworkPolicy, NetworkRule
from sandgate.lifecycle.policy_book import PolicyJSON
from sandgate.policy import to_document

TEXT_ERROR_CODES = (400, 401, 403, 404, 409, 412)
TEXT_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"content": {"text/plain": {"schema": {"type": "string"}}}} for code in TEXT_ERROR_CODES
}


def egress_error(exc: LifecycleError) -> EgressError:
    return EgressError(KIND_STATUS[exc.kind], exc.kind.upper(), exc.message)


def run[T](fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except LifecycleError as exc:
        raise egress_error(exc) from exc


def caller(
    request: Request,
    sandbox_id: str,
    egress_auth: Annotated[str | None, Header(alias=EGRESS_AUTH_HEADER)] = None,
) -> str:
    """Who is calling (for the audit record): a principal the auth middleware let through (its
    key checked, its role and tenant against api/access.py), or the sandbox's egress token."""
    state = request.scope["state"]
    if state.get("principal") is not None:
        run(service_of(request).get, sandbox_id)
        return "egress-token" if state.get("endpoint_token") else "api-key"  # bound to a key (auth.py)
    try:
        egress_of(request).check_egress_token(sandbox_id, egress_auth)
    except LifecycleError as exc:
        status = 404 if exc.kind == "not_found" else 401
        raise EgressError(status, "UNAUTHORIZED", exc.message) from exc
    return "egress-token"


Actor = Annotated[str, Depends(caller)]
router = APIRouter(prefix="/sandboxes/{sandbox_id}/egress", tags=["Egress"], responses=TEXT_ERRORS)


def policy_status(egress: EgressControl, state: EgressState) -> PolicyStatusResponse:
    view = egress.policies.to_opensandbox(state.document)
    mode = "enforcing" if view.egress else ("allow_all" if view.default_action == "allow" else "deny_all")
    return PolicyStatusResponse(mode=mode, policy=view, enforcementMode="proxy")  # type: ignore[arg-type]


Runner = Callable[..., EgressState]  # `run` (egress API: text errors) or `call` (lifecycle API: JSON)


def read_policy(request: Request, sandbox_id: str, runner: Runner) -> PolicyStatusResponse:
    egress = egress_of(request)
    return policy_status(egress, runner(egress.policy, sandbox_id))


def change_policy(
    request: Request, sandbox_id: str, actor: str, what: Change, change: PolicyEdit, runner: Runner
) -> PolicyStatusResponse:
    egress = egress_of(request)
    state = runner(egress.change_policy, sandbox_id, change, actor, what)
    return policy_status(egress, state)


def replacing(request: Request, body: NetworkPolicy | None) -> PolicyEdit:
    """Replace the whole policy; None (empty body, `null`, `{}`) means deny everything."""
    policies = egress_of(request).policies
    return lambda current: policies.replace_opensandbox(current, body)


def patching(request: Request, rules: list[NetworkRule]) -> PolicyEdit:
    """Merge rules: same target overrides, new rules come first, first duplicate in the body wins."""
    policies = egress_of(request).policies
    return lambda current: policies.patch_rules(current, rules)


def deleting(request: Request, targets: list[str]) -> PolicyEdit:
    """Remove the rules for these targets; unknown targets are ignored."""
    policies = egress_of(request).policies
    return lambda current: policies.delete_targets(current, targets)


@router.get("/policy", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def get_policy(request: Request, sandbox_id: str, actor: Actor) -> PolicyStatusResponse:
    return read_policy(request, sandbox_id, run)


@router.put("/policy", response_model=PolicyStatusResponse, response_model_exclude_none=True)
@router.post("/policy", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def replace_policy(
    request: Request, sandbox_id: str, actor: Actor, body: Annotated[NetworkPolicy | None, Body()] = None
) -> PolicyStatusResponse:
    """Replace the policy; an empty body, `null` or `{}` means deny everything."""
    return change_policy(request, sandbox_id, actor, Change.POLICY_REPLACE, replacing(request, body), run)


@router.patch("/policy", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def patch_policy(
    request: Request, sandbox_id: str, actor: Actor, rules: Annotated[list[NetworkRule], Body(min_length=1)]
) -> PolicyStatusResponse:
    """Merge rules: same target overrides, new rules come first, first duplicate in the body wins."""
    return change_policy(request, sandbox_id, actor, Change.POLICY_PATCH, patching(request, rules), run)


@router.delete("/policy", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def delete_policy_rules(
    request: Request, sandbox_id: str, actor: Actor, targets: Annotated[list[str], Body(min_length=1)]
) -> PolicyStatusResponse:
    """Remove the rules for these targets; unknown targets are ignored."""
    return change_policy(request, sandbox_id, actor, Change.POLICY_DELETE, deleting(request, targets), run)


# --- /sandboxes/{id}/networkpolicy: the same policy API on the lifecycle side (API key) ---------

network_policy_router = APIRouter(
    prefix="/sandboxes/{sandbox_id}/networkpolicy", tags=["Sandboxes"], responses=ERRORS
)
NETWORK_POLICY_ACTOR = "api-key"  # the auth middleware has checked the key


@network_policy_router.get("", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def get_network_policy(request: Request, sandbox_id: str) -> PolicyStatusResponse:
    """The sandbox's egress policy in the OpenSandbox shape."""
    return read_policy(request, sandbox_id, call)


@network_policy_router.put("", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def replace_network_policy(request: Request, sandbox_id: str, body: NetworkPolicy) -> PolicyStatusResponse:
    """Replace the whole policy (`{}` means deny everything)."""
    change = replacing(request, body)
    return change_policy(
        request, sandbox_id, NETWORK_POLICY_ACTOR, Change.NETWORKPOLICY_REPLACE, change, call
    )


@network_policy_router.patch("", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def patch_network_policy(
    request: Request, sandbox_id: str, rules: Annotated[list[NetworkRule], Body(min_length=1)]
) -> PolicyStatusResponse:
    """Merge rules as the egress API's PATCH does; defaultAction stays."""
    change = patching(request, rules)
    return change_policy(request, sandbox_id, NETWORK_POLICY_ACTOR, Change.NETWORKPOLICY_PATCH, change, call)


@network_policy_router.delete("", response_model=PolicyStatusResponse, response_model_exclude_none=True)
def delete_network_policy_rules(
    request: Request, sandbox_id: str, targets: Annotated[list[str], Body(min_length=1)]
) -> PolicyStatusResponse:
    """Remove the rules for these targets (idempotent); defaultAction stays."""
    change = deleting(request, targets)
    return change_policy(request, sandbox_id, NETWORK_POLICY_ACTOR, Change.NETWORKPOLICY_DELETE, change, call)


# The two routes below answer and take the policy file's JSON (`to_document`): sandgate.policy
# checks a body and says where it is wrong (file:line style, a 400), not FastAPI (a 422).
@router.get("/sandgate-policy")
def get_sandgate_policy(request: Request, sandbox_id: str, actor: Actor) -> dict[str, object]:
    """The sandgate policy document, its revision, and the effective policy (vault bindings added)."""
    egress = egress_of(request)
    state = run(egress.policy, sandbox_id)
    return {
        "revision": state.revision,
        "policy": to_document(state.document),
        "effective": to_document(egress.effective_policy(sandbox_id)),
    }


@router.put("/sandgate-policy")
def put_sandgate_policy(
    request: Request,
    sandbox_id: str,
    actor: Actor,
    policy: Annotated[PolicyJSON, Body(embed=True)],
    expected_revision: Annotated[int | None, Body(embed=True, alias="expectedRevision")] = None,
) -> dict[str, object]:
    """Replace the sandgate policy document (the credential vault's bindings stay on top of it)."""
    egress = egress_of(request)
    state = run(
        egress.change_policy,
        sandbox_id,
        lambda _current: egress.parse_policy(policy),
        actor,
        Change.SANDGATE_POLICY_REPLACE,
        expected_revision,
    )
    return {"revision": state.revision, "policy": to_document(state.document)}


# --- credential vault ---------------------------------------------------------------------------


@router.post(
    "/credential-vault",
    status_code=201,
    response_model=CredentialVaultState,
    response_model_exclude_none=True,
)
def create_vault(
    request: Request, sandbox_id: str, actor: Actor, body: CredentialVaultCreateRequest
) -> CredentialVaultState:
    state = run(
        egress_of(request).change_vault,
        sandbox_id,
        lambda _old, revision: build_create(sandbox_id, body, revision),
        actor,
        Change.VAULT_CREATE,
        None,
        must_exist=False,
    )
    return public_state(state.revision, state.document)


@router.get("/credential-vault", response_model=CredentialVaultState, response_model_exclude_none=True)
def get_vault(request: Request, sandbox_id: str, actor: Actor) -> CredentialVaultState:
    state = run(egress_of(request).vault_state, sandbox_id)
    return public_state(state.revision, state.document)


@router.patch("/credential-vault", response_model=CredentialVaultState, response_model_exclude_none=True)
def patch_vault(
    request: Request, sandbox_id: str, actor: Actor, body: CredentialVaultMutationRequest
) -> CredentialVaultState:
    state = run(
        egress_of(request).change_vault,
        sandbox_id,
        lambda old, revision: build_patch(sandbox_id, old or VaultState(), body, revision),
        actor,
        Change.VAULT_PATCH,
        body.expected_revision,
        must_exist=True,
    )
    return public_state(state.revision, state.document)


@router.delete("/credential-vault", status_code=204, response_class=Response)
def delete_vault(request: Request, sandbox_id: str, actor: Actor) -> Response:
    run(egress_of(request).delete_vault, sandbox_id, actor)
    return Response(status_code=204)


@router.get("/credential-vault/credentials", response_model=CredentialListResponse)
def list_credentials(request: Request, sandbox_id: str, actor: Actor) -> CredentialListResponse:
    state = run(egress_of(request).vault_state, sandbox_id)
    return CredentialListResponse(revision=state.revision, credentials=credential_metadata(state.document))


@router.get("/credential-vault/credentials/{name}", response_model=CredentialMetadata)
def get_credential(request: Request, sandbox_id: str, name: str, actor: Actor) -> CredentialMetadata:
    state = run(egress_of(request).vault_state, sandbox_id)
    return _one(credential_metadata(state.document), name, "credential")


@router.get(
    "/credential-vault/bindings",
    response_model=CredentialBindingListResponse,
    response_model_exclude_none=True,
)
def list_bindings(request: Request, sandbox_id: str, actor: Actor) -> CredentialBindingListResponse:
    state = run(egress_of(request).vault_state, sandbox_id)
    return CredentialBindingListResponse(revision=state.revision, bindings=binding_metadata(state.document))


@router.get(
    "/credential-vault/bindings/{name}",
    response_model=CredentialBindingMetadata,
    response_model_exclude_none=True,
)
def get_binding(request: Request, sandbox_id: str, name: str, actor: Actor) -> CredentialBindingMetadata:
    state = run(egress_of(request).vault_state, sandbox_id)
    return _one(binding_metadata(state.document), name, "binding")


def _one[Item: (CredentialMetadata, CredentialBindingMetadata)](
    items: list[Item], name: str, what: str
) -> Item:
    for item in items:
        if item.name == name:
            return item
    raise EgressError(404, "NOT_FOUND", f"no {what} named {name!r} in this sandbox's credential vault")

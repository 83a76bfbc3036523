"""The control plane's actions: create, delete, pause, resume, renew, change egress, re-adopt.

Rules:
1. Order of a create: validate everything (request, policy, image) -> build the network ->
   push the sandbox's entry to the proxy (so its first packet is already governed) -> start the
   runtime -> wait for execd `/ping` -> persist as Running. A failure at any step undoes the
   steps before it; nothing half-made is left behind or recorded.
2. Every egress change (policy or credential vault) is computed whole, validated whole, pushed
   to the proxy, then persisted with a new revision and written to the audit log as one
   `policy_change` record. If validation or the push fails, the old state stays in force.
3. Credential values go to the vault under names private to the sandbox; the database and every
   response hold only names. A new revision writes new entries, so the switch is atomic, and
   deletes the old ones afterwards.
4. Restart: the store is the truth. `start()` asks the runtime which sandboxes survived,
   re-pushes their entries to the proxy, marks the rest Terminated and removes their networks,
   all before the API accepts traffic.
5. This module speaks no HTTP: it raises `LifecycleError(kind, message)`; the API maps kinds to
   status codes. Collaborators (networks, runtime, proxy, vault, policy) are passed in.
6. Warm pool (optional, `warm_pool_size`): a create that fits claims a pre-built sandbox
   (env and limits applied, policy pushed, entrypoint started through execd) or starts cold;
   unclaimed members are never persisted and are removed at restart and stop.
7. Every sandbox's execd requires an access token of its own (see execd_client.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from sandgate.lifecycle.cgroups import Limits
from sandgate.lifecycle.errors import LifecycleError, quietly
from sandgate.lifecycle.execd_client import new_token, start_entrypoint
from sandgate.lifecycle.quantities import runtime_limits
from sandgate.lifecycle.runtime.base import (
    Runtime,
    RuntimeError_,
    SandboxNet,
    SandboxSpec,
    wait_for_execd,
)
from sandgate.lifecycle.store import NotFound, RevisionConflict, SandboxRecord, Store, utcnow
from sandgate.lifecycle.warm_pool import Member, WarmPool
from sandgate.policy import (
    delete_targets,
    patch_rules,
    policy_from_dict,
    replace_policy,
    to_document,
    to_opensandbox,
)
from sandgate.vault import SecretStore

log = logging.getLogger(__name__)

READY_TIMEOUT = 15.0
POOL_IMAGE = "sandgate/host"
PAUSABLE = {"Running"}


# --- what the service needs from its collaborators --------------------------------------------


class Networks(Protocol):
    def create(self, sandbox_id: str) -> SandboxNet: ...
    def destroy(self, sandbox_id: str) -> None: ...
    def cleanup_leftovers(self, keep: set[str]) -> dict[str, SandboxNet]: ...


@runtime_checkable
class WarmRuntime(Protocol):
    """A runtime that can give a running sandbox its env and limits later (the local one)."""

    def configure(self, sandbox_id: str, env: dict[str, str], limits: Limits) -> None: ...


class ProxyClient(Protocol):
    def put_sandbox(self, entry: Any) -> object: ...
    def drop_sandbox(self, address: str) -> object: ...
    def metrics(self) -> str: ...


class PolicyBook(Protocol):
    """sandgate.policy seen from lifecycle: documents are plain JSON dicts (the policy file model)."""

    def from_opensandbox(self, network_policy: dict[str, Any] | None) -> dict[str, Any]: ...
    def validate(self, document: dict[str, Any]) -> dict[str, Any]: ...
    def to_opensandbox(self, document: dict[str, Any]) -> dict[str, Any]: ...
    def replace_opensandbox(
        self, document: dict[str, Any], wanted: dict[str, Any] | None
    ) -> dict[str, Any]: ...
    def patch_rules(self, document: dict[str, Any], rules: list[dict[str, str]]) -> dict[str, Any]: ...
    def delete_targets(self, document: dict[str, Any], targets: list[str]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CreateRequest:
    """A create request reduced to what the service acts on (the API layer builds it)."""

    image: str
    entrypoint: list[str]
    env: dict[str, str]
    metadata: dict[str, str]
    extensions: dict[str, str]
    platform: dict[str, str] | None
    resource_limits: dict[str, str]
    timeout: int | None
    network_policy: dict[str, Any] | None
    credential_proxy: bool


@dataclass(frozen=True)
class EgressState:
    revision: int
    document: dict[str, Any]


SandboxEntryFactory = Callable[[str, str, dict[str, Any], dict[str, str]], Any]
AuditWriter = Callable[[str, str, dict[str, Any]], None]


def digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


class Service:
    def __init__(
        self,
        store: Store,
        *,
        networks: Networks,
        runtime: Runtime,
        proxy: ProxyClient,
        vault: SecretStore,
        policies: PolicyBook,
        entry_factory: SandboxEntryFactory,
        audit: AuditWriter,
        check_image: Callable[[str], object] = lambda image: None,
        ca_cert: Any = None,
        ready_timeout: float = READY_TIMEOUT,
        warm_pool_size: int = 0,
    ) -> None:
        self.store = store
        self.networks = networks
        self.runtime = runtime
        self.proxy = proxy
        self.vault = vault
        self.policies = policies
        self.entry_factory = entry_factory
        self.audit = audit
        self.check_image = check_image
        self.ca_cert = ca_cert
        self.ready_timeout = ready_timeout
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.pool: WarmPool | None = None
        if warm_pool_size > 0:
            if isinstance(runtime, WarmRuntime):
                self.pool = WarmPool(warm_pool_size, self._build_pool_member, self._discard_pool_member)
            else:
                log.warning(
                    "warm_pool_size=%d ignored: this runtime cannot take env/limits later", warm_pool_size
                )

    def _lock(self, sandbox_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(sandbox_id, threading.Lock())

    # --- lifecycle -------------------------------------------------------------------------------

    def create(self, request: CreateRequest, actor: str = "api") -> SandboxRecord:
        try:
            document = self.policies.from_opensandbox(request.network_policy)
        except ValueError as exc:  # PolicyError
            raise LifecycleError("invalid", f"policy rejected: {exc}") from exc
        try:
            self.check_image(request.image)
        except Exception as exc:
            raise LifecycleError("invalid", str(exc)) from exc
        limits = runtime_limits(request.resource_limits)
        if self._fits_pool(request) and (claimed := self._claim(request, document, limits, actor)):
            return claimed
        record = self._new_record(request, str(uuid.uuid4()), execd_token=new_token())
        spec = SandboxSpec(
            sandbox_id=record.id,
            image=request.image,
            entrypoint=request.entrypoint,
            env=request.env,
            execd_token=record.execd_token,
            ca_cert=self.ca_cert,
            **asdict(limits),
        )
        undo: list[Callable[[], object]] = []
        try:
            net = self.networks.create(record.id)
            undo.append(lambda: self.networks.destroy(record.id))
            record = replace(record, address=net.address, gateway=net.gateway, netns=net.netns)
            self._push_new(self.entry_factory(record.id, net.address, document, {}))
            undo.append(lambda: self.proxy.drop_sandbox(net.address))
            self.runtime.create(spec, net)
            undo.append(lambda: self.runtime.delete(record.id))
            self._wait_ready(record.id, net)
            record = record.with_state("Running", "SANDBOX_READY", "execd answered /ping")
            self.store.create_sandbox(record, document)
        except Exception as exc:
            for step in reversed(undo):
                quietly(step)
            if isinstance(exc, LifecycleError):
                raise
            raise LifecycleError("unavailable", f"sandbox could not be started: {exc}") from exc
        self._audit_change(record.id, actor, 0, 1, {}, document, "create")
        return record

    @staticmethod
    def _new_record(request: CreateRequest, sandbox_id: str, execd_token: str) -> SandboxRecord:
        now = utcnow()
        return SandboxRecord(
            id=sandbox_id,
            image=request.image,
            entrypoint=request.entrypoint,
            created_at=now,
            state="Pending",
            transition_at=now,
            expires_at=now + timedelta(seconds=request.timeout) if request.timeout else None,
            metadata=request.metadata,
            extensions=request.extensions,
            platform=request.platform,
            resource_limits=request.resource_limits,
            egress_token=new_token(),
            execd_token=execd_token,
            credential_proxy=request.credential_proxy,
        )

    def list_sandboxes(self) -> list[SandboxRecord]:
        return self.store.list_sandboxes()

    def get(self, sandbox_id: str) -> SandboxRecord:
        try:
            return self.store.get_sandbox(sandbox_id)
        except NotFound:
            raise LifecycleError(
                "not_found", f"sandbox {sandbox_id!r} does not exist (list them with GET /v1/sandboxes)"
            ) from None

    def delete(self, sandbox_id: str) -> None:
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            self._teardown(record)
            self.store.delete_sandbox(sandbox_id)

    def patch_metadata(self, sandbox_id: str, patch: dict[str, str | None]) -> SandboxRecord:
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            metadata = dict(record.metadata)
            for key, value in patch.items():
                if value is None:
                    metadata.pop(key, None)
                else:
                    metadata[key] = value
            record = replace(record, metadata=metadata)
            self.store.put_sandbox(record)
            return record

    def pause(self, sandbox_id: str) -> None:
        self._transition(sandbox_id, {"Running"}, self.runtime.pause, "Paused", "pause")

    def resume(self, sandbox_id: str) -> None:
        self._transition(sandbox_id, {"Paused"}, self.runtime.resume, "Running", "resume")

    def renew(self, sandbox_id: str, expires_at: datetime) -> datetime:
        if expires_at.tzinfo is None:
            raise LifecycleError("invalid", "expiresAt needs a time zone (RFC 3339, e.g. ...Z)")
        if expires_at <= utcnow():
            raise LifecycleError("invalid", f"expiresAt {expires_at.isoformat()} is not in the future")
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            self.store.put_sandbox(replace(record, expires_at=expires_at))
        return expires_at

    def reap_expired(self) -> list[str]:
        """Delete every sandbox whose expiry has passed; returns their ids."""
        now = utcnow()
        reaped = []
        for record in self.store.list_sandboxes():
            if record.expires_at and record.expires_at <= now:
                try:
                    self.delete(record.id)
                    reaped.append(record.id)
                except Exception:
                    log.exception("could not reap expired sandbox %s", record.id)
        return reaped

    def start(self) -> None:
        """Re-adopt what survived a restart and re-feed the proxy; remove the rest (rule 4)."""
        alive = set(self.runtime.adopt())
        records = self.store.list_sandboxes()
        keep = {r.id for r in records if r.id in alive and r.state in ("Running", "Paused")}
        adopted = self.networks.cleanup_leftovers(keep)
        for record in records:
            if record.id in keep and record.id in adopted:
                continue
            log.warning("sandbox %s did not survive the restart (%s); removing it", record.id, record.state)
            self._teardown(record)
            self.store.delete_sandbox(record.id)
        for stray in alive - keep:  # e.g. unclaimed warm-pool members: never persisted, never kept
            quietly(lambda s=stray: self.runtime.delete(s))  # type: ignore[misc]
        self.repush()
        if self.pool is not None:
            self.pool.start()

    def stop(self) -> None:
        """Remove the warm pool's unclaimed sandboxes (claimed ones keep running, as always)."""
        if self.pool is not None:
            self.pool.stop()

    def repush(self) -> int:
        """Push every live sandbox's entry to the proxy (after the proxy (re)started)."""
        count = 0
        for record in self.store.list_sandboxes():
            if record.address and record.state in ("Running", "Paused", "Pausing", "Resuming"):
                self._push(record)
                count += 1
        return count

    def _transition(
        self, sandbox_id: str, allowed: set[str], act: Callable[[str], None], target: str, verb: str
    ) -> None:
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            if record.state not in allowed:
                raise LifecycleError(
                    "conflict",
                    f"cannot {verb} sandbox {sandbox_id}: it is {record.state}, not {'/'.join(allowed)}",
                )
            act(sandbox_id)
            self.store.put_sandbox(record.with_state(target, verb.upper() + "D", None))

    def _teardown(self, record: SandboxRecord) -> None:
        quietly(lambda: self.runtime.delete(record.id))
        if record.address:
            quietly(lambda: self.proxy.drop_sandbox(record.address or ""))
        quietly(lambda: self.networks.destroy(record.id))
        vault = self.store.get_vault(record.id)
        for name in _entry_names(vault.document if vault else {}):
            quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]

    def _push_new(self, entry: Any) -> None:
        try:
            self.proxy.put_sandbox(entry)
        except Exception as exc:
            raise LifecycleError(
                "unavailable",
                f"the egress proxy did not take the new sandbox's policy ({exc or type(exc).__name__}); "
                "it may be restarting: retry, or see proxy.log in the state dir",
            ) from exc

    def _wait_ready(self, sandbox_id: str, net: SandboxNet) -> None:
        """Until execd answers /ping; a sandbox that died, or a timeout, fails with its output."""
        try:
            wait_for_execd(self.runtime, sandbox_id, net, self.ready_timeout, poll=0.005)
        except RuntimeError_ as exc:
            raise LifecycleError("unavailable", str(exc)) from exc

    # --- warm pool -------------------------------------------------------------------------------

    def _fits_pool(self, request: CreateRequest) -> bool:
        """A pooled sandbox can take this request only if nothing of it was needed at launch:
        the pool's image, and no env that configures execd itself."""
        return (
            self.pool is not None
            and request.image == POOL_IMAGE
            and not any(key.startswith("EXECD_") for key in request.env)
        )

    def _claim(
        self, request: CreateRequest, document: dict[str, Any], limits: Limits, actor: str
    ) -> SandboxRecord | None:
        """Create from a pooled sandbox: limits and env, policy, entrypoint, persist. None (and
        the member removed) when the pool is empty or a step fails: the caller starts cold."""
        assert self.pool is not None and isinstance(self.runtime, WarmRuntime)
        member = self.pool.claim()
        if member is None:
            return None
        sandbox_id, net = member.sandbox_id, member.net
        record = replace(
            self._new_record(request, sandbox_id, member.execd_token),
            address=net.address,
            gateway=net.gateway,
            netns=net.netns,
        )
        try:
            self.runtime.configure(sandbox_id, request.env, limits)
            self._push_new(self.entry_factory(sandbox_id, net.address, document, {}))
            if request.entrypoint:
                start_entrypoint(record, request.entrypoint)
            record = record.with_state("Running", "SANDBOX_READY", "claimed from the warm pool")
            self.store.create_sandbox(record, document)
        except Exception:
            log.exception("warm pool: claiming sandbox %s failed; starting a cold one instead", sandbox_id)
            quietly(lambda: self.proxy.drop_sandbox(net.address))
            self._discard_pool_member(sandbox_id)
            return None
        self._audit_change(sandbox_id, actor, 0, 1, {}, document, "create")
        return record

    def _build_pool_member(self, sandbox_id: str) -> Member:
        net = self.networks.create(sandbox_id)
        token = new_token()
        spec = SandboxSpec(sandbox_id, POOL_IMAGE, [], execd_token=token, ca_cert=self.ca_cert)
        self.runtime.create(spec, net)
        self._wait_ready(sandbox_id, net)
        return Member(sandbox_id, net, token)

    def _discard_pool_member(self, sandbox_id: str) -> None:
        quietly(lambda: self.runtime.delete(sandbox_id))
        quietly(lambda: self.networks.destroy(sandbox_id))

    # --- egress policy ---------------------------------------------------------------------------

    def check_egress_token(self, sandbox_id: str, token: str | None) -> SandboxRecord:
        record = self.get(sandbox_id)
        if not token or not secrets.compare_digest(token.encode(), record.egress_token.encode()):
            raise LifecycleError("precondition", "missing or wrong OPENSANDBOX-EGRESS-AUTH token")
        return record

    def policy(self, sandbox_id: str) -> EgressState:
        self.get(sandbox_id)
        stored = self.store.get_policy(sandbox_id)
        if stored is None:
            raise LifecycleError("not_found", f"sandbox {sandbox_id!r} has no policy")
        return EgressState(stored.revision, stored.document)

    def change_policy(
        self,
        sandbox_id: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        actor: str,
        what: str,
        expected_revision: int | None = None,
    ) -> EgressState:
        """Apply `change` to the current document; validate, push, persist, audit (rule 2)."""
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            current = self.policy(sandbox_id)
            if expected_revision is not None and expected_revision != current.revision:
                raise LifecycleError(
                    "conflict", f"policy revision is {current.revision}, not {expected_revision}; re-read it"
                )
            try:
                changed = change(current.document)
            except ValueError as exc:  # PolicyError: the change itself is invalid
                raise LifecycleError("invalid", f"policy change rejected: {exc}") from exc
            new = self._validated(changed)
            self._push(record, new)
            try:
                revision = self.store.put_policy(sandbox_id, new, current.revision)
            except RevisionConflict as exc:
                self._push(record)
                raise LifecycleError("conflict", str(exc)) from exc
            self._audit_change(sandbox_id, actor, current.revision, revision, current.document, new, what)
            return EgressState(revision, new)

    def _validated(self, document: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.policies.validate(document)
        except ValueError as exc:
            raise LifecycleError("invalid", f"policy rejected: {exc}") from exc

    def _push(
        self, record: SandboxRecord, base: dict[str, Any] | None = None, vault: dict[str, Any] | None = None
    ) -> None:
        """Push the effective policy: the base document plus the credential vault's bindings,
        validated together (a vault binding's host must be allowed by the base rules)."""
        if base is None:
            base = self.policy(record.id).document
        if vault is None:
            stored = self.store.get_vault(record.id)
            vault = stored.document if stored else {}
        effective = self.effective(base, vault)
        entry = self.entry_factory(record.id, record.address or "", effective, _credential_entries(vault))
        self.proxy.put_sandbox(entry)

    def effective(self, base: dict[str, Any], vault: dict[str, Any]) -> dict[str, Any]:
        if not vault.get("bindings"):
            return base
        return self._validated({**base, "bindings": [*base.get("bindings", []), *_bindings(vault)]})

    def effective_policy(self, sandbox_id: str) -> dict[str, Any]:
        stored = self.store.get_vault(sandbox_id)
        return self.effective(self.policy(sandbox_id).document, stored.document if stored else {})

    def _audit_change(
        self,
        sandbox_id: str,
        actor: str,
        old_revision: int,
        new_revision: int,
        old: dict[str, Any],
        new: dict[str, Any],
        what: str,
    ) -> None:
        """One policy_change record. `old`/`new` are the whole documents (policy or credential-vault
        state: rule, binding and vault entry names, never a value), so the console can diff them."""
        summary = {"actor": actor, "change": what, "old_revision": old_revision, "revision": new_revision,
                   "old_digest": digest(old) if old else None, "new_digest": digest(new),
                   "old": old if old_revision else None, "new": new}  # fmt: skip
        try:
            self.audit(sandbox_id, what, summary)
        except Exception:
            log.exception("could not write the policy_change audit record for %s", sandbox_id)

    # --- credential vault -------------------------------------------------------------------------

    def vault_state(self, sandbox_id: str) -> EgressState:
        self.get(sandbox_id)
        stored = self.store.get_vault(sandbox_id)
        if stored is None:
            raise LifecycleError(
                "not_found", f"sandbox {sandbox_id} has no credential vault (POST one first)"
            )
        return EgressState(stored.revision, stored.document)

    def change_vault(
        self,
        sandbox_id: str,
        build: Callable[[dict[str, Any] | None, int], tuple[dict[str, Any], dict[str, str]]],
        actor: str,
        what: str,
        expected_revision: int | None,
        must_exist: bool,
    ) -> EgressState:
        """`build(old_state, new_revision)` returns the new vault state and the values to store
        (vault entry name -> value). Values are written first under fresh names; the policy with
        the new bindings is validated and pushed; then the state is persisted (rule 2 and 3)."""
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            stored = self.store.get_vault(sandbox_id)
            if must_exist and stored is None:
                raise LifecycleError(
                    "not_found", f"sandbox {sandbox_id} has no credential vault (POST one first)"
                )
            if not must_exist and stored is not None:
                raise LifecycleError(
                    "conflict", f"sandbox {sandbox_id} already has a credential vault (PATCH it)"
                )
            current = stored.revision if stored else 0
            if expected_revision is not None and expected_revision != current:
                raise LifecycleError("conflict", f"vault revision is {current}, not {expected_revision}")
            state, values = build(stored.document if stored else None, current + 1)
            self.effective(self.policy(sandbox_id).document, state)
            written: list[str] = []
            try:
                for name, value in values.items():
                    self.vault.put(name, value)
                    written.append(name)
                self._push(record, vault=state)
                revision = self.store.put_vault(sandbox_id, state, current)
            except Exception as exc:
                for name in written:
                    quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]
                quietly(lambda: self._push(record))
                if isinstance(exc, RevisionConflict):
                    raise LifecycleError("conflict", str(exc)) from exc
                raise
            old_names = set(_entry_names(stored.document if stored else {}))
            for name in old_names - set(_entry_names(state)):
                quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]
            self._audit_change(
                sandbox_id, actor, current, revision, stored.document if stored else {}, state, what
            )
            return EgressState(revision, state)

    def delete_vault(self, sandbox_id: str, actor: str) -> None:
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            stored = self.store.get_vault(sandbox_id)
            if stored is None:
                raise LifecycleError("not_found", f"sandbox {sandbox_id} has no credential vault")
            self._push(record, vault={})
            self.store.delete_vault(sandbox_id)
            for name in _entry_names(stored.document):
                quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]
            self._audit_change(
                sandbox_id, actor, stored.revision, 0, stored.document, {}, "credential-vault delete"
            )


class SandgatePolicies:
    """`PolicyBook` on sandgate.policy: documents in, validated documents (`to_document`) out."""

    def __init__(self, max_rules: int) -> None:
        self.max_rules = max_rules

    def from_opensandbox(self, network_policy: dict[str, Any] | None) -> dict[str, Any]:
        """No networkPolicy at create means deny everything (egress-first), unlike OpenSandbox."""
        return self.validate(network_policy or {})

    def validate(self, document: dict[str, Any]) -> dict[str, Any]:
        policy = policy_from_dict(document)
        if len(policy.egress) > self.max_rules:
            raise ValueError(
                f"{len(policy.egress)} rules exceed the limit of {self.max_rules} (policy_max_rules)"
            )
        return to_document(policy)

    def to_opensandbox(self, document: dict[str, Any]) -> dict[str, Any]:
        return to_opensandbox(policy_from_dict(document))

    def replace_opensandbox(self, document: dict[str, Any], wanted: dict[str, Any] | None) -> dict[str, Any]:
        return to_document(replace_policy(policy_from_dict(document), wanted, max_rules=self.max_rules))

    def patch_rules(self, document: dict[str, Any], rules: list[dict[str, str]]) -> dict[str, Any]:
        return to_document(patch_rules(policy_from_dict(document), rules, max_rules=self.max_rules))

    def delete_targets(self, document: dict[str, Any], targets: list[str]) -> dict[str, Any]:
        return to_document(delete_targets(policy_from_dict(document), targets))


def _bindings(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [item["binding"] for item in state.get("bindings", [])]


def _credential_entries(state: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["entry"] for item in state.get("credentials", [])}


def _entry_names(state: dict[str, Any]) -> Iterable[str]:
    return _credential_entries(state).values()

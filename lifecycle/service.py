"""The control plane's sandbox actions: create, delete, pause, resume, renew, re-adopt, and
claims from the warm pool. The egress part (policy, credential vault, the proxy's entries) is
`Service.egress` (egress_control.py).

Rules:
1. Order of a create: validate everything (request, policy, image, limits) -> prepare the
   confinement (`sandgate.lifecycle.confinement`: on this host, the network) -> admit the
   sandbox's entry to its proxy as soon as its address is known (before the runtime starts when
   the confinement placed it, so its first packet is already governed; else right after) ->
   start the runtime -> wait for execd `/ping` -> persist the record, Running, with its first
   policy revision in one transaction (`SandboxStore.create_sandbox`) -> audit. A failure at any
   step undoes the steps before it; nothing half-made is left behind or recorded.
2. Delete: runtime, proxy entry and vault values, confinement (each step quietly, so one failure
   does not strand the rest), then the record with its policy and vault state.
3. Restart: the sandbox store is the truth. `start()` asks the runtime which sandboxes survived,
   re-pushes their entries to the proxy, removes the rest with their confinement, all before the
   API accepts traffic.
4. This module speaks no HTTP: it raises `LifecycleError(kind, message)`; the API maps kinds to
   status codes. Collaborators (confinement, runtime, egress control) are passed in; wiring.py
   builds them.
5. Warm pool (optional, `warm_pool_size`): a create that fits claims a pre-built sandbox
   (env and limits applied, policy pushed, entrypoint started through execd) or starts cold;
   unclaimed members are never persisted and are removed at restart and stop.
6. Every sandbox's execd requires an access token of its own (see execd_client.py).
7. An expiry set by renew (the API's, or on access: renew_on_access.py) is one `lifecycle`
   audit record, its detail the old and new expiry and who set it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol, runtime_checkable

from sandgate.lifecycle.audit import Change
from sandgate.lifecycle.cgroups import Limits
from sandgate.lifecycle.confinement import Confinement
from sandgate.lifecycle.egress_control import EgressControl, existing
from sandgate.lifecycle.errors import LifecycleError, quietly
from sandgate.lifecycle.execd_client import new_token, start_entrypoint
from sandgate.lifecycle.isolation import ISOLATION_KEY, choose
from sandgate.lifecycle.opensandbox_shapes import NetworkPolicy
from sandgate.lifecycle.quantities import runtime_limits
from sandgate.lifecycle.registry import Credentials, PullError
from sandgate.lifecycle.renew_on_access import check_opt_in, extend_seconds
from sandgate.lifecycle.runtime.base import (
    BindMount,
    ClaimMount,
    Runtime,
    RuntimeError_,
    SandboxSpec,
    wait_for_execd,
)
from sandgate.lifecycle.sandbox_state import LIVE_STATES, IllegalMove, SandboxState
from sandgate.lifecycle.sandbox_store import SandboxRecord, SandboxStore, utcnow
from sandgate.lifecycle.warm_pool import Member, WarmPool
from sandgate.policy import Policy

log = logging.getLogger(__name__)

READY_TIMEOUT = 15.0
POOL_IMAGE = "sandgate/host"


@runtime_checkable
class WarmRuntime(Protocol):
    """A runtime that can give a running sandbox its env and limits later (the local one)."""

    def configure(self, sandbox_id: str, env: dict[str, str], limits: Limits) -> None: ...


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
    network_policy: NetworkPolicy | None
    credential_proxy: bool
    binds: tuple[BindMount, ...] = ()  # checked host volumes of this sandbox
    claims: tuple[ClaimMount, ...] = ()  # its `pvc` volumes (runtime/claims.py)
    image_auth: Credentials | None = None  # ImageSpec.auth: a registry login for this pull only


class Service:
    def __init__(
        self,
        store: SandboxStore,
        *,
        confinement: Confinement,
        runtime: Runtime,
        egress: EgressControl,
        check_image: Callable[[CreateRequest], object] = lambda request: None,
        ca_cert: Path | None = None,
        ready_timeout: float = READY_TIMEOUT,
        warm_pool_size: int = 0,
        isolation: str = "standard",
        renew_max_lifetime: int = 0,
        audit: Callable[[str, Change, str], None] | None = None,
    ) -> None:
        """`renew_max_lifetime`: the setting renew_on_access_max_lifetime (0: refused); `audit`
        writes a `lifecycle` record (sandbox id, what, JSON detail)."""
        self.store = store
        self.renew_max_lifetime = renew_max_lifetime
        self.audit = audit
        self.isolation = isolation
        self.confinement = confinement
        self.runtime = runtime
        self.egress = egress
        self.check_image = check_image
        self.ca_cert = ca_cert
        self.ready_timeout = ready_timeout
        self._lock = egress.locks
        self.pool: WarmPool | None = None
        if warm_pool_size > 0:
            if isinstance(runtime, WarmRuntime):
                self.pool = WarmPool(warm_pool_size, self._build_pool_member, self._discard_pool_member)
            else:
                log.warning(
                    "warm_pool_size=%d ignored: this runtime cannot take env/limits later", warm_pool_size
                )

    # --- lifecycle -------------------------------------------------------------------------------

    def create(
        self, request: CreateRequest, actor: str = "api", ceiling: Policy | None = None
    ) -> SandboxRecord:
        """`ceiling`: the caller's tenant's, checked with the deployment's (policy_book.py rule 4)."""
        try:
            document = self.egress.policies.from_opensandbox(request.network_policy)
        except ValueError as exc:  # PolicyError
            raise LifecycleError("invalid", f"policy rejected: {exc}") from exc
        self.egress.check_ceilings(document, ceiling)
        try:
            self.check_image(request)  # pulls the image when the store lacks it (pull policy)
        except PullError as exc:
            raise LifecycleError("unavailable" if exc.kind == "unreachable" else "invalid", str(exc)) from exc
        except Exception as exc:
            raise LifecycleError("invalid", str(exc)) from exc
        limits = runtime_limits(request.resource_limits)
        check_opt_in(request.extensions, self.renew_max_lifetime)
        isolation = choose(request.extensions, self.isolation, self.runtime.isolations)
        request = replace(request, extensions={**request.extensions, ISOLATION_KEY: isolation})
        if self._fits_pool(request, limits) and (claimed := self._claim(request, document, limits, actor)):
            return claimed
        record = self._new_record(request, str(uuid.uuid4()), execd_token=new_token())
        spec = SandboxSpec(
            sandbox_id=record.id,
            image=request.image,
            entrypoint=request.entrypoint,
            env=request.env,
            execd_token=record.execd_token,
            ca_cert=self.ca_cert,
            binds=request.binds,
            claims=request.claims,
            isolation=isolation,
            metadata=request.metadata,
            pull_auth=request.image_auth,
            **asdict(limits),
        )
        undo: list[Callable[[], object]] = []
        try:
            net = self.confinement.prepare(record.id)
            undo.append(lambda: self.confinement.release(record.id))
            if net is not None:  # placed on this host: admitted before its first packet
                record = replace(record, address=net.address, gateway=net.gateway, netns=net.netns)
                undo.append(self._admit(record, document))
            address = self.runtime.create(spec, net)
            undo.append(lambda: self.runtime.delete(record.id))
            if net is None:  # placed by the runtime's network: admitted once it has an address
                record = replace(record, address=address)
                undo.append(self._admit(record, document))
            self._wait_ready(record.id, address)
            record = record.moved("start", "execd answered /ping")
            self.store.create_sandbox(record, document)
        except Exception as exc:
            for step in reversed(undo):
                quietly(step)
            if isinstance(exc, LifecycleError):
                raise
            raise LifecycleError("unavailable", f"sandbox could not be started: {exc}") from exc
        self.egress.audit_change(record.id, actor, 0, 1, None, document, Change.CREATE, isolation=isolation)
        return record

    def _admit(self, record: SandboxRecord, document: Policy) -> Callable[[], None]:
        """Push the new sandbox's entry to the proxy that confines it; returns its undo."""
        self.egress.push_new(record, document)
        address = record.address or ""
        return lambda: self.egress.drop(address)

    @staticmethod
    def _new_record(request: CreateRequest, sandbox_id: str, execd_token: str) -> SandboxRecord:
        now = utcnow()
        return SandboxRecord(
            id=sandbox_id,
            image=request.image,
            entrypoint=request.entrypoint,
            created_at=now,
            state=SandboxState.PENDING,
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
        """Every sandbox as GET shows it (`observed`): a list never says Running for a sandbox
        whose processes have ended."""
        return [self._observe(record) for record in self.store.list_sandboxes()]

    def get(self, sandbox_id: str) -> SandboxRecord:
        return existing(self.store, sandbox_id)

    def observed(self, sandbox_id: str) -> SandboxRecord:
        """The record as GET shows it: Failed (never stored) when a Running sandbox's processes
        have ended, its message the end of the sandbox's log (the entrypoint's own output and
        how it ended), so an entrypoint that fails after the create answered is seen."""
        return self._observe(self.get(sandbox_id))

    def _observe(self, record: SandboxRecord) -> SandboxRecord:
        if record.state != SandboxState.RUNNING or self.runtime.alive(record.id):
            return record
        tail = self.runtime.log_tail(record.id)
        return replace(record, state=SandboxState.FAILED, reason="SANDBOX_EXITED", message=tail)

    def delete(self, sandbox_id: str, expired_at: datetime | None = None) -> None:
        """Delete the sandbox; `expired_at` (from the reaper) is remembered for later lookups."""
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            self._teardown(record)
            self.store.delete_sandbox(sandbox_id, expired_at)

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
        self._transition(sandbox_id, "pause", self.runtime.pause)

    def resume(self, sandbox_id: str) -> None:
        self._transition(sandbox_id, "resume", self.runtime.resume)

    def renew(self, sandbox_id: str, expires_at: datetime) -> datetime:
        if expires_at.tzinfo is None:
            raise LifecycleError("invalid", "expiresAt needs a time zone (RFC 3339, e.g. ...Z)")
        if expires_at <= utcnow():
            raise LifecycleError("invalid", f"expiresAt {expires_at.isoformat()} is not in the future")
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            self._set_expiry(record, expires_at, Change.RENEW, actor="api-key")
        return expires_at

    def renew_on_access(self, sandbox_id: str) -> datetime | None:
        """Extend an opted-in Running sandbox's expiry after traffic reached it through the
        server's proxy (renew_on_access.py, rule 2); the new expiry, or None when nothing changed."""
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            extend = extend_seconds(record.extensions)
            if extend is None or record.expires_at is None or record.state != SandboxState.RUNNING:
                return None
            latest = record.created_at + timedelta(seconds=self.renew_max_lifetime)
            expires_at = min(utcnow() + timedelta(seconds=extend), latest)
            if expires_at <= record.expires_at:
                return None
            self._set_expiry(
                record, expires_at, Change.RENEW_ON_ACCESS, actor="access", extend_seconds=extend,
                max_expires_at=latest.isoformat(),
            )  # fmt: skip
            return expires_at

    def _set_expiry(
        self, record: SandboxRecord, expires_at: datetime, what: Change, **detail: object
    ) -> None:
        """Store the new expiry, then its audit record (rule 7; a failed write is logged)."""
        self.store.put_sandbox(replace(record, expires_at=expires_at))
        if self.audit is None:
            return
        old = record.expires_at.isoformat() if record.expires_at else None
        facts = {**detail, "old_expires_at": old, "expires_at": expires_at.isoformat()}
        try:
            self.audit(record.id, what, json.dumps(facts, sort_keys=True))
        except Exception:
            log.exception("could not write the lifecycle audit record for %s", record.id)

    def reap_expired(self) -> list[str]:
        """Delete every sandbox whose expiry has passed; returns their ids."""
        now = utcnow()
        reaped = []
        for record in self.store.list_sandboxes():
            if record.expires_at and record.expires_at <= now:
                try:
                    self.delete(record.id, record.expires_at)
                    reaped.append(record.id)
                except Exception:
                    log.exception("could not reap expired sandbox %s", record.id)
        return reaped

    def start(self) -> None:
        """Re-adopt what survived a restart and re-feed the proxy; remove the rest (rule 3)."""
        alive = set(self.runtime.adopt())
        records = self.store.list_sandboxes()
        keep = {r.id for r in records if r.id in alive and r.state in LIVE_STATES}
        adopted = self.confinement.adopt(keep)
        for record in records:
            if record.id in keep and record.id in adopted:
                continue
            log.warning("sandbox %s did not survive the restart (%s); removing it", record.id, record.state)
            self._teardown(record)
            self.store.delete_sandbox(record.id)
        for stray in alive - keep:  # e.g. unclaimed warm-pool members: never persisted, never kept
            quietly(lambda s=stray: self.runtime.delete(s))  # type: ignore[misc]
        self.egress.repush()
        if self.pool is not None:
            self.pool.start()

    def stop(self) -> None:
        """Remove the warm pool's unclaimed sandboxes (claimed ones keep running, as always)."""
        if self.pool is not None:
            self.pool.stop()

    def _transition(self, sandbox_id: str, verb: str, act: Callable[[str], None]) -> None:
        with self._lock(sandbox_id):
            record = self.get(sandbox_id)
            try:
                moved = record.moved(verb)
            except IllegalMove as exc:
                raise LifecycleError("conflict", f"sandbox {sandbox_id}: {exc}") from exc
            act(sandbox_id)
            self.store.put_sandbox(moved)

    def _teardown(self, record: SandboxRecord) -> None:
        quietly(lambda: self.runtime.delete(record.id))
        self.egress.forget_sandbox(record)
        quietly(lambda: self.confinement.release(record.id))

    def _wait_ready(self, sandbox_id: str, address: str) -> None:
        """Until execd answers /ping; a sandbox that died, or a timeout, fails with its output."""
        try:
            wait_for_execd(self.runtime, sandbox_id, address, self.ready_timeout, poll=0.005)
        except RuntimeError_ as exc:
            raise LifecycleError("unavailable", str(exc)) from exc

    # --- warm pool -------------------------------------------------------------------------------

    def _fits_pool(self, request: CreateRequest, limits: Limits) -> bool:
        """A pooled sandbox can take this request only if nothing of it was needed at launch:
        the pool's image, no bind, no disk size (its filesystem was made with the default),
        and no env that configures execd itself."""
        return (
            self.pool is not None
            and request.image == POOL_IMAGE
            and request.extensions[ISOLATION_KEY] == "standard"  # members run standard
            and not request.binds
            and not request.claims
            and limits.disk_bytes is None
            and not any(key.startswith("EXECD_") for key in request.env)
        )

    def _claim(
        self, request: CreateRequest, document: Policy, limits: Limits, actor: str
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
            self.egress.push_new(record, document)
            if request.entrypoint:
                start_entrypoint(record, request.entrypoint)
            record = record.moved("start", "claimed from the warm pool")
            self.store.create_sandbox(record, document)
        except Exception:
            log.exception("warm pool: claiming sandbox %s failed; starting a cold one instead", sandbox_id)
            quietly(lambda: self.egress.drop(net.address))
            self._discard_pool_member(sandbox_id)
            return None
        self.egress.audit_change(sandbox_id, actor, 0, 1, None, document, Change.CREATE, isolation="standard")
        return record

    def _build_pool_member(self, sandbox_id: str) -> Member:
        net = self.confinement.prepare(sandbox_id)
        if net is None:
            raise LifecycleError("unsupported", f"the {self.confinement.name} confinement has no warm pool")
        token = new_token()
        spec = SandboxSpec(sandbox_id, POOL_IMAGE, [], execd_token=token, ca_cert=self.ca_cert)
        self._wait_ready(sandbox_id, self.runtime.create(spec, net))
        return Member(sandbox_id, net, token)

    def _discard_pool_member(self, sandbox_id: str) -> None:
        quietly(lambda: self.runtime.delete(sandbox_id))
        quietly(lambda: self.confinement.release(sandbox_id))

"""The egress part of the control plane: each sandbox's policy and credential vault, and what the
egress proxy holds for it. `Service.egress` is the one instance.

Rules:
1. Every egress change (policy or credential vault) is computed whole, validated whole, pushed
   to the proxy, then persisted with a new revision and written to the audit log as one
   `policy_change` record. If validation fails nothing changes; if the push or the persist fails,
   the stored state is pushed again, so the old state stays in force.
2. Credential values go to the vault under names private to the sandbox; the database and every
   response hold only names. A new revision writes new entries, so the switch is atomic, and
   deletes the old ones afterwards.
3. The proxy holds a sandbox's effective policy: its policy plus its vault's bindings, validated
   together (a binding's host must be allowed by the rules), with credential -> vault entry names.
   It travels as the typed `Policy` in the proxy's `SandboxEntry` (written once as JSON there).
4. One lock per sandbox (`locks`), shared with the lifecycle actions: an egress change and a
   delete of the same sandbox never interleave.
5. No HTTP here: failures are `LifecycleError(kind, message)`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from sandgate.lifecycle.audit import Change, PolicyChange
from sandgate.lifecycle.confinement import RUN_NETNS, ProxyControlClient
from sandgate.lifecycle.credential_state import VaultState
from sandgate.lifecycle.errors import LifecycleError, quietly
from sandgate.lifecycle.isolation import ISOLATION_KEY
from sandgate.lifecycle.policy_book import PolicyBook, PolicyJSON
from sandgate.lifecycle.sandbox_state import LIVE_STATES
from sandgate.lifecycle.sandbox_store import (
    NotFound,
    RevisionConflict,
    Revisioned,
    SandboxRecord,
    SandboxStore,
)
from sandgate.policy import Policy, to_document
from sandgate.proxy import SandboxEntry
from sandgate.vault import SecretStore, VaultError

log = logging.getLogger(__name__)


EgressState = Revisioned[Policy]  # a sandbox's policy and the revision it was stored as
VaultRevision = Revisioned[VaultState]  # its credential-vault state and that revision


AuditWriter = Callable[[str, Change, PolicyChange], None]  # (sandbox id, what, change)
PolicyEdit = Callable[[Policy], Policy]
# (stored state or None, the new revision) -> (the new state, vault entry name -> value to write)
VaultBuild = Callable[[VaultState | None, int], tuple[VaultState, dict[str, str]]]


class SandboxLocks:
    """One lock per sandbox id (rule 4)."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def __call__(self, sandbox_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(sandbox_id, threading.Lock())


def existing(store: SandboxStore, sandbox_id: str) -> SandboxRecord:
    """The sandbox's record, or a not_found error that says how to list them."""
    try:
        return store.get_sandbox(sandbox_id)
    except NotFound:
        if (expired := store.expired_at(sandbox_id)) is not None:
            raise LifecycleError(
                "not_found",
                f"sandbox {sandbox_id!r} expired at {expired.isoformat()} and was deleted (its timeout "
                "passed; create sandboxes with a longer timeout, or renew their expiration in time)",
            ) from None
        raise LifecycleError(
            "not_found", f"sandbox {sandbox_id!r} does not exist (list them with GET /v1/sandboxes)"
        ) from None


def digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def audited(document: Policy | VaultState | None) -> dict[str, Any]:
    """The JSON a policy_change record carries: the stored form; {} for none."""
    if document is None:
        return {}
    return to_document(document) if isinstance(document, Policy) else document.to_document()


# A sandbox's cgroup.procs files (the runtime's), where the proxy finds its processes.
ProcessLists = Callable[[str], list[Path]]


def process_lookup(record: SandboxRecord, lists: ProcessLists | None) -> dict[str, Any]:
    """What the proxy needs to name each connection's process (proxy/origin.py): the sandbox's
    netns, and its process lists when the runtime has them; nothing on gVisor, whose sockets are
    all held by its kernel (the Sentry), not its programs."""
    if record.netns is None or record.extensions.get(ISOLATION_KEY) == "gvisor":
        return {}
    found = [str(path) for path in lists(record.id)] if lists else []
    return {"netns": str(RUN_NETNS / record.netns), "process_lists": found}


class EgressControl:
    def __init__(
        self,
        store: SandboxStore,
        *,
        proxy: ProxyControlClient,
        vault: SecretStore,
        policies: PolicyBook,
        audit: AuditWriter,
        process_lists: ProcessLists | None = None,
        name_processes: bool = False,
    ) -> None:
        """`name_processes`: the proxy names each connection's process (exec_audit = processes:
        a lookup per connection costs the proxy milliseconds of CPU, docs/benchmarks.md)."""
        self.store = store
        self.process_lists = process_lists
        self.name_processes = name_processes
        self.proxy = proxy
        self.vault = vault
        self.policies = policies
        self.audit = audit
        self.locks = SandboxLocks()

    # --- the proxy ------------------------------------------------------------------------------

    def push_new(self, record: SandboxRecord, policy: Policy) -> None:
        """A new sandbox's first entry (no vault yet); a refusal is `unavailable`."""
        entry = SandboxEntry(
            sandbox_id=record.id,
            address=record.address or "",
            policy=policy,
            tenant=record.tenant,
            **self._process_lookup(record),
        )
        try:
            self.proxy.put_sandbox(entry)
        except Exception as exc:
            raise LifecycleError(
                "unavailable",
                f"the egress proxy did not take the new sandbox's policy ({exc or type(exc).__name__}); "
                "it may be restarting: retry, or see proxy.log in the state dir",
            ) from exc

    def push(
        self, record: SandboxRecord, base: Policy | None = None, vault: VaultState | None = None
    ) -> None:
        """Push the effective policy (rule 3); `base`/`vault` default to the stored ones."""
        self.proxy.put_sandbox(self._entry(record, base, vault))

    def _entry(
        self, record: SandboxRecord, base: Policy | None = None, vault: VaultState | None = None
    ) -> SandboxEntry:
        if base is None:
            base = self.policy(record.id).document
        if vault is None:
            vault = self._stored_vault(record.id).document
        return SandboxEntry(
            sandbox_id=record.id,
            address=record.address or "",
            policy=self.effective(base, vault),
            credentials=vault.entries(),
            tenant=record.tenant,
            **self._process_lookup(record),
        )

    def _process_lookup(self, record: SandboxRecord) -> dict[str, Any]:
        return process_lookup(record, self.process_lists) if self.name_processes else {}

    def drop(self, address: str) -> None:
        self.proxy.drop_sandbox(address)

    def repush(self, reading: Collection[str] | None = None) -> int:
        """Push every live sandbox's entry to the proxy (after the proxy (re)started), or with
        `reading` only those whose entry reads one of these vault entries (stored, rotated or
        removed by `sandgate vault`: the proxy that holds pushed values, a node's, gets the new
        ones; lifecycle/vault_notices.py); how many were pushed. Under the sandbox's lock
        (rule 4): an egress change under way persists first and this push reads it, instead of
        putting back the policy that change replaced. One sandbox's failed push (its node down)
        does not stop the others'; the error names every one that failed."""
        count, failed = 0, []
        for record in self.store.list_sandboxes():
            if record.address and record.state in LIVE_STATES:
                with self.locks(record.id):
                    entry = self._entry(record)
                    if reading is not None and not entry.vault_names() & set(reading):
                        continue
                    try:
                        self.proxy.put_sandbox(entry)
                    except Exception as exc:
                        failed.append(f"{record.id} ({exc or type(exc).__name__})")
                        continue
                count += 1
        if failed:
            raise LifecycleError("unavailable", f"pushed {count}, not pushed: {'; '.join(failed)}")
        return count

    def forget_sandbox(self, record: SandboxRecord) -> None:
        """A deleted sandbox: its proxy entry and its vault values go (each step quietly)."""
        if record.address:
            quietly(lambda: self.drop(record.address or ""))
        for name in self._stored_vault(record.id).document.entries().values():
            quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]

    # --- the policy -----------------------------------------------------------------------------

    def vault_values(self, sandbox_id: str, known_revision: int) -> tuple[int, frozenset[str] | None]:
        """The sandbox's vault revision, and its credentials' values unless that revision is
        `known_revision` (None then: nothing is read from the vault): what the exec audit trail
        redacts (lifecycle/trail_secrets.py). A value the vault cannot give is left out."""
        stored = self._stored_vault(sandbox_id)
        if stored.revision == known_revision:
            return stored.revision, None
        values = set()
        for name in stored.document.entries().values():
            with suppress(VaultError):
                values.add(self.vault.reveal(name))
        return stored.revision, frozenset(values)

    def check_egress_token(self, sandbox_id: str, token: str | None) -> SandboxRecord:
        record = existing(self.store, sandbox_id)
        if not token or not secrets.compare_digest(token.encode(), record.egress_token.encode()):
            raise LifecycleError("precondition", "missing or wrong OPENSANDBOX-EGRESS-AUTH token")
        return record

    def policy(self, sandbox_id: str) -> EgressState:
        existing(self.store, sandbox_id)
        stored = self.store.get_policy(sandbox_id)
        if stored is None:
            raise LifecycleError("not_found", f"sandbox {sandbox_id!r} has no policy")
        return stored

    def change_policy(
        self,
        sandbox_id: str,
        edit: PolicyEdit,
        actor: str,
        what: Change,
        expected_revision: int | None = None,
        *,
        ceiling: Policy | None = None,
    ) -> EgressState:
        """Apply `edit` to the current document; validate, check against the ceilings (a tenant's
        `ceiling`, by default the one its admin stored for the sandbox's tenant, and the
        deployment's), push, persist, audit (rule 1)."""
        with self.locks(sandbox_id):
            record = existing(self.store, sandbox_id)
            current = self.policy(sandbox_id)
            if expected_revision is not None and expected_revision != current.revision:
                raise LifecycleError(
                    "conflict", f"policy revision is {current.revision}, not {expected_revision}; re-read it"
                )
            try:
                new = edit(current.document)
            except ValueError as exc:  # PolicyError: the change itself is invalid
                raise LifecycleError("invalid", f"policy change rejected: {exc}") from exc
            self.check_ceilings(new, ceiling, tenant=record.tenant)
            with self._restoring(record):
                self.push(record, new)
                revision = self.store.put_policy(sandbox_id, new, current.revision)
            self.audit_change(sandbox_id, actor, current.revision, revision, current.document, new, what)
            return EgressState(revision, new)

    def check_ceilings(
        self, policy: Policy, ceiling: Policy | None = None, tenant: str | None = None
    ) -> None:
        """`forbidden`, naming the ceiling and its rule, unless every ceiling allows `policy`:
        the deployment's, and `ceiling` or else the one stored for `tenant` (its admin's)."""
        if ceiling is None and tenant is not None:
            ceiling = self.store.tenant_ceiling(tenant)
        decision = self.policies.within_ceilings(policy)
        whose = "the deployment's ceiling (policy_ceiling)"
        if decision.allowed and ceiling is not None:
            decision = self.policies.within_ceilings(policy, ceiling)
            whose = f"the ceiling of tenant {tenant}" if tenant else "the tenant's ceiling"
        if not decision.allowed:
            raise LifecycleError("forbidden", f"policy refused, nothing changed: {whose}: {decision.reason}")

    def parse_policy(self, document: PolicyJSON, source: str = "<api>") -> Policy:
        """A whole sandgate policy document from a client (`source` names it in errors and in
        its rules' ids); a bad one is `invalid`."""
        return self._rejecting(lambda: self.policies.parse(document, source))

    def effective(self, base: Policy, vault: VaultState) -> Policy:
        if not vault.bindings:
            return base
        return self._rejecting(lambda: self.policies.with_bindings(base, vault.policy_bindings()))

    def effective_policy(self, sandbox_id: str) -> Policy:
        return self.effective(self.policy(sandbox_id).document, self._stored_vault(sandbox_id).document)

    @staticmethod
    def _rejecting(build: Callable[[], Policy]) -> Policy:
        try:
            return build()
        except ValueError as exc:
            raise LifecycleError("invalid", f"policy rejected: {exc}") from exc

    def audit_change(
        self,
        sandbox_id: str,
        actor: str,
        old_revision: int,
        new_revision: int,
        old: Policy | VaultState | None,
        new: Policy | VaultState | None,
        what: Change,
        isolation: str | None = None,
    ) -> None:
        """One policy_change record (a create's names the sandbox's isolation); a failure to
        write it is logged, never undoes the change."""
        old_json, new_json = audited(old), audited(new)
        change = PolicyChange(
            actor=actor,
            change=what,
            old_revision=old_revision,
            revision=new_revision,
            old_digest=digest(old_json) if old_json else None,
            new_digest=digest(new_json),
            old=old_json if old_revision else None,
            new=new_json,
            isolation=isolation,
        )
        try:
            self.audit(sandbox_id, what, change)
        except Exception:
            log.exception("could not write the policy_change audit record for %s", sandbox_id)

    # --- the credential vault -------------------------------------------------------------------

    def vault_state(self, sandbox_id: str) -> VaultRevision:
        existing(self.store, sandbox_id)
        stored = self._stored_vault(sandbox_id)
        if not stored.revision:
            raise LifecycleError(
                "not_found", f"sandbox {sandbox_id} has no credential vault (POST one first)"
            )
        return stored

    def change_vault(
        self,
        sandbox_id: str,
        build: VaultBuild,
        actor: str,
        what: Change,
        expected_revision: int | None,
        must_exist: bool,
    ) -> VaultRevision:
        """Values are written first under fresh names; the policy with the new bindings is
        validated and pushed; then the state is persisted (rules 1 and 2)."""
        with self.locks(sandbox_id):
            record = existing(self.store, sandbox_id)
            stored = self._stored_vault(sandbox_id)
            current = stored.revision
            if must_exist and not current:
                raise LifecycleError(
                    "not_found", f"sandbox {sandbox_id} has no credential vault (POST one first)"
                )
            if not must_exist and current:
                raise LifecycleError(
                    "conflict", f"sandbox {sandbox_id} already has a credential vault (PATCH it)"
                )
            if expected_revision is not None and expected_revision != current:
                raise LifecycleError("conflict", f"vault revision is {current}, not {expected_revision}")
            state, values = build(stored.document if current else None, current + 1)
            # its bindings within the ceilings too (a binding a ceiling refuses is refused here)
            self.check_ceilings(self.effective(self.policy(sandbox_id).document, state), tenant=record.tenant)
            with self._restoring(record):
                revision = self._write_vault(record, state, values, current)
            for name in set(stored.document.entries().values()) - set(state.entries().values()):
                quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]
            old = stored.document if current else None
            self.audit_change(sandbox_id, actor, current, revision, old, state, what)
            return VaultRevision(revision, state)

    def _write_vault(
        self, record: SandboxRecord, state: VaultState, values: dict[str, str], current: int
    ) -> int:
        """Write the values, push, persist; on any failure the new values go again."""
        written: list[str] = []
        try:
            for name, value in values.items():
                self.vault.put(name, value)
                written.append(name)
            self.push(record, vault=state)
            return self.store.put_vault(record.id, state, current)
        except Exception:
            for name in written:
                quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]
            raise

    @contextmanager
    def _restoring(self, record: SandboxRecord) -> Iterator[None]:
        """A push and persist: on any failure the stored state is pushed again (rule 1), and a
        revision conflict (someone else persisted first) is `conflict`."""
        try:
            yield
        except Exception as exc:
            quietly(lambda: self.push(record))
            if isinstance(exc, RevisionConflict):
                raise LifecycleError("conflict", str(exc)) from exc
            raise

    def delete_vault(self, sandbox_id: str, actor: str) -> None:
        with self.locks(sandbox_id):
            record = existing(self.store, sandbox_id)
            stored = self._stored_vault(sandbox_id)
            if not stored.revision:
                raise LifecycleError("not_found", f"sandbox {sandbox_id} has no credential vault")
            self.push(record, vault=VaultState())
            self.store.delete_vault(sandbox_id)
            for name in stored.document.entries().values():
                quietly(lambda n=name: self.vault.delete(n))  # type: ignore[misc]
            self.audit_change(
                sandbox_id, actor, stored.revision, 0, stored.document, None, Change.VAULT_DELETE
            )

    def _stored_vault(self, sandbox_id: str) -> VaultRevision:
        """The stored state; revision 0 and an empty state when the sandbox has none."""
        return self.store.get_vault(sandbox_id) or VaultRevision(0, VaultState())

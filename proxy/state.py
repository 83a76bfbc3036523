"""Shared runtime state of one proxy process, and the per-connection and per-request records.

Rules: `ProxyState` is built once by `run_proxy` and handed to every addon (no globals). The
sandbox table is a read-only mapping replaced whole on every change, so a hook sees either the
old or the new entry, never half of one; hooks look the sandbox up again on every request,
which is what makes policy changes apply to new requests. Open connections are in
`ProxyState.connections` with what was allowed over them and how to close them; the table calls
its `on_change` listeners after every swap, so `proxy/revocation.py` closes those the new entry
no longer allows.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sandgate.policy import (
    AwsSigV4Auth,
    Binding,
    Budget,
    CompiledPolicy,
    PassthroughAuth,
    RequestIdentity,
    compile_policy,
)
from sandgate.proxy.approvals import Approvals
from sandgate.proxy.audit import AuditLog
from sandgate.proxy.budgets import Budgets, Subject
from sandgate.proxy.contract.audit import AuditRecord, new_record_id
from sandgate.proxy.contract.config import ProxyConfig, SandboxEntry, UpstreamProxy
from sandgate.proxy.credentials import SandboxCredentials, SecretValues
from sandgate.proxy.decide import Verdict
from sandgate.proxy.metrics import Metrics
from sandgate.proxy.minting import TokenMinter
from sandgate.proxy.origin import ProcessFinder
from sandgate.proxy.resolver import NameMemory, Resolver
from sandgate.proxy.tcpinfo import KernelCounters
from sandgate.proxy.upstreamproxy import UpstreamProxies
from sandgate.vault import open_configured

FLOW_KEY = "sandgate"  # flow.metadata key of a RequestState
SCRUB_KEY = "sandgate.scrub"  # flow.metadata: the SandboxCredentials whose values the answer loses
BODY_KEY = "sandgate.body-placeholders"  # flow.metadata: injection substitutes in the body at `request`


@dataclass(frozen=True)
class Sandbox:
    entry: SandboxEntry
    policy: CompiledPolicy
    bindings: dict[str, Binding]  # by name
    placeholders: dict[str, str]  # every placeholder (passthrough, AWS key id) -> the binding it belongs to
    dns_ports: tuple[int, ...]  # ports a name could be allowed on (for DNS answers)
    credentials: SandboxCredentials
    rule_budgets: dict[str, Budget]  # rule id (a Decision's `rule`) -> its per-host budget

    @classmethod
    def compile(cls, entry: SandboxEntry, values: SecretValues) -> Sandbox:
        """Compile the entry's policy (validated when the entry was loaded)."""
        policy = compile_policy(entry.policy)
        bindings = {binding.name: binding for binding in policy.policy.bindings}
        placeholders = {
            substitution.placeholder: binding.name
            for binding in bindings.values()
            if isinstance(binding.auth, PassthroughAuth)
            for substitution in binding.auth.substitutions
        }
        placeholders |= {
            binding.auth.placeholderAccessKeyId: binding.name
            for binding in bindings.values()
            if isinstance(binding.auth, AwsSigV4Auth)
        }
        ports = {80, 443} | {port for rule in policy.policy.egress for port in rule.ports or ()}
        credentials = SandboxCredentials(values, bindings, entry.credentials)
        budgets = {
            rule.origin or f"egress[{index}]": rule.budgets
            for index, rule in enumerate(policy.policy.egress)
            if rule.budgets is not None
        }
        return cls(entry, policy, bindings, placeholders, tuple(sorted(ports)), credentials, budgets)

    @property
    def id(self) -> str:
        return self.entry.sandbox_id

    @property
    def address(self) -> str:
        return self.entry.address

    def budget_subject(self, rule: str | None, host: str | None) -> Subject | None:
        """What a request or connection allowed by `rule` for `host` counts against (None: no
        budget applies)."""
        rule_budget = self.rule_budgets.get(rule or "")
        sandbox_budget = self.policy.policy.budgets
        if (sandbox_budget or rule_budget) is None or not host:
            return None
        return Subject(self.address, sandbox_budget, rule, rule_budget, host)

    @property
    def reporting(self) -> bool:
        """A policy on trial (`mode: report`): counted by its budgets, never refused or slowed."""
        return self.policy.policy.mode == "report"

    def vault_name(self, credential: str) -> str:
        """The vault entry a binding's credential name refers to in this sandbox."""
        return self.entry.credentials.get(credential, credential)


def proxy_store(config: ProxyConfig) -> Any:
    """The vault as the proxy opens it (None: no vault). The proxy keeps values in memory itself
    (proxy/credentials.py), refreshed when the control plane signals a change: a store-side
    cache would only serve a stale value after a rotation."""
    vault = config.vault
    return open_configured(vault.model_copy(update={"cache_ttl": 0}), config.vault_secrets) if vault else None


class SandboxTable:
    """address -> Sandbox, swapped atomically; compiling happens before the swap, so a bad
    policy raises (sandgate.policy.PolicyError) and leaves the old entry in force. `put` also
    reads the entry's credential values from the vault (blocking: the control API calls it from
    a handler thread), so they are scrubbed from the moment the entry is in force."""

    def __init__(self, store: Any = None) -> None:
        self.values = SecretValues(store)
        self._by_address: MappingProxyType[str, Sandbox] = MappingProxyType({})
        self.on_change: list[Callable[[str], None]] = []  # called with the address after each swap

    def get(self, address: str) -> Sandbox | None:
        return self._by_address.get(address)

    def put(self, entry: SandboxEntry) -> Sandbox:
        sandbox = Sandbox.compile(entry, self.values)
        self.values.load(sandbox.credentials.vault_names)
        own_proxies = entry.upstream_proxies or ()
        self.values.load(sorted({proxy.credential for proxy in own_proxies if proxy.credential}))
        self._by_address = MappingProxyType({**self._by_address, entry.address: sandbox})
        self._changed(entry.address)
        return sandbox

    def drop(self, address: str) -> bool:
        if address not in self._by_address:
            return False
        self._by_address = MappingProxyType({k: v for k, v in self._by_address.items() if k != address})
        self._changed(address)
        return True

    def _changed(self, address: str) -> None:
        for listener in self.on_change:
            listener(address)

    def entries(self) -> list[SandboxEntry]:
        return [sandbox.entry for sandbox in self._by_address.values()]

    def __len__(self) -> int:
        return len(self._by_address)


Target = tuple[str, int, str]  # (name, port, scheme) a connection was allowed to reach
Closer = Callable[[], Awaitable[object] | None]  # closes a connection; what to await until it is


@dataclass
class ConnState:
    """What the proxy decided about one client connection."""

    sandbox_address: str
    sandbox_id: str = "-"
    client: tuple[str, int] | None = None  # the sandbox's end, for records written later
    targets: set[Target] = field(default_factory=set)  # every destination allowed over it so far
    close: Closer | None = None  # how revocation closes it (None: nothing open to close yet)
    revoked: bool = False
    connect_host: str | None = None  # explicit proxy: the CONNECT target
    connect_record: AuditRecord | None = None  # the CONNECT decision, already in the audit log
    name: str | None = None  # the connection-level name (SNI, CONNECT target, DNS-attributed)
    denied: bool = False
    passthrough: bool = False
    decision_record: AuditRecord | None = None  # pass-through: its decision, closed at disconnect
    counters: KernelCounters | None = None  # pass-through: the kernel's byte counts
    pins: dict[str, str] = field(default_factory=dict)  # name -> the address the proxy dials
    via: UpstreamProxy | None = None  # the upstream its next dial goes through (upstreamproxy.py)
    tunnelled: bool = False  # explicit CONNECT: its tunnel already dials through `via`
    restore: dict[str, tuple[str, int]] = field(default_factory=dict)  # server id -> address by name


@dataclass
class RequestState:
    """One request's decision and counters; the audit addon turns it into the request record
    (`record_id`: its write-ahead line, if it was forwarded, and its whole line share the id).
    `identity` is what the request was judged as, taken before injection changed anything (None
    when it was refused before: names that disagree, an ambiguous target)."""

    sandbox: Sandbox
    verdict: Verdict
    name: str
    identity: RequestIdentity | None = None
    started: float = field(default_factory=time.monotonic)
    bindings: list[str] = field(default_factory=list)  # names of bindings injected
    bytes_out: int = 0
    bytes_in: int = 0
    detail: str | None = None
    via: str | None = None  # the upstream proxy it went through
    record_id: str = field(default_factory=new_record_id)
    written_ahead: bool = False


@dataclass
class ProxyState:
    table: SandboxTable
    resolver: Resolver
    names: NameMemory
    audit: AuditLog
    metrics: Metrics
    connections: dict[str, ConnState] = field(default_factory=dict)
    approvals: Approvals = field(default_factory=Approvals)
    upstream_proxies: UpstreamProxies = field(default_factory=lambda: UpstreamProxies([], SecretValues(None)))
    budgets: Budgets = field(default_factory=Budgets)
    minter: TokenMinter | None = None  # mints `oauth2` bindings' tokens (None: minting refused)
    processes: ProcessFinder = field(default_factory=ProcessFinder)  # who opened each connection

    def spend_budgets(
        self,
        sandbox: Sandbox,
        rule: str | None,
        host: str | None,
        bytes_in: int,
        bytes_out: int,
        request: bool = True,
    ) -> None:
        """Count what an allowed request or pass-through connection moved against its budgets
        (`request` False: a spliced connection, whose byte buckets its throttle already spent)."""
        if subject := sandbox.budget_subject(rule, host):
            self.budgets.spend(subject, bytes_in, bytes_out, request)
            self.metrics.budget_bytes[(sandbox.id, "in")] += bytes_in
            self.metrics.budget_bytes[(sandbox.id, "out")] += bytes_out

    def forget_budgets(self, address: str) -> None:
        """A table change listener: a dropped sandbox's budget buckets go with it."""
        if self.table.get(address) is None:
            self.budgets.forget(address)

    def configured_upstream_proxies(self) -> list[UpstreamProxy]:
        """The server's upstream proxies and every sandbox entry's own."""
        own = [proxy for entry in self.table.entries() for proxy in entry.upstream_proxies or ()]
        return [*self.upstream_proxies.proxies, *own]

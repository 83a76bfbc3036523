"""Compiled policies and decisions: the one decision function for every path into the proxy.

What a decision depends on: the request's host, port and scheme (connection level) and, when
known, its method and path (request level); the resolved upstream address for `check_address`.
What it must never know: sockets, mitmproxy, the clock, files. It is pure and deterministic.

Theory of operation:
- Rules are numbered in document order; the first rule whose every condition matches decides
  (OpenSandbox's first-match-wins). Every host name a rule or binding names, and every wildcard
  suffix, gets a slot (`_HostSlot`): the rules and bindings that can apply to it, in document
  order, including those of the wildcards above it (merged on the slot's first lookup, then
  kept). A decision finds its slot with one dict lookup or one walk down a reversed-label trie,
  and addresses find their rules in a prefix table. So a decision costs O(labels + prefix
  lengths + rules for that host), never O(all rules).
- A slot's rule list ends at the first rule without conditions: every later rule is unreachable
  for that host, which keeps slots short even when wildcards overlap.
- At connection level (method/path unknown: SNI, CONNECT, original destination) a rule with
  methods or paths cannot be decided yet. If such a rule comes before the first rule that decides
  the connection and some request could still be allowed, the connection is allowed with
  reason `Reason.L7_PENDING` and `inspect=True`; each request is then decided on its own.
- `inspect` says whether the proxy needs an L7 view of this host: a method/path rule could apply,
  a credential binding could apply, or the deciding rule says `inspect: always`.
- Report mode turns a would-deny into allow with `report_only=True`, except for the reasons in
  `ALWAYS_ENFORCED` (malformed hosts and always-denied addresses are never let through). The
  decision's `outcome` is then "report": the one word the audit log, the CLI and OCSF use
  (`Outcome` is the only place the words are listed).
- A compiled policy never changes, so answers can be reused: decisions without a per-request
  detail are interned (one `Decision` object per distinct outcome), and connection-level
  decisions and address checks are kept in bounded LRU caches (`cache_size` entries each;
  request-level decisions are not cached, their paths vary too much).
"""

from __future__ import annotations

import functools
import gc
import ipaddress
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

from sandgate.policy.addresses import DeniedRange, PrefixTable, address_to_check, denied_range
from sandgate.policy.canonical import (
    AmbiguousTarget,
    RequestIdentity,
    canonical_pattern,
    request_identity,
)
from sandgate.policy.models import Binding, EgressRule, Policy
from sandgate.policy.names import IPAddress, path_matches, request_host
from sandgate.policy.reasons import Reason

DEFAULT_MAX_RULES = 4096
DEFAULT_CACHE_SIZE = 4096
ALWAYS_ENFORCED = frozenset(
    {Reason.INVALID_HOST, Reason.INVALID_ADDRESS, Reason.ALWAYS_DENIED_RANGE, Reason.AMBIGUOUS_TARGET}
)
# What a decision is called in audit records: "report" is an allow that enforcing would deny.
Outcome = Literal["allow", "deny", "report"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


@dataclass(frozen=True, slots=True)
class Request:
    """What is known about a connection or request; method/path None = connection level. The path
    is as received: `decide` puts it in canonical form (`sandgate.policy.canonical`)."""

    host: str
    port: int
    scheme: str
    method: str | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome and its reason; audit records and `policy explain` serialise this value.

    Decisions are immutable values and may be shared between calls: compare them with `==`.
    """

    action: Literal["allow", "deny"]
    reason: Reason
    rule: str | None = None
    inspect: bool = False
    bindings: tuple[str, ...] = ()
    report_only: bool = False
    detail: str | None = None

    @property
    def allowed(self) -> bool:
        return self.action == "allow"

    @property
    def outcome(self) -> Outcome:
        """allow, deny, or report (allowed only because the policy is in report mode)."""
        return "report" if self.report_only else self.action

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.outcome,
            "reason": self.reason,
            "rule": self.rule,
            "inspect": self.inspect,
            "bindings": list(self.bindings),
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class _Conditions:
    """Port/scheme/method/path conditions shared by rules and bindings; None = any."""

    ports: frozenset[int] | None
    schemes: frozenset[str] | None
    methods: frozenset[str] | None
    paths: tuple[str, ...] | None

    def connection_miss(self, port: int, scheme: str) -> Reason | None:
        if self.ports is not None and port not in self.ports:
            return Reason.PORT_NOT_ALLOWED
        if self.schemes is not None and scheme not in self.schemes:
            return Reason.SCHEME_NOT_ALLOWED
        return None

    @property
    def checks_path(self) -> bool:
        """Whether some path fails these conditions (`/*` lets every path through)."""
        return self.paths is not None and "/*" not in self.paths

    def request_miss(self, method: str, path: str) -> Reason | None:
        if self.methods is not None and method not in self.methods:
            return Reason.METHOD_NOT_ALLOWED
        if self.paths is not None and not any(path_matches(pattern, path) for pattern in self.paths):
            return Reason.PATH_NOT_ALLOWED
        return None


_ANY = _Conditions(None, None, None, None)  # shared by every rule without conditions


def _conditions(
    ports: Iterable[int] | None,
    schemes: Iterable[str] | None,
    methods: Iterable[str] | None,
    paths: Iterable[str] | None,
) -> _Conditions:
    if ports is None and schemes is None and methods is None and paths is None:
        return _ANY
    return _Conditions(
        frozenset(ports) if ports is not None else None,
        frozenset(schemes) if schemes is not None else None,
        frozenset(methods) if methods is not None else None,
        tuple(canonical_pattern(path) for path in paths) if paths is not None else None,
    )


class _Rule(NamedTuple):
    position: int  # in document order: first match wins
    action: Literal["allow", "deny", "ask"]
    origin: str
    when: _Conditions
    conditional: bool
    always_inspect: bool


class _Binding(NamedTuple):
    name: str
    when: _Conditions


class _HostSlot(NamedTuple):
    """What can apply to one host: candidate rules in document order, ending at the first rule
    without conditions, and bindings by how they name the host (an exact host beats a wildcard)."""

    rules: tuple[_Rule, ...] = ()
    exact_bindings: tuple[_Binding, ...] = ()
    wildcard_bindings: tuple[_Binding, ...] = ()


_NOTHING = _HostSlot()


def _first_match_order(*groups: Sequence[_Rule]) -> tuple[_Rule, ...]:
    """The rules of several groups, each in document order, merged in document order and cut
    after the first rule that matches every request to the host (later ones are unreachable)."""
    present = [group for group in groups if group]
    if len(present) == 1:
        ordered: Sequence[_Rule] = present[0]
    else:
        by_position = {rule.position: rule for group in present for rule in group}
        ordered = [by_position[position] for position in sorted(by_position)]
    for end, rule in enumerate(ordered, 1):
        if rule.when is _ANY:
            return tuple(ordered[:end])
    return tuple(ordered)


def _merge(above: _HostSlot, own: _HostSlot) -> _HostSlot:
    """A name's or wildcard's own slot completed with the slot of the wildcard above it."""
    return _HostSlot(
        _first_match_order(above.rules, own.rules),
        own.exact_bindings,
        tuple(dict.fromkeys([*above.wildcard_bindings, *own.wildcard_bindings])),
    )


class _TrieNode:
    __slots__ = ("children", "merged", "own")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.own: _HostSlot | None = None  # the wildcard `*.<this suffix>`, if some rule names it
        self.merged: _HostSlot | None = None  # own + every wildcard above, filled on first use


class _NameIndex:
    """Host name -> `_HostSlot`: names in a dict, `*.suffix` wildcards in a reversed-label trie.

    A lookup is one dict hit, or one walk down the trie keeping the deepest wildcard it passes.
    A slot holds everything that applies to its host: a name's slot includes the wildcards above
    it, a wildcard's those of shorter suffixes. That merge is done on a slot's first lookup and
    kept, so compiling stays linear in the rules however they overlap, and the merge cost (the
    rules of that one host) is paid once per name or wildcard actually asked for.
    """

    def __init__(self, rules: Iterable[tuple[str, _Rule]], bindings: Iterable[tuple[str, _Binding]]) -> None:
        own: dict[str, tuple[list[_Rule], list[_Binding]]] = {}
        for pattern, rule in rules:
            own.setdefault(pattern, ([], []))[0].append(rule)
        for pattern, binding in bindings:
            own.setdefault(pattern, ([], []))[1].append(binding)
        self._root = _TrieNode()
        self._names: dict[str, _HostSlot] = {}
        for pattern, (pattern_rules, pattern_bindings) in own.items():
            if pattern.startswith("*."):
                self._node(pattern[2:]).own = _HostSlot(tuple(pattern_rules), (), tuple(pattern_bindings))
            else:
                self._names[pattern] = _HostSlot(tuple(pattern_rules), tuple(pattern_bindings), ())
        self._merged: dict[str, _HostSlot] = {}

    def _node(self, suffix: str) -> _TrieNode:
        node = self._root
        for label in reversed(suffix.split(".")):
            child = node.children.get(label)
            if child is None:
                child = node.children[label] = _TrieNode()
            node = child
        return node

    def named(self, name: str) -> _HostSlot | None:
        """The slot of a name some rule or binding names exactly, else None."""
        slot = self._merged.get(name)
        if slot is None:
            own = self._names.get(name)
            if own is None:
                return None
            slot = self._merged[name] = _merge(self.below_wildcards(name), own)
        return slot

    def lookup(self, name: str) -> _HostSlot:
        slot = self.named(name)
        return slot if slot is not None else self.below_wildcards(name)

    def below_wildcards(self, name: str) -> _HostSlot:
        """The slot of the deepest wildcard `name` is a proper subdomain of."""
        found = _NOTHING
        node = self._root
        labels = name.split(".")
        for depth in range(len(labels) - 1, 0, -1):
            child = node.children.get(labels[depth])
            if child is None:
                break
            node = child
            if node.own is not None:
                merged = node.merged
                if merged is None:
                    merged = node.merged = _merge(found, node.own)
                found = merged
        return found


class CompiledPolicy:
    """A Policy turned into indexes; `decide` and `check_address` answer in O(labels)."""

    def __init__(self, policy: Policy, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.policy = policy
        self._default_allow = policy.defaultAction == "allow"
        self._default_ask = policy.defaultAction == "ask"
        self._report = policy.mode == "report"
        with _cyclic_gc_paused():
            self._rules = [_compile_rule(index, rule) for index, rule in enumerate(policy.egress)]
            self._networks = PrefixTable[_Rule]()
            name_rules: list[tuple[str, _Rule]] = []
            for compiled, rule in zip(self._rules, policy.egress, strict=True):
                target = rule.parsed_target
                if target.network is not None:
                    self._networks.add(target.network, compiled)
                else:
                    name_rules.append((target.text, compiled))
            binding_hosts: list[tuple[str, _Binding]] = []
            for binding in policy.bindings:
                compiled_binding = _compile_binding(binding)
                binding_hosts += [(host, compiled_binding) for host in binding.match.hosts]
            self._names = _NameIndex(name_rules, binding_hosts)
        self._interned: dict[tuple[Any, ...], Decision] = {}
        self._connection_cache = functools.lru_cache(maxsize=cache_size)(self._decide_connection)
        self._address_cache = functools.lru_cache(maxsize=cache_size)(self._check_address)

    # -- public ---------------------------------------------------------------------------------

    def decide(self, request: Request | RequestIdentity) -> Decision:
        """Allow or deny this connection (method/path None) or request, with the reason. A
        `RequestIdentity` is already canonical; a `Request`'s target is made canonical here."""
        if isinstance(request, RequestIdentity):
            return self._decide(request.host, request.port, request.scheme, request)
        if request.method is None or request.path is None:
            return self._connection_cache(request.host, request.port, request.scheme)
        try:
            identity = request_identity(
                request.scheme, request.host, request.port, request.method, request.path
            )
        except AmbiguousTarget as exc:
            return Decision("deny", Reason.AMBIGUOUS_TARGET, detail=str(exc))
        return self._decide(identity.host, identity.port, identity.scheme, identity)

    def check_address(self, ip: str | IPAddress, request: Request | None = None) -> Decision:
        """May the proxy dial this resolved address for this request? Always-denied ranges need an
        explicit IP/CIDR allow rule inside the range; IP/CIDR deny rules apply to every address."""
        return self._address_cache(ip, None if request is None else (request.port, request.scheme))

    @property
    def rule_count(self) -> int:
        return len(self._rules)

    # -- deciding -------------------------------------------------------------------------------

    def _decide_connection(self, host: str, port: int, scheme: str) -> Decision:
        return self._decide(host, port, scheme.lower(), None)

    def _decide(self, raw_host: str, port: int, scheme: str, request: RequestIdentity | None) -> Decision:
        # A rule's or binding's name is already canonical: request_host would return it unchanged.
        slot = self._names.named(raw_host)
        if slot is None:
            host = request_host(raw_host)
            if host is None:
                return Decision(
                    "deny", Reason.INVALID_HOST, detail=f"{raw_host!r} is not a host name or address"
                )
            if not isinstance(host, str):
                return self._decide_address(host, port, scheme, request)
            slot = self._names.lookup(host)
        if request is not None and request.ambiguity is not None and _checks_path(slot, port, scheme):
            return _ambiguous(request)
        return self._apply_mode(self._scan(slot, True, port, scheme, request))

    def _decide_address(
        self, host: IPAddress, port: int, scheme: str, request: RequestIdentity | None
    ) -> Decision:
        """IP literals match only IP/CIDR rules; always-denied ranges need a rule inside them."""
        address = address_to_check(host)
        denied = denied_range(address)
        slot = _HostSlot(self._address_rules(address, denied))
        if request is not None and request.ambiguity is not None and _checks_path(slot, port, scheme):
            return _ambiguous(request)
        decision = self._scan(slot, False, port, scheme, request)
        if denied is not None and decision.allowed and decision.rule is None:
            decision = _always_denied(denied, decision.inspect)
        return self._apply_mode(decision)

    def _check_address(self, ip: str | IPAddress, connection: tuple[int, str] | None) -> Decision:
        try:
            address = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        except ValueError:
            return Decision("deny", Reason.INVALID_ADDRESS, detail=f"{ip!r} is not an IP address")
        address = address_to_check(address)
        denied = denied_range(address)
        for rule in self._address_rules(address, denied):
            if connection is not None and rule.when.connection_miss(connection[0], connection[1].lower()):
                continue
            action = "deny" if rule.action == "ask" else rule.action  # nobody is asked about an address
            return self._apply_mode(Decision(action, Reason.RULE, rule.origin, detail=f"address {address}"))
        if denied is not None:
            return _always_denied(denied, False)
        return Decision("allow", Reason.ADDRESS_OK, detail=f"address {address}")

    def _scan(
        self, slot: _HostSlot, named: bool, port: int, scheme: str, request: RequestIdentity | None
    ) -> Decision:
        method, path = (request.method, request.path) if request is not None else (None, None)
        decided: _Rule | None = None
        fallback: _Rule | None = None
        first_conditional: _Rule | None = None
        conditional_allow = False
        near_miss: tuple[Reason, _Rule] | None = None
        for rule in slot.rules:
            miss = rule.when.connection_miss(port, scheme) if rule.when is not _ANY else None
            if miss is not None:
                near_miss = near_miss or (miss, rule)
                continue
            if not rule.conditional:
                fallback = rule
                break
            first_conditional = first_conditional or rule
            conditional_allow = conditional_allow or rule.action != "deny"  # allow, or ask
            if method is not None and path is not None and decided is None:
                miss = rule.when.request_miss(method, path)
                if miss is None:
                    decided = rule
                else:
                    near_miss = near_miss or (miss, rule)
        asks = fallback.action == "ask" if fallback else self._default_ask and near_miss is None and named
        fallback_allows = fallback.action == "allow" if fallback else self._default_allow
        connection_allowed = (first_conditional is not None and conditional_allow) or fallback_allows or asks
        inspect = connection_allowed and (
            first_conditional is not None
            or asks  # a held request needs the L7 view: the question is asked per request
            or (fallback is not None and fallback.always_inspect)
            or _binding_could_apply(slot, port, scheme)
        )
        if method is None and connection_allowed and (first_conditional is not None or asks):
            pending = first_conditional or fallback
            return self._outcome("allow", Reason.L7_PENDING, pending.origin if pending else None, True)
        decided = decided or fallback
        if decided is not None and decided.action == "ask":
            return self._outcome("deny", Reason.ASK, decided.origin, True)
        if decided is not None:
            action: Literal["allow", "deny"] = "allow" if decided.action == "allow" else "deny"
            decision = self._outcome(action, Reason.RULE, decided.origin, inspect)
        elif asks:
            return self._outcome("deny", Reason.ASK, None, True)
        else:
            decision = self._default(named, near_miss, inspect)
        if method is not None and path is not None and named and decision.allowed:
            return self._with_binding(decision, slot, port, scheme, method, path)
        return decision

    def _default(self, named: bool, near_miss: tuple[Reason, _Rule] | None, inspect: bool) -> Decision:
        if self._default_allow:
            return self._outcome("allow", Reason.DEFAULT, None, inspect)
        if near_miss is not None:
            return self._outcome("deny", near_miss[0], near_miss[1].origin, inspect)
        if not named:
            return self._outcome("deny", Reason.IP_LITERAL_NEEDS_CIDR_RULE, None, inspect)
        return self._outcome("deny", Reason.DEFAULT, None, inspect)

    def _apply_mode(self, decision: Decision) -> Decision:
        if self._report and not decision.allowed and decision.reason not in ALWAYS_ENFORCED:
            if decision.detail is None:
                return self._outcome("allow", decision.reason, decision.rule, decision.inspect, (), True)
            return Decision(
                "allow", decision.reason, decision.rule, decision.inspect, (), True, decision.detail
            )
        return decision

    def _outcome(
        self,
        action: Literal["allow", "deny"],
        reason: Reason,
        rule: str | None,
        inspect: bool,
        bindings: tuple[str, ...] = (),
        report_only: bool = False,
    ) -> Decision:
        """The one shared Decision for this outcome; their number is bounded by the policy's size."""
        key = (action, reason, rule, inspect, bindings, report_only)
        decision = self._interned.get(key)
        if decision is None:
            decision = self._interned.setdefault(key, Decision(*key))
        return decision

    # -- addresses and bindings -----------------------------------------------------------------

    def _address_rules(self, address: IPAddress, denied: DeniedRange | None) -> tuple[_Rule, ...]:
        """IP/CIDR rules containing the address, in order, cut after the first without conditions
        (as a name's slot: what follows it is unreachable, and must not make a path look checked);
        in an always-denied range an allow rule counts only if it lies inside that range (so
        `allow 0.0.0.0/0` never opens loopback)."""
        found = [
            rule
            for length, rule in self._networks.lookup(address)
            if denied is None or length >= denied.network.prefixlen or rule.action == "deny"
        ]
        found.sort(key=lambda rule: rule.position)
        return _first_match_order(found)

    def _with_binding(
        self, decision: Decision, slot: _HostSlot, port: int, scheme: str, method: str, path: str
    ) -> Decision:
        """OpenSandbox's selection: conditions first, then exact host beats wildcard; a tie denies."""
        if not slot.exact_bindings and not slot.wildcard_bindings:
            return decision

        def matching(bindings: Iterable[_Binding]) -> list[str]:
            return [
                binding.name
                for binding in bindings
                if binding.when.connection_miss(port, scheme) is None
                and binding.when.request_miss(method, path) is None
            ]

        names = matching(slot.exact_bindings) or matching(slot.wildcard_bindings)
        if len(names) > 1:
            return Decision(
                "deny",
                Reason.BINDING_AMBIGUOUS,
                decision.rule,
                decision.inspect,
                detail="bindings " + ", ".join(sorted(names)) + " all match this request",
            )
        return self._outcome(decision.action, decision.reason, decision.rule, decision.inspect, tuple(names))


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Compiling 100,000 rules allocates about a million small acyclic containers; the cyclic
    collector would sweep the growing heap again and again (measured: twice the compile time).
    Re-enabled afterwards only if it was on, so callers that turned it off keep it off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _checks_path(slot: _HostSlot, port: int, scheme: str) -> bool:
    """Whether a rule or binding that could apply to this connection looks at the path."""
    return any(
        candidate.when.checks_path and candidate.when.connection_miss(port, scheme) is None
        for candidates in (slot.rules, slot.exact_bindings, slot.wildcard_bindings)
        for candidate in candidates
    )


def _ambiguous(request: RequestIdentity) -> Decision:
    return Decision(
        "deny",
        Reason.AMBIGUOUS_TARGET,
        detail=f"the path {request.path!r} has {request.ambiguity}, and a rule or binding checks this path; "
        "origins disagree on what such a path names",
    )


def _binding_could_apply(slot: _HostSlot, port: int, scheme: str) -> bool:
    return any(
        binding.when.connection_miss(port, scheme) is None
        for bindings in (slot.exact_bindings, slot.wildcard_bindings)
        for binding in bindings
    )


def _always_denied(denied: DeniedRange, inspect: bool) -> Decision:
    return Decision(
        "deny",
        Reason.ALWAYS_DENIED_RANGE,
        None,
        inspect,
        detail=f"{denied.network} ({denied.label}) needs an explicit IP/CIDR allow rule inside it",
    )


def _compile_rule(index: int, rule: EgressRule) -> _Rule:
    return _Rule(
        position=index,
        action=rule.action,
        origin=rule.origin or f"egress[{index}]",
        when=_conditions(rule.ports, rule.schemes, rule.methods, rule.paths),
        conditional=rule.conditional,
        always_inspect=rule.inspect == "always",
    )


def _compile_binding(binding: Binding) -> _Binding:
    match = binding.match
    return _Binding(binding.name, _conditions(match.ports, match.schemes, match.methods, match.paths))


def compile_policy(policy: Policy, *, cache_size: int = DEFAULT_CACHE_SIZE) -> CompiledPolicy:
    """Build the indexes for `policy`, a validated document (its limits were checked where it
    entered, loader.py rule 5). `cache_size` bounds each decision cache (connections,
    addresses); 0 turns caching off."""
    return CompiledPolicy(policy, cache_size)

"""Compiled policies and decisions: the one decision function for every path into the proxy.

What a decision depends on: the request's host, port and scheme (connection level) and, when
known, its method and path (request level); the resolved upstream address for `check_address`.
What it must never know: sockets, mitmproxy, the clock, files. It is pure and deterministic.

Theory of operation:
- Rules are numbered in document order; the first rule whose every condition matches decides
  (OpenSandbox's first-match-wins). Indexes find the rules whose target can match a host (exact
  names in a dict, wildcards in a reversed-label trie, IPs and CIDRs in a prefix table), so a
  decision costs O(labels + prefix lengths + rules for that host), never O(all rules); taking the
  candidates in index order preserves first-match-wins exactly.
- At connection level (method/path unknown: SNI, CONNECT, original destination) a rule with
  methods or paths cannot be decided yet. If such a rule comes before the first rule that decides
  the connection and some request could still be allowed, the connection is allowed with
  reason "l7_pending" and `inspect=True`; each request is then decided on its own.
- `inspect` says whether the proxy needs an L7 view of this host: a method/path rule could apply,
  a credential binding could apply, or the deciding rule says `inspect: always`.
- Report mode turns a would-deny into allow with `report_only=True`, except for the reasons in
  `ALWAYS_ENFORCED` (malformed hosts and always-denied addresses are never let through).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain
from typing import Any, Literal

from sandgate.policy.addresses import DeniedRange, PrefixTable, address_to_check, denied_range
from sandgate.policy.errors import PolicyError, PolicyIssue
from sandgate.policy.models import Binding, EgressRule, Policy
from sandgate.policy.names import IPAddress, normalize_path, path_matches, request_host

DEFAULT_MAX_RULES = 4096
ALWAYS_ENFORCED = frozenset({"invalid_host", "invalid_address", "always_denied_range"})


@dataclass(frozen=True, slots=True)
class Request:
    """What is known about a connection or request; method/path None = connection level."""

    host: str
    port: int
    scheme: str
    method: str | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome and its reason; audit records and `policy explain` serialise this value."""

    action: Literal["allow", "deny"]
    reason: str
    rule: str | None = None
    inspect: bool = False
    bindings: tuple[str, ...] = ()
    report_only: bool = False
    detail: str | None = None

    @property
    def allowed(self) -> bool:
        return self.action == "allow"

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": "report" if self.report_only else self.action,
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

    def connection_miss(self, port: int, scheme: str) -> str | None:
        if self.ports is not None and port not in self.ports:
            return "port_not_allowed"
        if self.schemes is not None and scheme not in self.schemes:
            return "scheme_not_allowed"
        return None

    def request_miss(self, method: str, path: str) -> str | None:
        if self.methods is not None and method not in self.methods:
            return "method_not_allowed"
        if self.paths is not None and not any(path_matches(pattern, path) for pattern in self.paths):
            return "path_not_allowed"
        return None


def _conditions(
    ports: Iterable[int] | None,
    schemes: Iterable[str] | None,
    methods: Iterable[str] | None,
    paths: Iterable[str] | None,
) -> _Conditions:
    return _Conditions(
        frozenset(ports) if ports is not None else None,
        frozenset(schemes) if schemes is not None else None,
        frozenset(methods) if methods is not None else None,
        tuple(paths) if paths is not None else None,
    )


@dataclass(frozen=True, slots=True)
class _Rule:
    action: Literal["allow", "deny"]
    origin: str
    when: _Conditions
    conditional: bool
    always_inspect: bool


@dataclass(frozen=True, slots=True)
class _Binding:
    name: str
    when: _Conditions


class _LabelTrie:
    """Wildcard suffixes keyed by reversed labels; `*.b.c` lives at c -> b and matches x.b.c."""

    _VALUES = ""  # never a label, so it can key a node's own values

    def __init__(self) -> None:
        self.root: dict[str, Any] = {}

    def add(self, suffix: str, value: int) -> None:
        node = self.root
        for label in reversed(suffix.split(".")):
            node = node.setdefault(label, {})
        node.setdefault(self._VALUES, []).append(value)

    def matches(self, name: str) -> list[list[int]]:
        """Value lists of every wildcard that matches `name` (a proper subdomain of its suffix)."""
        found: list[list[int]] = []
        labels = name.split(".")
        node = self.root
        for depth in range(len(labels) - 1, 0, -1):
            child = node.get(labels[depth])
            if child is None:
                break
            node = child
            values = node.get(self._VALUES)
            if values:
                found.append(values)
        return found


class _HostIndex:
    """Exact names in a dict and wildcards in a trie, each mapping to item numbers in order."""

    def __init__(self) -> None:
        self.exact: dict[str, list[int]] = {}
        self.wildcards = _LabelTrie()

    def add(self, pattern: str, value: int) -> None:
        if pattern.startswith("*."):
            self.wildcards.add(pattern[2:], value)
        else:
            self.exact.setdefault(pattern, []).append(value)


class CompiledPolicy:
    """A Policy turned into indexes; `decide` and `check_address` answer in O(labels)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._default_allow = policy.defaultAction == "allow"
        self._report = policy.mode == "report"
        self._rules = [_compile_rule(index, rule) for index, rule in enumerate(policy.egress)]
        self._names = _HostIndex()
        self._networks = PrefixTable[int]()
        for index, rule in enumerate(policy.egress):
            target = rule.parsed_target
            if target.network is not None:
                self._networks.add(target.network, index)
            else:
                self._names.add(target.text, index)
        self._bindings = [_compile_binding(binding) for binding in policy.bindings]
        self._binding_hosts = _HostIndex()
        for index, binding in enumerate(policy.bindings):
            for host in binding.match.hosts:
                self._binding_hosts.add(host, index)

    # -- public ---------------------------------------------------------------------------------

    def decide(self, request: Request) -> Decision:
        """Allow or deny this connection (method/path None) or request, with the reason."""
        host = request_host(request.host)
        if host is None:
            return Decision("deny", "invalid_host", detail=f"{request.host!r} is not a host name or address")
        scheme = request.scheme.lower()
        request_level = request.method is not None and request.path is not None
        method = request.method.upper() if request.method is not None else ""
        path = normalize_path(request.path) if request.path is not None else ""
        denied: DeniedRange | None = None
        if isinstance(host, str):
            candidates = self._name_candidates(host)
        else:
            host = address_to_check(host)
            denied = denied_range(host)
            candidates = self._address_candidates(host, denied)
        decision = self._scan(candidates, host, request.port, scheme, request_level, method, path)
        if denied is not None and decision.allowed and decision.rule is None:
            decision = _always_denied(denied, decision.inspect)
        return self._apply_mode(decision)

    def check_address(self, ip: str | IPAddress, request: Request | None = None) -> Decision:
        """May the proxy dial this resolved address for this request? Always-denied ranges need an
        explicit IP/CIDR allow rule inside the range; IP/CIDR deny rules apply to every address."""
        try:
            address = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
        except ValueError:
            return Decision("deny", "invalid_address", detail=f"{ip!r} is not an IP address")
        address = address_to_check(address)
        denied = denied_range(address)
        for index in self._address_candidates(address, denied):
            rule = self._rules[index]
            if request is not None and rule.when.connection_miss(request.port, request.scheme.lower()):
                continue
            return self._apply_mode(Decision(rule.action, "rule", rule.origin, detail=f"address {address}"))
        if denied is not None:
            return _always_denied(denied, False)
        return Decision("allow", "address_ok", detail=f"address {address}")

    @property
    def rule_count(self) -> int:
        return len(self._rules)

    # -- the scan -------------------------------------------------------------------------------

    def _scan(
        self,
        candidates: list[int],
        host: str | IPAddress,
        port: int,
        scheme: str,
        request_level: bool,
        method: str,
        path: str,
    ) -> Decision:
        decided: _Rule | None = None
        fallback: _Rule | None = None
        first_conditional: _Rule | None = None
        conditional_allow = False
        near_miss: tuple[str, _Rule] | None = None
        for index in candidates:
            rule = self._rules[index]
            miss = rule.when.connection_miss(port, scheme)
            if miss is not None:
                near_miss = near_miss or (miss, rule)
                continue
            if not rule.conditional:
                fallback = rule
                break
            first_conditional = first_conditional or rule
            conditional_allow = conditional_allow or rule.action == "allow"
            if request_level and decided is None:
                miss = rule.when.request_miss(method, path)
                if miss is None:
                    decided = rule
                else:
                    near_miss = near_miss or (miss, rule)
        fallback_allows = fallback.action == "allow" if fallback else self._default_allow
        connection_allowed = (first_conditional is not None and conditional_allow) or fallback_allows
        inspect = connection_allowed and (
            first_conditional is not None
            or (fallback is not None and fallback.always_inspect)
            or self._binding_could_apply(host, port, scheme)
        )
        if not request_level and first_conditional is not None and connection_allowed:
            return Decision("allow", "l7_pending", first_conditional.origin, inspect=True)
        decided = decided or fallback
        if decided is not None:
            decision = Decision(decided.action, "rule", decided.origin, inspect)
        else:
            decision = self._default(host, near_miss, inspect)
        if request_level and decision.allowed and isinstance(host, str):
            return self._with_binding(decision, host, port, scheme, method, path)
        return decision

    def _default(self, host: str | IPAddress, near_miss: tuple[str, _Rule] | None, inspect: bool) -> Decision:
        if self._default_allow:
            return Decision("allow", "default", None, inspect)
        if near_miss is not None:
            return Decision("deny", near_miss[0], near_miss[1].origin, inspect)
        if not isinstance(host, str):
            return Decision("deny", "ip_literal_needs_cidr_rule", None, inspect)
        return Decision("deny", "default", None, inspect)

    def _apply_mode(self, decision: Decision) -> Decision:
        if self._report and not decision.allowed and decision.reason not in ALWAYS_ENFORCED:
            return Decision(
                "allow", decision.reason, decision.rule, decision.inspect, (), True, decision.detail
            )
        return decision

    # -- candidates -----------------------------------------------------------------------------

    def _name_candidates(self, name: str) -> list[int]:
        lists = self._names.wildcards.matches(name)
        exact = self._names.exact.get(name)
        if exact:
            lists.append(exact)
        if not lists:
            return []
        if len(lists) == 1:
            return lists[0]
        return sorted(chain.from_iterable(lists))

    def _address_candidates(self, address: IPAddress, denied: DeniedRange | None) -> list[int]:
        """IP/CIDR rules containing the address, in order; in an always-denied range an allow rule
        counts only if it lies inside that range (so `allow 0.0.0.0/0` never opens loopback)."""
        found = [
            index
            for length, index in self._networks.lookup(address)
            if denied is None or length >= denied.network.prefixlen or self._rules[index].action == "deny"
        ]
        found.sort()
        return found

    # -- bindings -------------------------------------------------------------------------------

    def _binding_could_apply(self, host: str | IPAddress, port: int, scheme: str) -> bool:
        if not self._bindings or not isinstance(host, str):
            return False
        if host not in self._binding_hosts.exact and not self._binding_hosts.wildcards.root:
            return False
        lists = self._binding_hosts.wildcards.matches(host)
        exact = self._binding_hosts.exact.get(host)
        if exact:
            lists.append(exact)
        return any(
            self._bindings[index].when.connection_miss(port, scheme) is None
            for index in chain.from_iterable(lists)
        )

    def _with_binding(
        self, decision: Decision, host: str, port: int, scheme: str, method: str, path: str
    ) -> Decision:
        """OpenSandbox's selection: conditions first, then exact host beats wildcard; a tie denies."""
        if not self._bindings:
            return decision

        def matching(indexes: Iterable[int]) -> list[str]:
            return [
                self._bindings[i].name
                for i in indexes
                if self._bindings[i].when.connection_miss(port, scheme) is None
                and self._bindings[i].when.request_miss(method, path) is None
            ]

        names = matching(self._binding_hosts.exact.get(host, ()))
        if not names:
            names = matching(chain.from_iterable(self._binding_hosts.wildcards.matches(host)))
        names = list(dict.fromkeys(names))
        if len(names) > 1:
            return Decision(
                "deny",
                "binding_ambiguous",
                decision.rule,
                decision.inspect,
                detail="bindings " + ", ".join(sorted(names)) + " all match this request",
            )
        return Decision(decision.action, decision.reason, decision.rule, decision.inspect, tuple(names))


def _always_denied(denied: DeniedRange, inspect: bool) -> Decision:
    return Decision(
        "deny",
        "always_denied_range",
        None,
        inspect,
        detail=f"{denied.network} ({denied.label}) needs an explicit IP/CIDR allow rule inside it",
    )


def _compile_rule(index: int, rule: EgressRule) -> _Rule:
    return _Rule(
        action=rule.action,
        origin=rule.origin or f"egress[{index}]",
        when=_conditions(rule.ports, rule.schemes, rule.methods, rule.paths),
        conditional=rule.conditional,
        always_inspect=rule.inspect == "always",
    )


def _compile_binding(binding: Binding) -> _Binding:
    match = binding.match
    return _Binding(binding.name, _conditions(match.ports, match.schemes, match.methods, match.paths))


def compile_policy(policy: Policy, max_rules: int = DEFAULT_MAX_RULES) -> CompiledPolicy:
    """Build the indexes for `policy`; raises PolicyError if it has more than `max_rules` rules."""
    check_rule_limit(len(policy.egress), max_rules)
    return CompiledPolicy(policy)


def check_rule_limit(count: int, max_rules: int) -> None:
    if count > max_rules:
        raise PolicyError(
            [
                PolicyIssue(
                    "<policy>",
                    0,
                    0,
                    f"policy has {count} egress rules; the limit is {max_rules}",
                    "merge rules with wildcards or CIDRs, or raise the limit (settings / max_rules)",
                    "egress",
                )
            ]
        )

"""A naive, linear reading of the policy semantics, written straight from docs/policy.md.

It shares only the input normalisation with sandgate.policy (names.request_host, the canonical
request target and path patterns of sandgate.policy.canonical), never the indexes: the property
tests check that the compiled matcher's dicts, trie and prefix table give exactly what a plain
first-match scan over every rule gives.
"""

from __future__ import annotations

import ipaddress

from sandgate.policy import Binding, Decision, EgressRule, Policy, Reason, Request, denied_range
from sandgate.policy.addresses import address_to_check
from sandgate.policy.canonical import AmbiguousTarget, canonical_pattern, canonical_target
from sandgate.policy.names import IPAddress, request_host


def target_matches(rule: EgressRule, host: str | IPAddress) -> bool:
    target = rule.parsed_target
    if isinstance(host, str):
        if target.kind == "name":
            return host == target.text
        return target.kind == "wildcard" and host.endswith("." + target.suffix)
    network = target.network
    if network is None or network.version != host.version or host not in network:
        return False
    denied = denied_range(host)
    return denied is None or rule.action == "deny" or network.prefixlen >= denied.network.prefixlen


def port_scheme_miss(rule: EgressRule | Binding, port: int, scheme: str) -> str | None:
    ports = rule.match.ports if isinstance(rule, Binding) else rule.ports
    schemes = rule.match.schemes if isinstance(rule, Binding) else rule.schemes
    if ports is not None and port not in ports:
        return "port_not_allowed"
    if schemes is not None and scheme not in schemes:
        return "scheme_not_allowed"
    return None


def _method_path_miss(
    methods: list[str] | None, paths: list[str] | None, method: str, path: str
) -> str | None:
    if methods is not None and method not in methods:
        return "method_not_allowed"
    patterns = [canonical_pattern(p) for p in paths or ()]
    if paths is not None and not any(
        path.startswith(p[:-1]) if p.endswith("*") else path == p for p in patterns
    ):
        return "path_not_allowed"
    return None


def _path_checked(policy: Policy, host: str | IPAddress, port: int, scheme: str) -> bool:
    """A rule (up to the first one without any condition) or binding for this host and connection
    whose paths are not just `/*`."""
    for rule in policy.egress:
        if not target_matches(rule, host):
            continue
        if rule.paths is not None and "/*" not in rule.paths and port_scheme_miss(rule, port, scheme) is None:
            return True
        if not rule.conditional and rule.ports is None and rule.schemes is None:
            break
    return isinstance(host, str) and any(
        any(_binding_hosts_match(b, host))
        and "/*" not in b.match.paths
        and port_scheme_miss(b, port, scheme) is None
        for b in policy.bindings
    )


def _binding_hosts_match(binding: Binding, host: str) -> tuple[bool, bool]:
    exact = host in binding.match.hosts
    wild = any(h.startswith("*.") and host.endswith(h[1:]) for h in binding.match.hosts)
    return exact, wild


def naive_decide(policy: Policy, request: Request) -> Decision:
    level = request.method is not None and request.path is not None
    method = (request.method or "").upper()
    path, ambiguity = "", None
    if level:  # an ambiguous target is refused before anything else is looked at
        try:
            path, _query, ambiguity = canonical_target(request.path or "", method)
        except AmbiguousTarget:
            return Decision("deny", Reason.AMBIGUOUS_TARGET)
    host = request_host(request.host)
    if host is None:
        return Decision("deny", "invalid_host")
    denied = None
    if not isinstance(host, str):
        host = address_to_check(host)
        denied = denied_range(host)
    scheme = request.scheme.lower()
    if ambiguity is not None and _path_checked(policy, host, request.port, scheme):
        return Decision("deny", Reason.AMBIGUOUS_TARGET)
    applicable: list[EgressRule] = []
    misses: list[tuple[str, EgressRule]] = []  # (reason, rule) in rule order, for the deny reason
    for rule in policy.egress:
        if not target_matches(rule, host):
            continue
        miss = port_scheme_miss(rule, request.port, scheme)
        if miss is None and level:
            miss = _method_path_miss(rule.methods, rule.paths, method, path)
            applicable.append(rule)
        elif miss is None:
            applicable.append(rule)
        if miss:
            misses.append((miss, rule))
    fallback = next((r for r in applicable if not r.conditional), None)
    before = applicable[: applicable.index(fallback)] if fallback else applicable
    default_allow = policy.defaultAction == "allow"
    connection_allowed = any(r.action == "allow" for r in before) or (
        fallback.action == "allow" if fallback else default_allow
    )
    bindings_apply = isinstance(host, str) and any(
        any(_binding_hosts_match(b, host)) and port_scheme_miss(b, request.port, scheme) is None
        for b in policy.bindings
    )
    inspect = connection_allowed and (
        bool(before) or (fallback is not None and fallback.inspect == "always") or bindings_apply
    )
    if not level and before and connection_allowed:
        decision = Decision("allow", "l7_pending", before[0].origin, True)
    else:
        decided = fallback
        if level:
            decided = next(
                (r for r in applicable if _method_path_miss(r.methods, r.paths, method, path) is None), None
            )
        if decided is not None:
            decision = Decision(decided.action, "rule", decided.origin, inspect)
        elif default_allow:
            decision = Decision("allow", "default", None, inspect)
        elif misses:
            decision = Decision("deny", misses[0][0], misses[0][1].origin, inspect)
        elif not isinstance(host, str):
            decision = Decision("deny", "ip_literal_needs_cidr_rule", None, inspect)
        else:
            decision = Decision("deny", "default", None, inspect)
        if level and decision.action == "allow" and isinstance(host, str):
            decision = _naive_binding(policy, decision, host, request.port, scheme, method, path)
    if denied is not None and decision.action == "allow" and decision.rule is None:
        decision = Decision("deny", "always_denied_range", None, decision.inspect)
    if policy.mode == "report" and decision.action == "deny" and decision.reason != "always_denied_range":
        decision = Decision("allow", decision.reason, decision.rule, decision.inspect, (), True)
    return decision


def _naive_binding(
    policy: Policy, decision: Decision, host: str, port: int, scheme: str, method: str, path: str
) -> Decision:
    exact: list[str] = []
    wild: list[str] = []
    for binding in policy.bindings:
        if port_scheme_miss(binding, port, scheme) or _method_path_miss(
            binding.match.methods, binding.match.paths, method, path
        ):
            continue
        is_exact, is_wild = _binding_hosts_match(binding, host)
        if is_exact:
            exact.append(binding.name)
        elif is_wild:
            wild.append(binding.name)
    top = exact or wild
    if len(top) > 1:
        return Decision("deny", "binding_ambiguous", decision.rule, decision.inspect)
    return Decision(decision.action, decision.reason, decision.rule, decision.inspect, tuple(top))


def same_decision(a: Decision, b: Decision) -> bool:
    """Equal in everything but the human-readable detail."""
    keys = ("action", "reason", "rule", "inspect", "bindings", "report_only")
    return all(getattr(a, key) == getattr(b, key) for key in keys)


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)

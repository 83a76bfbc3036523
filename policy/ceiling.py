"""Ceilings: a policy that bounds other policies (a tenant's over its sandboxes'). Both must allow.

Rules of this module:
1. A ceiling is an ordinary `Policy`. `within_ceiling(ceiling, policy)` answers whether every
   request `policy` can let out is one the ceiling would let out too, and whether every binding
   `policy` carries is one the ceiling carries; the answer is a `CeilingDecision`, a value with
   its reason, naming the ceiling rule that refuses (or `defaultAction`) and the sandbox rule or
   binding it refuses.
2. The check is static (no request, no clock) and sound: it may refuse a policy that is in fact
   within the ceiling, never accept one that is not. Where containment is not decided exactly it
   refuses and says what to write instead (docs/policy.md, "Ceilings", lists these cases).
3. Levels: allow > ask > deny. A sandbox `allow` needs the ceiling's `allow` for every request it
   covers; a sandbox `ask` needs `ask` or `allow` (a reviewer may let it through); a sandbox
   `deny` needs nothing. `mode: report` lets every request out, so a report-mode policy is checked
   as `defaultAction: allow` with no rules.

Theory of operation: each sandbox allow/ask rule (and an allowing default) is a region, the
product of a target (name, wildcard, network, or everything) and its conditions (ports, schemes,
methods, paths; None is any). The region walks the ceiling's rules in order, as a request would:
- a ceiling rule disjoint from the region is passed;
- an allowing ceiling rule that contains the whole region accepts it;
- an allowing rule that contains part of it is passed (the rest must be allowed later: sound,
  not exact, so allows split across several ceiling rules are refused);
- a refusing ceiling rule that meets the region refuses it, unless an earlier sandbox `deny`
  rule without conditions beyond the ceiling rule's covers the ceiling rule's whole region;
- at the end the ceiling's defaultAction decides.
Names and addresses are separate spaces (a name request matches only name rules), but a ceiling's
IP/CIDR deny rules also apply to every address a name resolves to: a sandbox that allows any
name must carry a deny rule covering each of them (those inside the always-denied ranges excepted:
a name's address there is refused anyway).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from sandgate.policy.addresses import ALWAYS_DENIED
from sandgate.policy.models import Binding, EgressRule, Policy
from sandgate.policy.names import IPNetwork

LEVEL = {"deny": 0, "ask": 1, "allow": 2}
DEFAULT = "defaultAction"


@dataclass(frozen=True)
class CeilingDecision:
    """Whether a policy is within a ceiling, and why (rule 1)."""

    allowed: bool
    reason: str
    ceiling_rule: str | None = None  # the ceiling rule's id (or "defaultAction") that refuses
    sandbox_rule: str | None = None  # the sandbox rule's or binding's id it refuses

    def __str__(self) -> str:
        return self.reason


WITHIN = CeilingDecision(True, "every rule and binding is within the ceiling")


@dataclass(frozen=True)
class _Region:
    """The requests one sandbox rule (or its default) lets out."""

    kind: Literal["name", "wildcard", "network", "everything"]
    text: str
    network: IPNetwork | None
    ports: frozenset[int] | None
    schemes: frozenset[str] | None
    methods: frozenset[str] | None
    paths: tuple[str, ...] | None

    @classmethod
    def of(cls, rule: EgressRule) -> _Region:
        target = rule.parsed_target
        return cls(
            target.kind,
            target.text,
            target.network,
            _set(rule.ports),
            None if rule.schemes is None else frozenset[str](rule.schemes),
            _set(rule.methods),
            tuple(rule.paths) if rule.paths is not None else None,
        )


EVERYTHING = _Region("everything", "*", None, None, None, None, None)


def _set[T](values: list[T] | None) -> frozenset[T] | None:
    return None if values is None else frozenset(values)


def _label(rule: EgressRule, index: int) -> str:
    return rule.origin or f"egress[{index}]"


def within_ceiling(ceiling: Policy, policy: Policy) -> CeilingDecision:
    """Is `policy` within `ceiling`? The first refusal found, or `WITHIN` (module rules)."""
    for decision in _decisions(ceiling, policy):
        if not decision.allowed:
            return decision
    return WITHIN


def _decisions(ceiling: Policy, policy: Policy) -> Iterator[CeilingDecision]:
    """Each allowing region of `policy` against the ceiling, then addresses, then bindings."""
    if policy.mode == "report":
        yield _check_region(ceiling, EVERYTHING, "allow", "sandbox mode: report", [])
    else:
        rules = policy.egress
        for index, rule in enumerate(rules):
            if rule.action != "deny":
                label = f"sandbox rule {_label(rule, index)} ({rule.action} {rule.target})"
                yield _check_region(ceiling, _Region.of(rule), rule.action, label, rules[:index])
        if policy.defaultAction != "deny":
            label = f"sandbox defaultAction {policy.defaultAction}"
            yield _check_region(ceiling, EVERYTHING, policy.defaultAction, label, rules)
    yield _resolved_addresses(ceiling, policy)
    yield _bindings_within(ceiling, policy.bindings)


def _check_region(
    ceiling: Policy, region: _Region, level: str, label: str, earlier: Sequence[EgressRule]
) -> CeilingDecision:
    denies = [rule for rule in earlier if rule.action == "deny" and not _conditional(rule)]
    for index, rule in enumerate(ceiling.egress):
        cover = _Region.of(rule)
        if not _meets(cover, region):
            continue
        if LEVEL[rule.action] >= LEVEL[level]:
            if _contains(cover, region):
                return WITHIN
            continue
        if any(_contains(_Region.of(deny), cover) for deny in denies):
            continue
        return _refused(
            f"ceiling rule {_label(rule, index)} ({rule.action} {rule.target}"
            f"{_conditions_text(rule)}) refuses {label}: the ceiling does not allow every request it allows",
            _label(rule, index),
            label,
        )
    if LEVEL[ceiling.defaultAction] >= LEVEL[level]:
        return WITHIN
    return _refused(
        f"ceiling defaultAction {ceiling.defaultAction} refuses {label}: no ceiling rule allows all of it"
        " (a rule split across several ceiling rules is refused; write it within one)",
        DEFAULT,
        label,
    )


def _resolved_addresses(ceiling: Policy, policy: Policy) -> CeilingDecision:
    """A ceiling's IP/CIDR deny rules apply to the addresses names resolve to (module docstring):
    a policy that allows names carries a deny rule covering each."""
    if not _allows_names(policy):
        return WITHIN
    for index, rule in enumerate(ceiling.egress):
        if rule.action == "allow" or rule.parsed_target.kind != "network" or _always_denied(rule):
            continue
        cover = _Region.of(rule)
        sandbox_denies = (
            _Region.of(own)
            for own in policy.egress
            if own.action == "deny" and own.parsed_target.kind == "network" and not _conditional(own)
        )
        if policy.mode != "report" and any(_contains(deny, cover) for deny in sandbox_denies):
            continue
        return _refused(
            f"ceiling rule {_label(rule, index)} ({rule.action} {rule.target}) refuses the policy: "
            f"a name it allows may resolve into {rule.target}; add `- {{action: deny, target: "
            f"{rule.target}}}` to the sandbox policy",
            _label(rule, index),
            "the policy's name rules",
        )
    return WITHIN


def _always_denied(rule: EgressRule) -> bool:
    """Inside an always-denied range a name's address is refused already (a sandbox CIDR allow
    there is a region of its own, checked against this rule)."""
    network = rule.parsed_target.network
    return network is not None and any(_subnet(network, denied.network) for denied in ALWAYS_DENIED)


def _allows_names(policy: Policy) -> bool:
    return (
        policy.mode == "report"
        or policy.defaultAction != "deny"
        or any(rule.action != "deny" and rule.parsed_target.kind != "network" for rule in policy.egress)
    )


def _bindings_within(ceiling: Policy, bindings: list[Binding]) -> CeilingDecision:
    """A binding is within the ceiling when one ceiling binding has its auth type, names every
    credential it names, and matches every request it matches."""
    for index, binding in enumerate(bindings):
        label = f"sandbox binding {binding.origin or f'bindings[{index}]'} ({binding.name})"
        if not any(_binding_contains(own, binding) for own in ceiling.bindings):
            return _refused(
                f"no ceiling binding allows {label}: the ceiling carries no {binding.auth.type} binding "
                f"with credential(s) {', '.join(binding.credential_names())} for all its hosts, "
                "schemes, ports, methods and paths",
                "bindings",
                label,
            )
    return WITHIN


def _binding_contains(cover: Binding, binding: Binding) -> bool:
    outer, inner = cover.match, binding.match
    return (
        cover.auth.type == binding.auth.type
        and set(binding.credential_names()) <= set(cover.credential_names())
        and all(any(_host_contains(host, wanted) for host in outer.hosts) for wanted in inner.hosts)
        and set(inner.schemes) <= set(outer.schemes)
        and set(inner.ports) <= set(outer.ports)
        and set(inner.methods) <= set(outer.methods)
        and _paths_contain(tuple(outer.paths), tuple(inner.paths))
    )


def _refused(reason: str, ceiling_rule: str, sandbox_rule: str) -> CeilingDecision:
    return CeilingDecision(False, reason, ceiling_rule, sandbox_rule)


def _conditional(rule: EgressRule) -> bool:
    return rule.conditional or rule.ports is not None or rule.schemes is not None


def _conditions_text(rule: EgressRule) -> str:
    parts = [
        f"{name} {','.join(map(str, values))}"
        for name, values in (
            ("ports", rule.ports),
            ("schemes", rule.schemes),
            ("methods", rule.methods),
            ("paths", rule.paths),
        )
        if values is not None
    ]
    return f", {'; '.join(parts)}" if parts else ""


# --- regions: meets (some request in both) and contains (every request of one in the other) ---


def _meets(one: _Region, other: _Region) -> bool:
    return (
        _targets_meet(one, other)
        and _sets_meet(one.ports, other.ports)
        and _sets_meet(one.schemes, other.schemes)
        and _sets_meet(one.methods, other.methods)
        and _paths_meet(one.paths, other.paths)
    )


def _contains(outer: _Region, inner: _Region) -> bool:
    return (
        _target_contains(outer, inner)
        and _set_contains(outer.ports, inner.ports)
        and _set_contains(outer.schemes, inner.schemes)
        and _set_contains(outer.methods, inner.methods)
        and _paths_contain(outer.paths, inner.paths)
    )


def _targets_meet(one: _Region, other: _Region) -> bool:
    if "everything" in (one.kind, other.kind):
        return True
    if (one.kind == "network") != (other.kind == "network"):
        return False  # a name request matches only name rules, an address only IP/CIDR rules
    if one.network is not None and other.network is not None:
        return one.network.version == other.network.version and one.network.overlaps(other.network)
    return _host_contains(one.text, other.text) or _host_contains(other.text, one.text)


def _target_contains(outer: _Region, inner: _Region) -> bool:
    if outer.kind == "everything":
        return True
    if inner.kind == "everything" or (outer.kind == "network") != (inner.kind == "network"):
        return False
    if outer.network is not None and inner.network is not None:
        return outer.network.version == inner.network.version and _subnet(inner.network, outer.network)
    return _host_contains(outer.text, inner.text)


def _subnet(inner: IPNetwork, outer: IPNetwork) -> bool:
    if isinstance(inner, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return inner.subnet_of(outer)
    if isinstance(inner, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return inner.subnet_of(outer)
    return False


def _host_contains(outer: str, inner: str) -> bool:
    """Name patterns: `*.s` holds every name ending in `.s` and every `*.t` with t ending in `.s`
    or t == s; a name holds only itself."""
    if not outer.startswith("*."):
        return outer == inner
    return inner.endswith(outer[1:])


def _sets_meet[T](one: frozenset[T] | None, other: frozenset[T] | None) -> bool:
    return one is None or other is None or bool(one & other)


def _set_contains[T](outer: frozenset[T] | None, inner: frozenset[T] | None) -> bool:
    return outer is None or (inner is not None and inner <= outer)


def _paths_meet(one: tuple[str, ...] | None, other: tuple[str, ...] | None) -> bool:
    if one is None or other is None:
        return True
    return any(_path_patterns_meet(a, b) for a in one for b in other)


def _paths_contain(outer: tuple[str, ...] | None, inner: tuple[str, ...] | None) -> bool:
    if outer is None:
        return True
    if inner is None:
        return "/*" in outer or "*" in outer
    return all(any(_path_pattern_contains(cover, path) for cover in outer) for path in inner)


def _path_patterns_meet(one: str, other: str) -> bool:
    """`x*` is a prefix match, anything else exact (names.path_matches)."""
    one_prefix, other_prefix = one.endswith("*"), other.endswith("*")
    if one_prefix and other_prefix:
        return one[:-1].startswith(other[:-1]) or other[:-1].startswith(one[:-1])
    if one_prefix:
        return other.startswith(one[:-1])
    if other_prefix:
        return one.startswith(other[:-1])
    return one == other


def _path_pattern_contains(outer: str, inner: str) -> bool:
    if not outer.endswith("*"):
        return outer == inner
    return inner.removesuffix("*").startswith(outer[:-1])

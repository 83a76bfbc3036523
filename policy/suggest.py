"""A policy learned from what a workload did: the smallest policy that allows every request seen.

Rules:
1. Pure: the input is what was seen (`Request`s, the facts an audit record holds: host, port,
   scheme, and for an intercepted request its method and path), the output a policy document and
   the notes a reviewer needs; reading the audit is the caller's business.
2. Minimal: a rule allows a host only on the ports it was seen on; where requests were seen
   (the traffic was intercepted), only their methods and paths. Paths stay exact up to
   `exact_paths` distinct ones per host, then each becomes its first segment as a prefix
   (`/v1/*`). Exact names come first; a wildcard (`*.parent`) replaces exact names only when
   `wildcard_after` or more siblings under one parent of three or more labels were seen
   (`*.cdn.example.com` for CDN shards, never `*.example.com`), and follows the exact names.
   An IP literal becomes a /32 (or /128) CIDR rule on its ports. A name only looked up (DNS,
   port 0) that has no dot is a local name (the sandbox's own hostname, which the pip and git
   workload's tools looked up; a bare name tried before a search list): nothing connected to it,
   so it is a note, never a rule (a rule without ports would open the name on every port).
3. Never suggested: what the policy refuses whatever the rules say (malformed hosts, always-denied
   ranges such as loopback and metadata addresses: `ALWAYS_ENFORCED`); the caller passes such
   requests as `refused` and they are listed as notes.
4. The result is a valid policy (it passes `policy check`) and allows every request it was made
   from (`tests/policy/test_suggest.py` proves both for generated workloads).
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sandgate.policy.compiled import Request

EXACT_PATHS = 8
WILDCARD_AFTER = 5


@dataclass
class _Seen:
    ports: set[int] = field(default_factory=set)
    connections: bool = False  # seen without a method/path (pass-through, DNS, CONNECT)
    methods: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Suggestion:
    document: dict[str, Any]  # a sandgate policy document (defaultAction deny)
    notes: list[str]  # what a reviewer should know: refusals not suggested, wildcards made


def suggest_policy(
    seen: Iterable[Request],
    refused: Iterable[tuple[Request, str]] = (),
    exact_paths: int = EXACT_PATHS,
    wildcard_after: int = WILDCARD_AFTER,
) -> Suggestion:
    """The smallest policy (rule 2) that allows every request in `seen`."""
    hosts: dict[str, _Seen] = defaultdict(_Seen)
    local: set[str] = set()
    for request in seen:
        host = request.host.lower().rstrip(".")
        if _local_lookup(host, request):
            local.add(host)
            continue
        entry = hosts[host]
        if request.port:
            entry.ports.add(request.port)
        if request.method and request.path is not None:
            entry.methods.add(request.method.upper())
            entry.paths.add(request.path.partition("?")[0] or "/")
        else:
            entry.connections = True
    notes = [f"not suggested: {r.host}:{r.port} was refused as {why}" for r, why in refused]
    notes += [
        f"not suggested: {host} was only looked up (a local name, no dot)"
        for host in sorted(local - hosts.keys())
    ]
    names = {host: s for host, s in hosts.items() if _ip(host) is None}
    addresses = {host: s for host, s in hosts.items() if _ip(host) is not None}
    exact, wildcards = _group_names(names, wildcard_after, notes)
    rules = [rule for host in sorted(exact) for rule in _rules(host, names[host], exact_paths)]
    rules += [_wildcard_rule(parent, members) for parent, members in sorted(wildcards.items())]
    rules += [
        rule for host in sorted(addresses) for rule in _rules(_cidr(host), addresses[host], exact_paths)
    ]
    return Suggestion({"version": 1, "defaultAction": "deny", "egress": rules}, notes)


def _local_lookup(host: str, request: Request) -> bool:
    return not request.port and request.method is None and "." not in host and _ip(host) is None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _cidr(host: str) -> str:
    address = _ip(host)
    assert address is not None
    return f"{address}/{address.max_prefixlen}"


def _group_names(
    names: dict[str, _Seen], wildcard_after: int, notes: list[str]
) -> tuple[list[str], dict[str, list[_Seen]]]:
    """Exact names, and `*.parent` wildcards for parents with `wildcard_after`+ seen children."""
    children: dict[str, list[str]] = defaultdict(list)
    for host in names:
        parent = host.partition(".")[2]
        if parent.count(".") >= 2:  # *.cdn.example.com, never *.example.com: one site's names differ
            children[parent].append(host)
    wildcards: dict[str, list[_Seen]] = {}
    grouped: set[str] = set()
    for parent, members in children.items():
        if len(members) >= wildcard_after:
            wildcards[parent] = [names[member] for member in members]
            grouped.update(members)
            notes.append(f"*.{parent} stands for {len(members)} names seen: {', '.join(sorted(members))}")
    return [host for host in names if host not in grouped], wildcards


def _rules(target: str, seen: _Seen, exact_paths: int) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"action": "allow", "target": target}
    if seen.ports:
        base["ports"] = sorted(seen.ports)
    if not seen.methods or seen.connections:
        return [base]  # seen without an L7 view: the connection is what must be allowed
    paths = sorted(seen.paths)
    if len(paths) > exact_paths:
        paths = sorted({_prefix(path) for path in paths})
    return [{**base, "methods": sorted(seen.methods), "paths": paths}]


def _prefix(path: str) -> str:
    """`/v1/repos/x` -> `/v1/*`; `/` and one-segment paths stay as they are."""
    first, slash, _rest = path.lstrip("/").partition("/")
    return f"/{first}/*" if slash else path


def _wildcard_rule(parent: str, members: list[_Seen]) -> dict[str, Any]:
    ports = sorted({port for member in members for port in member.ports})
    rule: dict[str, Any] = {"action": "allow", "target": f"*.{parent}"}
    return {**rule, "ports": ports} if ports else rule

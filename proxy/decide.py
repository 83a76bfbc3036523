"""The one place where the proxy decides allow or deny, for every path into it.

Rules:
1. Every path in (transparent TLS by SNI, transparent plain HTTP by Host, explicit CONNECT,
   absolute-form HTTP, each HTTP/2 stream by :authority, WebSocket upgrades, DNS names, and the
   upstream address the proxy resolved) calls a function of this module; addons never compare
   hosts or read policy decisions themselves.
2. Identity comes first: every name a request claims (SNI, Host, :authority, CONNECT target)
   must be the same normalised name, else the request is refused with 421 before the policy is
   asked. The agreed name is what the policy judges and what the proxy dials. A port in Host or
   :authority (else the scheme's default) must be the port the connection was made to, the one
   the proxy dials and the policy judges (`claimed_port`), else it is a 421 too. Then the
   request's canonical identity (`sandgate.policy.request_identity`) is computed once; a target
   origins could read two ways is refused with 400 (`AMBIGUOUS`) before any decision.
3. The policy (sandgate.policy) is the matcher; this module only turns its `Decision` into a
   `Verdict` the proxy acts on: report-only denials pass but are recorded as "report".
4. No I/O here: resolution happens in the addons, which hand the address back to `check_upstream`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sandgate.policy import AMBIGUOUS_TARGET, Request, RequestIdentity

AuditAction = Literal["allow", "deny", "report"]

IDENTITY_MISMATCH = "identity-mismatch"
UNKNOWN_SANDBOX = "unknown-sandbox"


@dataclass(frozen=True)
class Verdict:
    action: AuditAction
    reason: str
    rule: str | None = None
    inspect: bool = False
    bindings: tuple[Any, ...] = field(default=())
    status: int = 403  # what a refused HTTP request is answered with

    @property
    def allowed(self) -> bool:
        return self.action != "deny"


def normalise_host(raw: str | None) -> str | None:
    """Lower-case name without port, brackets or trailing dot: the form every claim is compared in."""
    if not raw:
        return None
    host = raw.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host[1:]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".") or None


DEFAULT_PORTS = {"http": 80, "https": 443}


def claimed_port(raw: str | None, scheme: str) -> int | None:
    """The port a Host/:authority value names (the scheme's default without one); None if no
    claim, -1 if the port is not a number (which then matches no connection)."""
    if not raw:
        return None
    authority = raw.strip()
    if authority.startswith("["):
        _, _, rest = authority.partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif authority.count(":") == 1:
        port = authority.split(":", 1)[1]
    else:
        port = ""
    if not port:
        return DEFAULT_PORTS[scheme]
    return int(port) if port.isdigit() else -1


def agreed_name(*claims: str | None) -> tuple[str | None, bool]:
    """The one name every non-empty claim agrees on, and whether they all agreed."""
    names = {name for name in (normalise_host(claim) for claim in claims) if name}
    if len(names) > 1:
        return None, False
    return (names.pop() if names else None), True


MISMATCH = Verdict("deny", IDENTITY_MISMATCH, status=421)
AMBIGUOUS = Verdict("deny", AMBIGUOUS_TARGET, status=400)


def describe_claims(claims: dict[str, str | None]) -> str:
    """For the audit record's detail: which names disagreed."""
    return ", ".join(f"{key}={value}" for key, value in claims.items() if value)


def decide(policy: Any, host: str, port: int, scheme: Literal["http", "https"]) -> Verdict:
    """The policy's decision for a connection (a request's: `decide_request`)."""
    return _verdict(policy.decide(Request(host=host, port=port, scheme=scheme)))


def decide_request(policy: Any, identity: RequestIdentity) -> Verdict:
    """The policy's decision for a request, by its canonical identity."""
    return _verdict(policy.decide(identity))


def decide_name(sandbox: Any, name: str) -> Verdict:
    """May this sandbox resolve `name`? Yes if some port the policy mentions could be allowed:
    a name that no connection could use is not worth an answer (or an upstream query)."""
    verdict = None
    for port in sandbox.dns_ports:
        for scheme in ("https", "http"):
            verdict = decide(sandbox.policy, name, port, scheme)
            if verdict.allowed:
                return verdict
    assert verdict is not None
    return verdict


def check_upstream(policy: Any, address: str, port: int | None = None, scheme: str = "https") -> Verdict:
    """Whether the address the proxy resolved may be dialled (always-deny ranges, CIDR rules)."""
    request = Request(host=address, port=port, scheme=scheme) if port else None
    return _verdict(policy.check_address(address, request))


def _verdict(decision: Any) -> Verdict:
    action: AuditAction = "allow" if decision.action == "allow" else "deny"
    if action == "deny" and decision.report_only:
        action = "report"
    return Verdict(
        action=action,
        reason=decision.reason,
        rule=decision.rule,
        inspect=bool(decision.inspect),
        bindings=tuple(decision.bindings or ()),
        status=400 if decision.reason == AMBIGUOUS_TARGET else 403,
    )

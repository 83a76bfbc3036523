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
3. The policy (sandgate.policy) is the matcher; a `Verdict` is its `Decision` unchanged (a
   report-mode would-deny is an allow whose outcome is "report") plus the HTTP status a refusal
   is answered with. The audit record serialises that decision (`proxy/audit.py`).
4. No I/O here: resolution happens in the addons, which hand the address back to `check_upstream`.
5. A refused HTTP request is answered by `deny_response` (the verdict's status, reason and rule
   as JSON), whichever addon refused it: addons share refusals through this module, never
   through each other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from mitmproxy import http

from sandgate.policy import Decision, Outcome, Reason, Request, RequestIdentity


@dataclass(frozen=True, slots=True)
class Verdict:
    """The policy's `Decision` itself (what the audit record serialises), and what a refused HTTP
    request is answered with. Refusals the proxy makes on its own (names that disagree, an
    unresolvable name, a missing credential) are Decisions too: `refusal`."""

    decision: Decision
    status: int = 403

    @property
    def allowed(self) -> bool:
        return self.decision.allowed  # a report-mode decision is allowed, recorded as "report"

    @property
    def outcome(self) -> Outcome:
        return self.decision.outcome

    @property
    def reason(self) -> str:
        return self.decision.reason

    @property
    def rule(self) -> str | None:
        return self.decision.rule

    @property
    def inspect(self) -> bool:
        return self.decision.inspect

    @property
    def bindings(self) -> tuple[str, ...]:
        return self.decision.bindings

    def inspected(self) -> Verdict:
        """The same decision, intercepted rather than passed through."""
        return Verdict(replace(self.decision, inspect=True), self.status)


def refusal(reason: Reason, rule: str | None = None, status: int = 403) -> Verdict:
    """A refusal the proxy makes itself, after or instead of the policy's decision."""
    return Verdict(Decision("deny", reason, rule), status)


def deny_response(verdict: Verdict, host: str | None) -> http.Response:
    """The answer to a refused HTTP request, whichever addon refused it (rule 5)."""
    body = {"error": "egress denied", "host": host, "reason": verdict.reason, "rule": verdict.rule}
    return http.Response.make(
        verdict.status, json.dumps(body) + "\n", {"content-type": "application/json", "connection": "close"}
    )


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


MISMATCH = refusal(Reason.IDENTITY_MISMATCH, status=421)
AMBIGUOUS = refusal(Reason.AMBIGUOUS_TARGET, status=400)
GONE = refusal(Reason.UNKNOWN_SANDBOX)  # the sandbox's entry was dropped


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


def _verdict(decision: Decision) -> Verdict:
    return Verdict(decision, 400 if decision.reason == Reason.AMBIGUOUS_TARGET else 403)

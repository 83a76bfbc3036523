"""What a sandbox did, as the policy learner sees it: audit records -> `Request`s.

Rules: only decisions of the policy count (request, connection and DNS records; never security
events or policy changes). A request record is an intercepted request (method and path known);
a connection record of an intercepted connection adds nothing (its requests have records of
their own); a DNS record counts only for a name nothing connected to. Only a denial a policy
could have allowed (`LEARNABLE`) is learned from; any other (an explicit deny rule, an
always-denied address, the proxy's own refusals) is returned as refused, with its reason. A
token mint (the proxy calling a token endpoint for an `oauth2` binding) is the proxy's own
egress, not the sandbox's: it is never something to allow.
"""

from __future__ import annotations

from collections.abc import Iterable

from sandgate.lifecycle.audit.record import RecordJSON
from sandgate.policy import Reason, Request

SCHEME_PORT = {"http": 80, "https": 443}
# Denials a policy could have allowed: no rule matched, or a rule for the host but not this port,
# scheme, method or path, or an `ask` nobody answered. Every other denial (an explicit deny rule, a
# reviewer's refusal, always-denied addresses, the proxy's own refusals: identity, hellos...) stays.
LEARNABLE = frozenset({
    Reason.DEFAULT, Reason.PORT_NOT_ALLOWED, Reason.SCHEME_NOT_ALLOWED, Reason.METHOD_NOT_ALLOWED,
    Reason.PATH_NOT_ALLOWED, Reason.IP_LITERAL_NEEDS_CIDR_RULE, Reason.ASK,
    Reason.APPROVAL_TIMEOUT, Reason.APPROVAL_CLIENT_GONE, Reason.APPROVAL_QUEUE_FULL,
})  # fmt: skip
PROXY_EGRESS = frozenset({Reason.TOKEN_MINTED, Reason.TOKEN_MINT_FAILED})


def observed(records: Iterable[RecordJSON]) -> tuple[list[Request], list[tuple[Request, str]]]:
    """(what to allow, what was refused and must stay so) from one sandbox's records."""
    seen: list[Request] = []
    refused: list[tuple[Request, str]] = []
    dns_only: dict[str, Request] = {}
    for record in records:
        request = _request(record)
        if request is None:
            continue
        if record["decision"] == "deny" and record["reason"] not in LEARNABLE:
            refused.append((request, f"{record['reason']} ({record.get('rule') or 'always'})"))
        elif record["kind"] == "dns":
            dns_only.setdefault(request.host, request)
        else:
            seen.append(request)
    connected = {request.host for request in seen}
    seen += [request for host, request in dns_only.items() if host not in connected]
    return seen, refused


def _request(record: RecordJSON) -> Request | None:
    kind = record["kind"]
    host = record.get("host") or record.get("sni")
    if kind not in ("request", "connection", "dns") or not host or record["reason"] in PROXY_EGRESS:
        return None
    if kind == "connection" and record.get("inspect"):
        return None
    scheme = record.get("scheme") or "https"
    port = 0 if kind == "dns" else record.get("port") or SCHEME_PORT.get(scheme, 443)
    if kind == "request" and record.get("method"):
        return Request(host, port, scheme, record["method"], record.get("path") or "/")
    return Request(host, port, scheme)

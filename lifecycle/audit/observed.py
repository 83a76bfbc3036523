"""What a sandbox did, as the policy learner sees it: audit records -> `Request`s.

Rules: only decisions of the policy count (request, connection and DNS records; never security
events or policy changes). A request record is an intercepted request (method and path known);
a connection record of an intercepted connection adds nothing (its requests have records of
their own); a DNS record counts only for a name nothing connected to. A refusal the policy
makes whatever the rules say (`ALWAYS_ENFORCED`) or an explicit deny rule is not something to
allow: it is returned as refused, with its reason, for the reviewer.
"""

from __future__ import annotations

from collections.abc import Iterable

from sandgate.lifecycle.audit.record import RecordJSON
from sandgate.policy import ALWAYS_ENFORCED, Reason, Request

SCHEME_PORT = {"http": 80, "https": 443}


def observed(records: Iterable[RecordJSON]) -> tuple[list[Request], list[tuple[Request, str]]]:
    """(what to allow, what was refused and must stay so) from one sandbox's records."""
    seen: list[Request] = []
    refused: list[tuple[Request, str]] = []
    dns_only: dict[str, Request] = {}
    for record in records:
        request = _request(record)
        if request is None:
            continue
        explicit_deny = record["decision"] == "deny" and record["reason"] == Reason.RULE
        if record["reason"] in ALWAYS_ENFORCED or explicit_deny:
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
    if kind not in ("request", "connection", "dns") or not host:
        return None
    if kind == "connection" and record.get("inspect"):
        return None
    scheme = record.get("scheme") or "https"
    port = 0 if kind == "dns" else record.get("port") or SCHEME_PORT.get(scheme, 443)
    if kind == "request" and record.get("method"):
        return Request(host, port, scheme, record["method"], record.get("path") or "/")
    return Request(host, port, scheme)

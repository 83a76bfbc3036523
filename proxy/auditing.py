"""Turning decisions into audit records and metrics.

Rules: a record is the verdict's policy `Decision` serialised (`AuditRecord.of`: a report-mode
decision is recorded as "report") plus the facts of the request. Connection-level decisions are
recorded when they are made (`record_decision`); a request is recorded once, when it ends
(`AuditAddon.response` / `.error`), from the `RequestState` the enforcement addon attached, so
bytes, status and duration are known. Method and path are the request's canonical identity,
taken before injection (a placeholder substituted into the path never shows); the writer
(`AuditLog`) redacts secrets and queries from every free-text field; nothing else from the
request body or headers is logged.
A passed-through TLS connection has no requests to record, so when it closes it gets a second
`connection` record (`event: "closed"`, id `<decision id>-closed`) with its bytes (from the
kernel, `tcpinfo`) and duration; the decision record written at the decision stays the one
that counts, so a connection that never closes (or a proxy that dies) still has its record.
"""

from __future__ import annotations

import time
from typing import Literal

from mitmproxy import connection, http

from sandgate.policy import Decision, Reason
from sandgate.proxy.contract.audit import AuditRecord, utc_timestamp
from sandgate.proxy.decide import Verdict
from sandgate.proxy.state import FLOW_KEY, ConnState, ProxyState, RequestState, Sandbox

CLOSED = "closed"  # `event` of the record that closes a pass-through connection
REVOKED = "revoked"  # `event` of the record of a connection a policy change closed


def addr(address: tuple[str, int] | None) -> str | None:
    if not address:
        return None
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def record_decision(
    state: ProxyState,
    kind: Literal["connection", "request", "dns"],
    sandbox: Sandbox,
    verdict: Verdict,
    client: tuple[str, int] | None,
    **facts: object,
) -> AuditRecord:
    """One record for a decision made now (connection and DNS level, and refused requests)."""
    state.metrics.decision(kind, verdict.outcome, verdict.reason)
    record = AuditRecord.of(kind, sandbox.id, addr(client) or "-", verdict.decision, **facts)
    state.audit.write(record)
    return record


def security_event(
    state: ProxyState,
    sandbox_id: str,
    client: tuple[str, int] | None,
    event: Reason,
    detail: str,
    **facts: object,
) -> None:
    state.metrics.security_events[event] += 1
    refused = Decision("deny", event, detail=detail)
    state.audit.write(
        AuditRecord.of("security_event", sandbox_id, addr(client) or "-", refused, event=event, **facts)
    )


class AuditAddon:
    """Writes the one record of every request when it ends, with status, bytes and duration, and
    the closing record of every pass-through connection; it runs last, so it also drops the
    connection's state."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state

    def client_disconnected(self, client: connection.Client) -> None:
        conn = self.state.connections.pop(client.id, None)
        if conn is not None and conn.passthrough and conn.decision_record is not None:
            self.state.audit.write(closing_record(conn, conn.decision_record, client))

    def response(self, flow: http.HTTPFlow) -> None:
        self._record(flow, status=flow.response.status_code if flow.response else None)

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.error and not flow.response:
            self.state.metrics.upstream_errors[_error_class(flow.error.msg)] += 1
        self._record(flow, status=flow.response.status_code if flow.response else None)

    def _record(self, flow: http.HTTPFlow, status: int | None) -> None:
        request_state: RequestState | None = flow.metadata.pop(FLOW_KEY, None)
        if request_state is None:  # not a request the enforcement addon saw (e.g. CONNECT)
            return
        verdict = request_state.verdict
        duration = time.monotonic() - request_state.started
        if verdict.allowed:
            self.state.metrics.latency(duration)
        self.state.metrics.decision("request", verdict.outcome, verdict.reason)
        request = flow.request
        identity = request_state.identity  # None only if refused before it was computed: untouched
        server = flow.server_conn
        detail = request_state.detail
        if flow.error and detail is None:
            detail = flow.error.msg  # may quote upstream bytes: the writer redacts it
        self.state.audit.write(
            AuditRecord.of(
                "request",
                request_state.sandbox.id,
                addr(flow.client_conn.peername) or "-",
                verdict.decision,
                upstream=addr(server.peername) if server and server.peername else None,
                sni=flow.client_conn.sni,
                scheme="https" if request.scheme == "https" else "http",
                method=identity.method if identity else request.method,
                host=request_state.name,
                port=request.port,
                path=identity.target if identity else request.path,
                inspect=True,
                binding=",".join(request_state.bindings) or None,
                status=status,
                bytes_in=request_state.bytes_in or _size(flow.response),
                bytes_out=request_state.bytes_out or _size(request),
                duration_ms=round(duration * 1000, 3),
                detail=detail,
            )
        )


def closing_record(conn: ConnState, decision: AuditRecord, client: connection.Client) -> AuditRecord:
    counted = conn.counters.read_and_close() if conn.counters else None
    bytes_in, bytes_out = counted or (0, 0)
    started, ended = client.timestamp_start, client.timestamp_end
    duration = round((ended - started) * 1000, 3) if started and ended else None
    return closed(decision, bytes_in, bytes_out, duration)


def closed(decision: AuditRecord, bytes_in: int, bytes_out: int, duration_ms: float | None) -> AuditRecord:
    """The record that closes a pass-through connection (mitmproxy's relay or the front door's splice)."""
    return decision.model_copy(
        update={
            "id": f"{decision.id}-{CLOSED}",
            "ts": utc_timestamp(),
            "event": CLOSED,
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
            "duration_ms": duration_ms,
        }
    )


def _size(message: http.Message | None) -> int:
    if message is None or message.raw_content is None:
        return 0
    return len(message.raw_content)


def _error_class(message: str) -> str:
    lowered = message.lower()
    for needle, name in (
        ("refused", "connection-refused"),
        ("timed out", "timeout"),
        ("certificate", "tls"),
        ("tls", "tls"),
        ("reset", "reset"),
        ("killed", "killed"),
    ):
        if needle in lowered:
            return name
    return "other"

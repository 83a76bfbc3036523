"""Turning decisions into audit records and metrics.

Rules: a record is the verdict's policy `Decision` serialised (`AuditRecord.of`: a report-mode
decision is recorded as "report") plus the facts of the request. Connection-level decisions are
recorded when they are made (`record_decision`); a request is recorded when it ends
(`AuditAddon.response` / `.error`), from the `RequestState` the enforcement addon attached, so
bytes, status and duration are known. A request that goes upstream is also recorded before
its first byte leaves (write-ahead, proxy/audit.py rule 5): the audit addon runs last, so its
`requestheaders` (or, for a body read whole first, `request`) sees the decision, the identity
and the bindings injected, writes them with `event: "incomplete"` under the id the whole record
will have, and the request goes on only once the line is in the file. If it cannot be written,
the request is answered 503 with why, and nothing is forwarded.
Method and path are the request's canonical identity, taken before injection (a placeholder
substituted into the path never shows); the writer (`AuditLog`) redacts secrets and queries
from every free-text field; nothing else from the request body or headers is logged.
A passed-through TLS connection has no requests to record, so when it closes it gets a second
`connection` record (`event: "closed"`, id `<decision id>-closed`) with its bytes (from the
kernel, `tcpinfo`) and duration; the decision record written at the decision stays the one
that counts, so a connection that never closes (or a proxy that dies) still has its record.
"""

from __future__ import annotations

import json
import time
from typing import Literal

from mitmproxy import connection, http

from sandgate.policy import Decision, Reason
from sandgate.proxy.audit import AuditUnwritable
from sandgate.proxy.contract.audit import INCOMPLETE, AuditRecord, utc_timestamp
from sandgate.proxy.decide import Verdict, refusal
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
    if kind != "dns":
        facts["process"] = state.processes.of(client)
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


def mint_record(
    state: ProxyState,
    sandbox_id: str,
    client: tuple[str, int] | None,
    binding: str,
    endpoint: str,
    detail: str,
    failed: bool,
) -> None:
    """The record of one call to a token endpoint (control-plane egress on a sandbox's behalf):
    `binding` and the token generation, or why minting failed, in `detail`."""
    host, _, port = endpoint.rpartition(":")
    outcome = Decision("deny", Reason.TOKEN_MINT_FAILED) if failed else Decision("allow", Reason.TOKEN_MINTED)
    facts = {"method": "POST", "host": host, "port": int(port), "scheme": "https", "binding": binding}
    state.audit.write(
        AuditRecord.of(
            "request", sandbox_id, addr(client) or "-", outcome, event="token-mint", detail=detail, **facts
        )
    )


class AuditAddon:
    """Writes the write-ahead line of every request that goes upstream before it goes, the one
    record of every request when it ends, with status, bytes and duration, and the closing
    record of every pass-through connection; it runs last, so it also drops the connection's
    state."""

    def __init__(self, state: ProxyState) -> None:
        self.state = state

    def client_disconnected(self, client: connection.Client) -> None:
        conn = self.state.connections.pop(client.id, None)
        if conn is not None and conn.passthrough and conn.decision_record is not None:
            record = closing_record(conn, conn.decision_record, client)
            self.state.processes.write_when_known(client.peername, record, self.state.audit.write)
            if sandbox := self.state.table.get(conn.sandbox_address):
                self.state.spend_budgets(sandbox, record.rule, record.host, record.bytes_in, record.bytes_out)
                # mitmproxy's relay was not throttled: its bytes go into the byte buckets now

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.request.stream:  # the head goes upstream when this hook returns
            await self._write_ahead(flow)

    async def request(self, flow: http.HTTPFlow) -> None:
        await self._write_ahead(flow)  # a body read whole first goes with its head, after this hook

    async def _write_ahead(self, flow: http.HTTPFlow) -> None:
        request_state: RequestState | None = flow.metadata.get(FLOW_KEY)
        if request_state is None or request_state.written_ahead or flow.response is not None:
            return  # not ours, already written, or answered by the proxy: nothing goes upstream
        await self.state.processes.settled(flow.client_conn.peername)
        try:
            await self.state.audit.write_ahead(self._request_record(flow, request_state, None, INCOMPLETE))
        except AuditUnwritable as exc:
            request_state.verdict = refusal(Reason.AUDIT_UNWRITABLE, status=503)
            request_state.detail = str(exc)
            request_state.bindings.clear()  # injected into a request that is never sent
            flow.request.stream = False  # mitmproxy streams no request it answers itself
            flow.response = unwritable_response(str(exc))
            return
        request_state.written_ahead = True

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
        if verdict.allowed:
            self.state.metrics.latency(time.monotonic() - request_state.started)
        self.state.metrics.decision("request", verdict.outcome, verdict.reason)
        record = self._request_record(flow, request_state, status)
        self.state.processes.write_when_known(flow.client_conn.peername, record, self.state.audit.write)
        if verdict.allowed:
            self.state.spend_budgets(
                request_state.sandbox, record.rule, record.host, record.bytes_in, record.bytes_out
            )

    def _request_record(
        self, flow: http.HTTPFlow, request_state: RequestState, status: int | None, event: str | None = None
    ) -> AuditRecord:
        request = flow.request
        identity = request_state.identity  # None only if refused before it was computed: untouched
        server = flow.server_conn
        detail = request_state.detail
        if flow.error and detail is None:
            detail = flow.error.msg  # may quote upstream bytes: the writer redacts it
            if request_state.via:
                detail = f"through upstream proxy {request_state.via}: {detail}"
        ended = event is None
        return AuditRecord.of(
            "request",
            request_state.sandbox.id,
            addr(flow.client_conn.peername) or "-",
            request_state.verdict.decision,
            id=request_state.record_id,
            upstream=_dialled(server, request_state.via),
            via=request_state.via,
            sni=flow.client_conn.sni,
            scheme="https" if request.scheme == "https" else "http",
            method=identity.method if identity else request.method,
            host=request_state.name,
            port=request.port,
            path=identity.target if identity else request.path,
            inspect=True,
            binding=",".join(request_state.bindings) or None,
            status=status,
            bytes_in=(request_state.bytes_in or _size(flow.response)) if ended else 0,
            bytes_out=(request_state.bytes_out or _size(request)) if ended else 0,
            duration_ms=round((time.monotonic() - request_state.started) * 1000, 3) if ended else None,
            event=event,
            detail=detail,
            process=self.state.processes.of(flow.client_conn.peername),
        )


def _dialled(server: connection.Server | None, via: str | None) -> str | None:
    """What the proxy dialled for a request: the origin, or the upstream proxy it went through."""
    if via is not None:
        return via.removeprefix("http://")
    return addr(server.peername) if server and server.peername else None


def unwritable_response(why: str) -> http.Response:
    """The answer to a request refused because its audit line could not be written."""
    body = {
        "error": "egress refused: the proxy forwards nothing it cannot audit",
        "reason": Reason.AUDIT_UNWRITABLE,
    }
    return http.Response.make(
        503,
        json.dumps({**body, "detail": why}) + "\n",
        {"content-type": "application/json", "connection": "close", "retry-after": "5"},
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

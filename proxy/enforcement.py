"""Enforcement: every way into the proxy asks `decide` and acts on the verdict.

Rules:
1. Connection level first: explicit CONNECT (`http_connect`) and TLS ClientHello
   (`tls_clienthello`, by SNI, else the DNS-attributed name of the original destination, else
   the address itself). A name credited from DNS (no SNI) is never passed through: such a
   connection is intercepted, so each request's Host is judged. A denied TLS connection is
   ignored and then killed in `server_connect`, so the client never sees a certificate; a
   pass-through verdict (`inspect` False) ignores the connection, so the bytes are relayed
   untouched (and counted by the kernel, `tcpinfo`).
2. Request level for everything decrypted or plain (`requestheaders`: every HTTP/1 request,
   every HTTP/2 stream, WebSocket upgrades), re-evaluated against the current table entry.
   A refused request gets a 403 (421 for disagreeing names, or a Host/:authority port that is not
   the connection's) JSON answer and never reaches upstream; the port judged is the one dialled.
   Once the names agree, the request's canonical identity is computed once
   (`sandgate.policy.request_identity`) from the target as received; the policy judges it, the
   injection and the audit record use it. An ambiguous target (an HTTP/1 absolute-form target
   naming another authority than the connection's, dot segments, double encoding, ...) is a 400.
3. Before any name in a ClientHello is believed, the hello itself is checked (`clienthello`): one
   a conforming server must reject (an extension twice, a server_name list that is not exactly
   one valid host name) is refused as `malformed-clienthello`, and one that does not parse at
   all is recorded so (mitmproxy closes it; `tls_failed_client` says why); one carrying ECH is
   refused (`ech-refused`), intercepted or passed through as `ProxyConfig.ech` says, on
   pass-through and intercepted hosts alike. Both paths with a ClientHello (mitmproxy's hook, on
   the transparent and the explicit CONNECT listener, and the front door) call
   `judge_clienthello`.
4. The proxy dials only what it resolved itself for the agreed name, after `check_upstream`:
   the request's `host` is set to that name (so upstream connections are keyed by it, and TLS
   upstream uses it as SNI) and `server_connect` pins the socket to the checked address.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from mitmproxy import connection, http, tls
from mitmproxy.proxy import mode_specs, server_hooks

from sandgate.policy import AmbiguousTarget, Decision, Reason, RequestIdentity, request_identity
from sandgate.proxy.approvals import Held
from sandgate.proxy.auditing import addr, record_decision, security_event
from sandgate.proxy.budgets import OverBudget
from sandgate.proxy.clienthello import EchMode, encrypted_hello, hello_fault
from sandgate.proxy.contract.config import UpstreamProxy
from sandgate.proxy.decide import (
    AMBIGUOUS,
    GONE,
    MISMATCH,
    Verdict,
    agreed_name,
    check_upstream,
    claimed_port,
    decide,
    decide_request,
    deny_response,
    describe_claims,
    refusal,
)
from sandgate.proxy.resolver import ResolveError, is_ip_literal
from sandgate.proxy.revocation import allowed_over
from sandgate.proxy.state import FLOW_KEY, ConnState, ProxyState, RequestState, Sandbox
from sandgate.proxy.tcpinfo import KernelCounters
from sandgate.proxy.upstreamproxy import UpstreamProxyError

log = logging.getLogger(__name__)

UNPARSEABLE_HELLO = "Cannot parse ClientHello"  # mitmproxy's error for bytes that are no ClientHello
CREDITED_INTERCEPTED = "no SNI: name credited from this sandbox's DNS answers; intercepted"


@dataclass(frozen=True)
class ClientHelloVerdict:
    verdict: Verdict
    name: str | None  # the connection-level name: SNI, else DNS-attributed, else the address
    detail: str | None
    upstream: str | None  # pass-through: the checked address to dial
    via: UpstreamProxy | None = None  # pass-through: the upstream proxy it is dialled through


class EnforcementAddon:
    def __init__(self, state: ProxyState, ech: EchMode = "refuse") -> None:
        self.state = state
        self.ech = ech  # what an ECH-carrying ClientHello means (clienthello rule 2)

    # ------------------------------------------------------------------ connection level

    def client_disconnected(self, client: connection.Client) -> None:
        self.state.approvals.client_left(client.id)  # its held requests end now, recorded (`_ask`)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        conn, sandbox = self._lookup(flow.client_conn)
        host = (flow.request.host or "").lower().rstrip(".")
        verdict = decide(sandbox.policy, host, flow.request.port, "https") if sandbox else GONE
        facts: dict[str, object] = {"method": "CONNECT", "host": host, "port": flow.request.port}
        if sandbox and verdict.allowed and (via := self._via(sandbox, host)[0]):
            facts["via"] = via.url
        record = (
            record_decision(self.state, "connection", sandbox, verdict, flow.client_conn.peername, **facts)
            if sandbox
            else None
        )
        if not verdict.allowed or conn is None:
            flow.response = deny_response(verdict, host)
            return
        conn.connect_host = host
        conn.connect_record = record
        allowed_over(self.state, conn, sandbox, (host, flow.request.port, "https"))  # type: ignore[arg-type]

    async def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        client = data.context.client
        conn, sandbox = self._lookup(client)
        if conn is None or sandbox is None:
            data.ignore_connection = True
            if conn:
                conn.denied = True
            return
        server_address = data.context.server.address
        assert server_address is not None
        hello = data.client_hello
        judged = await self.judge_clienthello(conn, sandbox, hello, server_address)
        self.settle_clienthello(conn, sandbox, client.peername, hello.sni, server_address[1], judged)
        if not judged.verdict.allowed:
            data.ignore_connection = True  # then killed in server_connect: no certificate is ever shown
        elif not judged.verdict.inspect:
            conn.counters = KernelCounters.of(client)
            data.ignore_connection = True

    def tls_failed_client(self, data: tls.TlsData) -> None:
        """A ClientHello mitmproxy cannot parse at all: nothing was dialled, but say why (rule 3)."""
        if not (data.conn.error or "").startswith(UNPARSEABLE_HELLO):
            return  # other handshake failures (a client that distrusts the CA) are the client's
        conn, sandbox = self._lookup(data.context.client)
        if conn is None or sandbox is None:
            return
        conn.denied = True
        server = data.context.server.address
        record_decision(
            self.state,
            "connection",
            sandbox,
            refusal(Reason.MALFORMED_CLIENTHELLO),
            data.context.client.peername,
            host=conn.connect_host,
            port=server[1] if server else None,
            scheme="https",
            detail="the ClientHello does not parse",
        )

    async def judge_clienthello(
        self, conn: ConnState, sandbox: Sandbox, hello: tls.ClientHello, server_address: tuple[str, int]
    ) -> ClientHelloVerdict:
        """The connection-level decision on a ClientHello (for mitmproxy's hook and the front door
        alike); a pass-through verdict comes with the checked upstream address, pinned in `conn`."""
        port, sni, extensions = server_address[1], hello.sni, hello.extensions
        if fault := hello_fault(extensions):
            return ClientHelloVerdict(refusal(Reason.MALFORMED_CLIENTHELLO), sni, fault, None)
        name, agreed = agreed_name(sni, conn.connect_host)
        if not agreed:
            verdict, detail = MISMATCH, describe_claims({"sni": sni, "connect": conn.connect_host})
        else:
            credited = name is None
            name = name or await self._attributed(conn, server_address[0])
            credited = credited and not is_ip_literal(name)
            verdict, detail = decide(sandbox.policy, name, port, "https"), None
            if credited and verdict.allowed and not verdict.inspect:
                # The name is only DNS's guess, not the client's claim: pass-through would relay
                # whatever is inside unchecked, so intercept and judge every request's Host.
                verdict, detail = verdict.inspected(), CREDITED_INTERCEPTED
            verdict, detail = self._judge_ech(extensions, verdict, detail)
        upstream = None
        if verdict.allowed and not verdict.inspect and (failure := self.state.audit.failure):
            # Relayed bytes have no write-ahead line of their own (an intercepted connection's
            # requests do, and are refused one by one with why): fail closed.
            verdict, detail = refusal(Reason.AUDIT_UNWRITABLE), failure
        if verdict.allowed and not verdict.inspect and (over := self._bytes_spent(sandbox, verdict, name)):
            verdict, detail = refusal(Reason.BUDGET, verdict.rule), over.detail
        if verdict.allowed and not verdict.inspect:
            verdict, upstream = await self._pin(conn, sandbox, name or "", port, "https", verdict)
        via = None
        if verdict.allowed and not verdict.inspect:
            via, unusable = self._via(sandbox, name or "")
            if unusable is not None:
                verdict, detail, upstream = unusable, unusable.decision.detail, None
        return ClientHelloVerdict(verdict, name, detail, upstream, via)

    def _judge_ech(
        self, extensions: list[tuple[int, bytes]], verdict: Verdict, detail: str | None
    ) -> tuple[Verdict, str | None]:
        """An allowed hello that carries ECH: refused, intercepted or passed as `self.ech` says."""
        extension = encrypted_hello(extensions)
        if extension is None or not verdict.allowed:
            return verdict, detail
        if self.ech == "refuse":
            why = f"{extension}: the SNI is only the outer name, not the destination (ech=refuse)"
            return refusal(Reason.ECH_REFUSED, verdict.rule), why
        if self.ech == "intercept" or verdict.inspect:
            verdict, note = verdict.inspected(), f"{extension}: intercepted, the proxy's TLS takes no ECH"
        else:
            note = f"{extension}: passed through, judged by the outer name"
        return verdict, "; ".join(filter(None, (detail, f"{note} (ech={self.ech})")))

    def settle_clienthello(
        self,
        conn: ConnState,
        sandbox: Sandbox,
        client: tuple[str, int],
        sni: str | None,
        port: int,
        judged: ClientHelloVerdict,
    ) -> None:
        """Record the decision (a CONNECT record already written stands, unless the hello adds
        something to say, as an ECH note) and mark `conn` denied or pass-through (then
        `conn.decision_record` is what its closing record repeats)."""
        verdict, name = judged.verdict, judged.name
        dialled = addr((judged.upstream, port)) if judged.upstream else None
        if judged.via is not None and dialled is not None:
            dialled = addr(judged.via.address)  # what the proxy dials; the upstream resolves the name
        stands = name == conn.connect_host and verdict.allowed and judged.detail is None
        record = conn.connect_record if stands else None
        if record is None:
            record = record_decision(
                self.state,
                "connection",
                sandbox,
                verdict,
                client,
                sni=sni,
                host=name,
                port=port,
                scheme="https",
                upstream=dialled,
                via=judged.via.url if judged.via else None,
                detail=judged.detail,
            )
        else:  # the CONNECT record stands; the closing record also says what TLS then showed
            via = judged.via.url if judged.via else None
            update = {"sni": sni, "upstream": dialled, "scheme": "https", "via": via}
            record = record.model_copy(update=update)
        conn.name = name
        if judged.via is not None:
            conn.via = judged.via
        if not verdict.allowed:
            conn.denied = True
            return
        if not verdict.inspect:
            conn.passthrough = True
            conn.decision_record = record
        if name:
            allowed_over(self.state, conn, sandbox, (name, port, "https"))

    async def _attributed(self, conn: ConnState, destination: str) -> str:
        """A connection without a name: the name this sandbox resolved to that address, else the address."""
        if is_ip_literal(destination):
            return await self.state.names.lookup(conn.sandbox_address, destination) or destination
        return destination

    # ------------------------------------------------------------------ request level

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        conn, sandbox = self._lookup(flow.client_conn)
        if conn is None or sandbox is None:
            flow.response = deny_response(GONE, flow.request.host_header)
            return
        request = flow.request
        claims = self._claims(flow, conn)
        name, agreed = agreed_name(*claims.values())
        if not agreed:
            self._refuse(flow, sandbox, MISMATCH, claims.get("host") or "", describe_claims(claims))
            return
        name = name or await self._attributed(conn, request.host)
        scheme: Literal["http", "https"] = "https" if request.scheme == "https" else "http"
        claimed = claimed_port(request.host_header, scheme)
        if claimed is not None and claimed != request.port:  # the port is part of the identity
            detail = f"host={request.host_header}, connection port={request.port}"
            self._refuse(flow, sandbox, MISMATCH, name, detail)
            return
        absolute = _absolute_authority(request)
        try:
            identity = request_identity(scheme, name, request.port, request.method, request.path, absolute)
        except AmbiguousTarget as exc:
            self._refuse(flow, sandbox, AMBIGUOUS, name, str(exc))
            return
        if absolute is not None:  # it names this connection: send it in origin-form, as origins expect
            request.headers.setdefault("Host", absolute)
            request.authority = ""
        verdict = decide_request(sandbox.policy, identity)
        if verdict.reason == Reason.ASK:
            answered = await self._ask(flow, sandbox, name, identity, verdict)
            if answered is None:
                return  # its client left while it was held: recorded, answered with nothing sent
            verdict = answered
        if verdict.allowed:
            verdict, _upstream = await self._pin(conn, sandbox, name, request.port, scheme, verdict)
        via, failure = self._via(sandbox, name) if verdict.allowed else (None, None)
        if failure is not None:
            self._refuse(flow, sandbox, failure, name, failure.decision.detail, identity)
            flow.response = deny_response(failure, name, failure.decision.detail)
            return
        if not verdict.allowed:
            self._refuse(flow, sandbox, verdict, name, None, identity)
            return
        if self._over_budget(flow, sandbox, verdict, name, identity):
            return
        if refusal := allowed_over(self.state, conn, sandbox, (name, request.port, scheme)):
            self._refuse(flow, sandbox, refusal, name, "the policy changed while deciding", identity)
            return
        request.data.host = name  # dial by the verified name, never by a client-chosen address
        if not conn.tunnelled:  # an explicit tunnel through an upstream goes on through it
            conn.via = via
            flow.server_conn.via = ("http", via.address) if via else None
        flow.metadata[FLOW_KEY] = RequestState(sandbox, verdict, name, identity, via=via.url if via else None)

    async def _ask(
        self, flow: http.HTTPFlow, sandbox: Sandbox, name: str, identity: RequestIdentity, verdict: Verdict
    ) -> Verdict | None:
        """Hold the request for a reviewer (proxy/approvals.py); the verdict it ends with, or None
        if its client left while it was held: then the request is recorded here, at once, since
        mitmproxy may never end a flow whose client is gone."""
        request = flow.request

        def announce(held: Held) -> None:
            detail = f"approval {held.id} waits for a reviewer (sandgate approvals allow|deny {held.id})"
            facts = {"host": name, "port": request.port, "method": request.method, "path": request.path}
            security_event(self.state, sandbox.id, flow.client_conn.peername, Reason.ASK, detail, **facts)

        timeout = sandbox.policy.policy.askTimeout
        decision = await self.state.approvals.ask(
            sandbox.id, flow.client_conn.id, identity, verdict.decision, timeout, announce
        )
        if decision.reason != Reason.APPROVAL_CLIENT_GONE:
            return Verdict(decision)
        gone = Verdict(decision)
        facts = {"scheme": identity.scheme, "method": identity.method, "host": name, "port": request.port}
        record_decision(self.state, "request", sandbox, gone, flow.client_conn.peername,
                        path=identity.target, inspect=True, sni=flow.client_conn.sni, **facts)  # fmt: skip
        flow.response = deny_response(gone, name)  # nothing goes upstream; no record follows (no FLOW_KEY)
        return None

    def _claims(self, flow: http.HTTPFlow, conn: ConnState) -> dict[str, str | None]:
        """Every name this request claims to be for; they must all agree."""
        client = flow.client_conn
        absolute_form = isinstance(client.proxy_mode, mode_specs.RegularMode) and not conn.connect_host
        return {
            "sni": client.sni if client.tls else None,
            "host": flow.request.host_header,  # Host, or :authority for HTTP/2
            "connect": conn.connect_host,
            "url": flow.request.host if absolute_form else None,
        }

    def _refuse(
        self,
        flow: http.HTTPFlow,
        sandbox: Sandbox,
        verdict: Verdict,
        name: str,
        detail: str | None,
        identity: RequestIdentity | None = None,
    ) -> None:
        flow.metadata[FLOW_KEY] = RequestState(sandbox, verdict, name, identity, detail=detail)
        flow.response = deny_response(verdict, name)

    async def _pin(
        self, conn: ConnState, sandbox: Sandbox, name: str, port: int, scheme: str, verdict: Verdict
    ) -> tuple[Verdict, str | None]:
        """Resolve `name` ourselves and keep the first address the policy lets us dial."""
        if is_ip_literal(name):
            candidates = [name.strip("[]")]
        else:
            try:
                candidates = await self.state.resolver.addresses(name)
            except ResolveError as exc:
                log.info("%s", exc)
                return refusal(Reason.UNRESOLVED, verdict.rule, status=502), None
        refused: Verdict | None = None
        for candidate in candidates:
            address_verdict = check_upstream(sandbox.policy, candidate, port, scheme)
            if address_verdict.allowed:
                conn.pins[name] = candidate
                return verdict, candidate
            refused = refused or address_verdict
        assert refused is not None
        return refused, None

    def _over_budget(
        self, flow: http.HTTPFlow, sandbox: Sandbox, verdict: Verdict, name: str, identity: RequestIdentity
    ) -> bool:
        """Refuse an allowed request its budget has no room for: 429 (proxy/budgets.py)."""
        subject = sandbox.budget_subject(verdict.rule, name)
        if subject is None:
            return False
        over = self.state.budgets.admit(subject)
        outcome = "allowed" if over is None else "over-reported" if sandbox.reporting else "refused"
        self.state.metrics.budgeted[(sandbox.id, outcome)] += 1
        if over is None or sandbox.reporting:
            return False
        spent = refusal(Reason.BUDGET, verdict.rule, status=429)
        self._refuse(flow, sandbox, spent, name, over.detail, identity)
        assert flow.response is not None
        flow.response = deny_response(spent, name, over.detail)
        if over.retry_after is not None:
            flow.response.headers["retry-after"] = str(over.retry_after)
        del flow.response.headers["connection"]  # a client that waits may go on over this one
        return True

    def _bytes_spent(self, sandbox: Sandbox, verdict: Verdict, name: str | None) -> OverBudget | None:
        """A new pass-through connection's budgets: bytes left, each way (proxy/budgets.py rule 1)."""
        subject = sandbox.budget_subject(verdict.rule, name)
        if subject is None or sandbox.reporting:
            return None
        return self.state.budgets.admit(subject, request=False)

    def _via(self, sandbox: Sandbox, name: str) -> tuple[UpstreamProxy | None, Verdict | None]:
        """The upstream proxy an allowed destination leaves through, or the refusal when that
        upstream cannot be used (its login is not in the vault): never a direct dial instead."""
        proxies = self.state.upstream_proxies
        via = proxies.choose(sandbox.entry, name)
        if via is None:
            return None, None
        try:
            proxies.connect_headers(via, sandbox.entry)
        except UpstreamProxyError as exc:
            return via, Verdict(Decision("deny", Reason.UPSTREAM_ERROR, detail=str(exc)), 502)
        return via, None

    # ------------------------------------------------------------------ upstream

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        conn = self.state.connections.get(data.client.id)
        address = data.server.address
        if conn is None or conn.denied or address is None:
            data.server.error = "egress denied"
            return
        if conn.via is not None:  # only the upstream proxy is dialled (upstreamproxy.py rule 2)
            if address != conn.via.address:
                data.server.error = (
                    f"egress denied: {conn.name or address[0]} leaves through upstream proxy "
                    f"{conn.via.url}, which this path cannot dial through (splice_passthrough off)"
                )
            return
        name = conn.name if conn.passthrough else address[0]
        pinned = conn.pins.get(name or "")
        if pinned is None:  # every allowed path pins before connecting; anything else fails closed
            data.server.error = f"egress denied: no checked address for {name}"
            return
        conn.restore[data.server.id] = address
        data.server.address = (pinned, address[1])

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Put the name back, so later requests for the same name reuse this connection."""
        conn = self.state.connections.get(data.client.id)
        if conn and (original := conn.restore.pop(data.server.id, None)):
            # mitmproxy guards `address` on open connections because it names the socket's peer;
            # `peername` keeps the dialled address, and the name is what connection reuse matches.
            data.server.__dict__["address"] = original

    def server_connect_error(self, data: server_hooks.ServerConnectionHookData) -> None:
        conn = self.state.connections.get(data.client.id)
        if conn:
            conn.restore.pop(data.server.id, None)

    # ------------------------------------------------------------------ helpers

    def _lookup(self, client: connection.Client) -> tuple[ConnState | None, Sandbox | None]:
        conn = self.state.connections.get(client.id)
        if conn is None:
            return None, None
        return conn, self.state.table.get(conn.sandbox_address)


def _absolute_authority(request: http.Request) -> str | None:
    """The authority of an HTTP/1 absolute-form target (`GET https://AUTHORITY/x`), which the origin
    would route by. mitmproxy keeps it in transparent mode (and inside CONNECT tunnels) and clears
    it for the explicit proxy's own absolute-form requests, whose URL is the connection's target
    (and a claim checked against Host). For HTTP/2 `authority` is `:authority`, the Host claim."""
    if request.is_http2 or request.is_http3:
        return None
    return request.authority or None


__all__ = ["EnforcementAddon"]

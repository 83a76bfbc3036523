"""The sandboxes' resolver: answers only names the policy allows, from the proxy's own lookups.

Rules:
1. A name the sandbox's policy denies gets NXDOMAIN without any upstream query: a denied name
   never leaves the proxy, so DNS cannot carry data out. A query with EDNS also gets an Extended
   DNS Error (RFC 8914, 15 "Blocked") whose text is sandgate's reason, so tools inside can tell a
   block from a typo (`dnswire` rule 4).
2. A/AAAA for allowed names come from the proxy's resolver, the other family's lookup started
   beside each (`resolver.PairedLookups`: a stub's A and AAAA are answered within one upstream
   timeout, not one after the other); answers in ranges the policy refuses
   (private, loopback, metadata...: DNS rebinding) are dropped. Answers are remembered per
   sandbox so a later connection to that address without SNI/Host is attributed to the name.
3. Every other type (TXT, SRV, HTTPS, MX, CNAME, NULL, ANY...) of an allowed name is asked
   upstream by the proxy itself with a freshly built question-only query (`dnswire.forward`),
   never the client's message; mitmproxy never forwards anything. Only single-question QUERYs in
   class IN from registered sandboxes are served; anything else is REFUSED.
4. A forwarded answer is screened before it is relayed (`dnsscreen`): A/AAAA records in any
   section and SVCB/HTTPS address hints are judged like rule 2's answers, SVCB/HTTPS `ech` and
   unknown parameters are removed, and records whose target is a name the policy would not
   resolve are dropped. What was removed is said in the audit record's detail.
5. One `dns` audit record per query. While the audit log cannot be written (`AuditLog.failure`)
   every query of a sandbox is answered SERVFAIL, with why as its Extended DNS Error text: the
   proxy asks nothing upstream that it cannot record.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import struct

from mitmproxy import dns

from sandgate.policy import Reason
from sandgate.proxy.auditing import record_decision
from sandgate.proxy.decide import Verdict, check_upstream, decide_name, refusal
from sandgate.proxy.dnsscreen import screen_records
from sandgate.proxy.dnswire import (
    EDE_BLOCKED,
    EDE_NOT_SUPPORTED,
    EDE_PROHIBITED,
    ForwardError,
    fit_udp,
    forward,
    relay_answer,
    with_edns,
)
from sandgate.proxy.resolver import PairedLookups, ResolveError, normalise_ip
from sandgate.proxy.state import ProxyState, Sandbox

ANSWER_TTL = 30
FAMILIES = {dns.types.A: socket.AF_INET, dns.types.AAAA: socket.AF_INET6}
NOT_A_SANDBOX = "sandgate: this source is not a registered sandbox"
NOT_SERVED = "sandgate: only single-question QUERY in class IN is served"


def blocked_text(verdict: Verdict) -> str:
    """The Extended DNS Error text of a refused name: what the 403 body would say."""
    rule = f", rule {verdict.rule}" if verdict.rule else ""
    return f"sandgate: egress denied ({verdict.reason}{rule})"


class DnsAddon:
    def __init__(self, state: ProxyState) -> None:
        self.state = state
        self.lookups = PairedLookups(state.resolver)

    async def dns_request(self, flow: dns.DNSFlow) -> None:
        request = flow.request
        sandbox = self.state.table.get(normalise_ip(flow.client_conn.peername[0]))
        question = request.question
        if sandbox is None:
            flow.response = with_edns(
                request, request.fail(dns.response_codes.REFUSED), (EDE_PROHIBITED, NOT_A_SANDBOX)
            )
            return
        if question is None or request.op_code != dns.op_codes.QUERY or question.class_ != dns.classes.IN:
            flow.response = with_edns(
                request, request.fail(dns.response_codes.REFUSED), (EDE_NOT_SUPPORTED, NOT_SERVED)
            )
            return
        name = question.name.lower().rstrip(".")
        verdict = decide_name(sandbox, name)
        detail = f"qtype={dns.types.to_str(question.type)}"
        if (failure := self.state.audit.failure) is not None:
            verdict = refusal(Reason.AUDIT_UNWRITABLE)
            why = (EDE_PROHIBITED, f"sandgate: {failure}")
            flow.response = _failed(request, dns.response_codes.SERVFAIL, why)
        elif not verdict.allowed:
            flow.response = self._blocked(request, verdict)
        elif question.type in FAMILIES:
            verdict, flow.response, answered, failure = await self._answer(
                request, sandbox, name, question.type, verdict
            )
            self.state.names.remember(sandbox.address, name, answered)
            detail += f" answers={','.join(answered)}" if answered else ""
            detail += f" failed: {failure}" if failure else ""
        else:
            flow.response, outcome = await self._forward(request, sandbox, name, question.type)
            detail += f" {outcome}"
        if flow.client_conn.transport_protocol == "udp":
            flow.response = fit_udp(request, flow.response)
        record_decision(
            self.state, "dns", sandbox, verdict, flow.client_conn.peername, host=name, detail=detail
        )

    def _blocked(self, request: dns.DNSMessage, verdict: Verdict) -> dns.DNSMessage:
        return _failed(request, dns.response_codes.NXDOMAIN, (EDE_BLOCKED, blocked_text(verdict)))

    async def _forward(
        self, request: dns.DNSMessage, sandbox: Sandbox, name: str, qtype: int
    ) -> tuple[dns.DNSMessage, str]:
        """Upstream's answer to a question-only query (rule 3), screened (rule 4), and what
        happened, for the record."""
        try:
            reply = await forward(self.state.resolver.servers, name, qtype)
        except ForwardError as exc:
            return _failed(request, dns.response_codes.SERVFAIL), f"forwarded: {exc}"
        reply, removed = screened(reply, sandbox)
        answer = relay_answer(request, reply)
        try:
            answer.packed  # noqa: B018  # a name mitmproxy decoded but cannot encode again
        except (ValueError, struct.error) as exc:
            return _failed(request, dns.response_codes.SERVFAIL), f"forwarded: unrepresentable answer: {exc}"
        rcode = dns.response_codes.to_str(reply.response_code)
        outcome = f"forwarded rcode={rcode} answers={len(reply.answers)}"
        return answer, outcome + (f" removed: {'; '.join(removed)}" if removed else "")

    async def _answer(
        self, request: dns.DNSMessage, sandbox: Sandbox, name: str, qtype: int, verdict: Verdict
    ) -> tuple[Verdict, dns.DNSMessage, list[str], str | None]:
        """(verdict, answer, the addresses answered, why the lookup failed if it did)."""
        try:
            found = await self.lookups.lookup(sandbox.address, name, FAMILIES[qtype])
        except ResolveError as exc:
            code = dns.response_codes.NXDOMAIN if exc.nxdomain else dns.response_codes.SERVFAIL
            return verdict, _failed(request, code), [], str(exc)
        usable = [a for a in found if check_upstream(sandbox.policy, a).allowed]
        if found and not usable:
            refusal = check_upstream(sandbox.policy, found[0])
            return refusal, self._blocked(request, refusal), [], None
        question = request.questions[0]
        records = [
            dns.ResourceRecord(
                name=question.name,  # as asked: resolvers may randomise case (0x20)
                type=qtype,
                class_=dns.classes.IN,
                ttl=ANSWER_TTL,
                data=ipaddress.ip_address(a).packed,
            )
            for a in usable
        ]
        return verdict, with_edns(request, request.succeed(records)), usable, None


def screened(reply: dns.DNSMessage, sandbox: Sandbox) -> tuple[dns.DNSMessage, list[str]]:
    """Upstream's answer with every section screened by the sandbox's policy (rule 4)."""

    def address_allowed(address: str) -> bool:
        return check_upstream(sandbox.policy, address).allowed

    def name_allowed(name: str) -> bool:
        return decide_name(sandbox, name).allowed

    answers, in_answers = screen_records(reply.answers, address_allowed, name_allowed)
    authorities, in_authorities = screen_records(reply.authorities, address_allowed, name_allowed)
    additionals, in_additionals = screen_records(reply.additionals, address_allowed, name_allowed)
    screened = dataclasses.replace(reply, answers=answers, authorities=authorities, additionals=additionals)
    return screened, [*in_answers, *in_authorities, *in_additionals]


def _failed(request: dns.DNSMessage, code: int, ede: tuple[int, str] | None = None) -> dns.DNSMessage:
    """An error answer from the sandbox's recursive resolver (RA set: clients warn without it)."""
    return with_edns(request, dataclasses.replace(request.fail(code), recursion_available=True), ede)

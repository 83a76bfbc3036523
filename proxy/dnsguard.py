"""The sandboxes' resolver: answers only names the policy allows, from the proxy's own lookups.

Rules:
1. A name the sandbox's policy denies gets NXDOMAIN without any upstream query: a denied name
   never leaves the proxy, so DNS cannot carry data out.
2. A/AAAA for allowed names come from the proxy's resolver; answers in ranges the policy refuses
   (private, loopback, metadata...: DNS rebinding) are dropped. Answers are remembered per
   sandbox so a later connection to that address without SNI/Host is attributed to the name.
3. Other query types (TXT, NULL, ANY, MX, HTTPS...) are forwarded upstream only for allowed
   names; anything that is not a single-question QUERY is refused.
4. One `dns` audit record per query.
"""

from __future__ import annotations

import ipaddress
import socket

from mitmproxy import dns

from sandgate.proxy.auditing import record_decision
from sandgate.proxy.decide import Verdict, check_upstream, decide_name
from sandgate.proxy.resolver import ResolveError, normalise_ip
from sandgate.proxy.state import ProxyState, Sandbox

ANSWER_TTL = 30
FAMILIES = {dns.types.A: socket.AF_INET, dns.types.AAAA: socket.AF_INET6}


class DnsAddon:
    def __init__(self, state: ProxyState, upstream_dns: list[str]) -> None:
        self.state = state
        self.upstream = upstream_dns

    async def dns_request(self, flow: dns.DNSFlow) -> None:
        sandbox = self.state.table.get(normalise_ip(flow.client_conn.peername[0]))
        question = flow.request.question
        if sandbox is None or question is None or flow.request.op_code != dns.op_codes.QUERY:
            flow.response = flow.request.fail(dns.response_codes.REFUSED)
            return
        name = question.name.lower().rstrip(".")
        qtype = dns.types.to_str(question.type)
        verdict = decide_name(sandbox, name)
        detail = f"qtype={qtype}"
        if not verdict.allowed:
            flow.response = flow.request.fail(dns.response_codes.NXDOMAIN)
        elif question.type in FAMILIES and question.class_ == dns.classes.IN:
            verdict, flow.response, answered = await self._answer(flow, sandbox, name, question.type, verdict)
            self.state.names.remember(sandbox.address, name, answered)
            detail += f" answers={','.join(answered)}" if answered else ""
        elif self.upstream:
            flow.server_conn.address = (self.upstream[0], 53)  # allowed name: let mitmproxy forward it
        else:
            flow.response = flow.request.fail(dns.response_codes.REFUSED)
        record_decision(
            self.state, "dns", sandbox, verdict, flow.client_conn.peername, host=name, detail=detail
        )

    async def _answer(
        self, flow: dns.DNSFlow, sandbox: Sandbox, name: str, qtype: int, verdict: Verdict
    ) -> tuple[Verdict, dns.DNSMessage, list[str]]:
        try:
            found = await self.state.resolver.lookup(name, FAMILIES[qtype])
        except ResolveError as exc:
            code = dns.response_codes.NXDOMAIN if exc.nxdomain else dns.response_codes.SERVFAIL
            return verdict, flow.request.fail(code), []
        usable = [a for a in found if check_upstream(sandbox.policy, a).allowed]
        if found and not usable:
            refusal = check_upstream(sandbox.policy, found[0])
            return refusal, flow.request.fail(dns.response_codes.NXDOMAIN), []
        question = flow.request.question
        assert question is not None  # dns_request refused question-less messages
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
        return verdict, flow.request.succeed(records), usable

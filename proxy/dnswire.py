"""DNS on the wire for the sandboxes' resolver: question-only forwarding and EDNS answers.

Rules:
1. What goes upstream is built here from the question alone: a fresh id, RD set, one question
   (the name in lower case, the type, class IN), and nothing else: no answer, authority or
   additional record, no EDNS OPT. Nothing the client put in its message travels on (its id,
   flags, extra records and EDNS options would each be a channel out); the name's letter case
   neither (0x20 bits).
2. Upstream answers are accepted only from the server asked (a connected UDP socket), with the
   query's id and question; a truncated UDP answer is asked again over TCP. An unanswered UDP
   query is sent again (UDP_RESENDS) within its UPSTREAM_TIMEOUT, as stub resolvers do: one lost
   or late datagram must not become a SERVFAIL, which the sandbox's stub takes as final.
3. The answer a sandbox gets is upstream's sections under the sandbox's own id and question (its
   letter case restored in owner names). Over UDP it is cut to 512 bytes, or the size its EDNS
   OPT offers (at most MAX_UDP_ANSWER): larger answers are sent truncated (TC), and the sandbox
   asks again over TCP (its TCP/53 reaches the same resolver), where answers are whole.
4. A query that carried EDNS gets an OPT in the answer (RFC 6891), and refusals an Extended DNS
   Error option (RFC 8914) with sandgate's reason as its text; a query without EDNS gets none.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import struct

from mitmproxy import dns
from mitmproxy.net.dns import domain_names

UPSTREAM_TIMEOUT = 2.0  # seconds per server and transport
UDP_RESENDS = (0.4, 1.0)  # seconds after the first send at which an unanswered UDP query is sent again
PLAIN_UDP_LIMIT = 512  # bytes of a DNS answer over UDP without EDNS (RFC 1035)
MAX_UDP_ANSWER = 1232  # the EDNS payload size we offer and honour (DNS flag day 2020)
EDE_OPTION = 15  # EDNS option code of Extended DNS Errors (RFC 8914)
EDE_BLOCKED = 15  # "Blocked": the name is blocked by this resolver's policy
EDE_PROHIBITED = 18  # "Prohibited": the client is not allowed to ask this resolver
EDE_NOT_SUPPORTED = 21  # "Not Supported": a class or operation this resolver does not serve
EDE_TEXT_MAX = 200  # bytes of extra text, so an OPT never crowds out the answer


class ForwardError(Exception):
    """No usable answer from any upstream resolver; the message says what each one did."""


def question_only_query(name: str, qtype: int) -> tuple[int, bytes]:
    """(id, wire bytes) of a fresh recursive query for `name`/`qtype` in class IN, nothing else."""
    query_id = secrets.randbelow(1 << 16)
    flags = 1 << 8  # RD
    header = struct.pack("!HHHHHH", query_id, flags, 1, 0, 0, 0)
    question = domain_names.pack(name.lower()) + struct.pack("!HH", qtype, dns.classes.IN)
    return query_id, header + question


async def forward(servers: list[tuple[str, int]], name: str, qtype: int) -> dns.DNSMessage:
    """Ask each server in turn with `question_only_query` (UDP, then TCP if truncated)."""
    failures = []
    for server in servers:
        query_id, query = question_only_query(name, qtype)
        try:
            reply = await _ask_udp(server, query)
            if reply.truncation:
                reply = await _ask_tcp(server, query)
            _check(reply, query_id, name, qtype)
            return reply
        except (OSError, TimeoutError, struct.error, ValueError) as exc:
            failures.append(f"{server[0]}:{server[1]}: {exc!r}")
    raise ForwardError(f"no answer for {name}: " + "; ".join(failures or ["no upstream resolver"]))


class _Reply(asyncio.DatagramProtocol):
    def __init__(self, query: bytes) -> None:
        self.query = query
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.DatagramTransport)
        self.transport = transport
        self.send()

    def send(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(self.query)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if data[:2] == self.query[:2] and not self.answer.done():  # another id: not our answer
            self.answer.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.answer.done():
            self.answer.set_exception(exc)


async def _ask_udp(server: tuple[str, int], query: bytes) -> dns.DNSMessage:
    loop = asyncio.get_running_loop()
    transport, reply = await loop.create_datagram_endpoint(lambda: _Reply(query), remote_addr=server)
    resends = [loop.call_later(delay, reply.send) for delay in UDP_RESENDS if delay < UPSTREAM_TIMEOUT]
    try:
        # asyncio.wait, not wait_for: after the loop was busy, the answer and the timeout can be
        # due in the same iteration, and an answer that arrived in time must not be thrown away.
        await asyncio.wait([reply.answer], timeout=UPSTREAM_TIMEOUT)
        if not reply.answer.done():
            raise TimeoutError(f"no answer within {UPSTREAM_TIMEOUT:g} s (sent {1 + len(resends)} times)")
        return dns.DNSMessage.unpack(reply.answer.result())
    finally:
        for resend in resends:
            resend.cancel()
        transport.close()


async def _ask_tcp(server: tuple[str, int], query: bytes) -> dns.DNSMessage:
    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(*server)
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            (length,) = struct.unpack("!H", await reader.readexactly(2))
            return await reader.readexactly(length)
        finally:
            writer.close()

    return dns.DNSMessage.unpack(await asyncio.wait_for(exchange(), UPSTREAM_TIMEOUT))


def _check(reply: dns.DNSMessage, query_id: int, name: str, qtype: int) -> None:
    question = reply.question
    if (
        reply.id != query_id
        or reply.query
        or question is None
        or question.name.lower() != name.lower()
        or question.type != qtype
    ):
        raise ValueError(f"answer does not match the question ({reply.id} {question})")


# ------------------------------------------------------------------ answers to the sandbox


def client_opt(request: dns.DNSMessage) -> dns.ResourceRecord | None:
    """The EDNS OPT record of a query, if it carried one."""
    return next((rr for rr in request.additionals if rr.type == dns.types.OPT), None)


def answer_limit(request: dns.DNSMessage) -> int:
    """How many bytes an answer to `request` may have over UDP."""
    opt = client_opt(request)
    return min(max(opt.class_, PLAIN_UDP_LIMIT), MAX_UDP_ANSWER) if opt else PLAIN_UDP_LIMIT


def relay_answer(request: dns.DNSMessage, reply: dns.DNSMessage) -> dns.DNSMessage:
    """Upstream's answer under the sandbox's id and question (rule 3); OPT records are ours to add."""
    asked = request.questions[0].name

    def as_asked(rr: dns.ResourceRecord) -> dns.ResourceRecord:
        return dataclasses.replace(rr, name=asked) if rr.name.lower() == asked.lower() else rr

    answer = dataclasses.replace(
        reply,
        id=request.id,
        recursion_desired=request.recursion_desired,
        questions=request.questions,
        answers=[as_asked(rr) for rr in reply.answers],
        authorities=[as_asked(rr) for rr in reply.authorities],
        additionals=[as_asked(rr) for rr in reply.additionals if rr.type != dns.types.OPT],
    )
    return with_edns(request, answer)


def with_edns(
    request: dns.DNSMessage, answer: dns.DNSMessage, ede: tuple[int, str] | None = None
) -> dns.DNSMessage:
    """`answer` with an OPT (and the Extended DNS Error `ede`, (info-code, text)) if the query
    had EDNS; as it is otherwise."""
    if client_opt(request) is None:
        return answer
    return dataclasses.replace(answer, additionals=[*answer.additionals, _opt(ede)])


def fit_udp(request: dns.DNSMessage, answer: dns.DNSMessage) -> dns.DNSMessage:
    """`answer` as a UDP datagram may carry it: truncated (TC, no records but the OPT) when it
    exceeds the sandbox's limit, so the sandbox asks again over TCP, where answers are whole."""
    if len(answer.packed) <= answer_limit(request):
        return answer
    kept = [rr for rr in answer.additionals if rr.type == dns.types.OPT]
    return dataclasses.replace(answer, truncation=True, answers=[], authorities=[], additionals=kept)


def _opt(ede: tuple[int, str] | None) -> dns.ResourceRecord:
    data = b""
    if ede is not None:
        info_code, text = ede
        payload = struct.pack("!H", info_code) + text.encode()[:EDE_TEXT_MAX]
        data = struct.pack("!HH", EDE_OPTION, len(payload)) + payload
    # OPT: root owner, class = our UDP payload size, TTL = extended rcode 0, version 0, no flags
    return dns.ResourceRecord(name="", type=dns.types.OPT, class_=MAX_UDP_ANSWER, ttl=0, data=data)

"""The DNS answer screen as a pure function: SVCB/HTTPS records built by dnslib from zone-file
text (the same parser the test internet's DNS server uses), judged by a real compiled policy
through the proxy's own judges, and a property test that no RDATA makes the parser raise."""

from __future__ import annotations

import dataclasses
import ipaddress

from dnslib import HTTPS, RR
from dnslib.buffer import Buffer
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import dns

from sandgate.policy import compile_policy, parse_policy
from sandgate.proxy.decide import check_upstream, decide
from sandgate.proxy.dnsscreen import (
    ECH,
    HINTS,
    MANDATORY,
    parse_service_binding,
    screen_records,
    screen_service_binding,
)

POLICY = compile_policy(
    parse_policy(
        {
            "defaultAction": "deny",
            "egress": [
                {"action": "allow", "target": "svc.example.com"},
                {"action": "allow", "target": "*.cdn.example.com"},
                {"action": "allow", "target": "10.9.0.0/16"},  # a CIDR rule that allows a private range
            ],
        }
    )
)


def address_allowed(address: str) -> bool:
    return check_upstream(POLICY, address).allowed


def name_allowed(name: str) -> bool:
    return decide(POLICY, name, 443, "https").allowed


def rdata(zone: str) -> bytes:
    """The RDATA of one HTTPS record written as in a zone file (`1 . alpn=h2 ...`)."""
    [rr] = RR.fromZone(f"svc.example.com. 60 IN HTTPS {zone}")
    return _pack(rr.rdata)


def _pack(record: HTTPS) -> bytes:
    buffer = Buffer()
    record.pack(buffer)
    return bytes(buffer.data)


def as_zone(data: bytes) -> str:
    return repr(HTTPS.parse(Buffer(data), len(data)))


def screen(zone: str) -> tuple[str | None, list[str]]:
    data, removed = screen_service_binding(rdata(zone), address_allowed, name_allowed)
    return (as_zone(data) if data is not None else None), removed


def test_hints_are_judged_like_address_answers() -> None:
    zone, removed = screen(
        "1 . alpn=h2 ipv4hint=169.254.169.254,198.51.100.10,127.0.0.1,10.9.1.1 "
        "ipv6hint=::1,2001:db8::10,::ffff:a9fe:a9fe"
    )
    # metadata, loopback and an IPv4-mapped metadata address go; the private range a CIDR rule
    # allows stays, as it would in an A answer
    assert zone == "1 . alpn=h2 ipv4hint=198.51.100.10,10.9.1.1 ipv6hint=2001:db8::10"
    assert removed == [
        "ipv4hint 169.254.169.254",
        "ipv4hint 127.0.0.1",
        "ipv6hint ::1",
        "ipv6hint ::ffff:169.254.169.254",
    ]
    for address in ("169.254.169.254", "127.0.0.1", "::1"):
        assert not address_allowed(address)  # the very function the A/AAAA answers are judged by


def test_a_hint_with_no_allowed_address_is_removed_and_ech_always() -> None:
    zone, removed = screen("1 . alpn=h3,h2 ipv4hint=169.254.169.254 echconfig=AEX+DQBB")
    assert zone == "1 . alpn=h3,h2"
    assert removed == ["ipv4hint 169.254.169.254", "ech"]


def test_unknown_keys_go_and_known_ones_stay_byte_for_byte() -> None:
    assert screen("1 . alpn=h2 port=8443 key65000=x")[0] == "1 . alpn=h2 port=8443"
    untouched = rdata("1 . alpn=h2 port=8443 ipv4hint=198.51.100.10")
    assert screen_service_binding(untouched, address_allowed, name_allowed) == (untouched, [])


def test_targets_the_policy_would_not_resolve_drop_the_record() -> None:
    assert screen("0 svc.edge.cdn.example.com.") == ("0 svc.edge.cdn.example.com.", [])
    dropped, removed = screen("0 metadata.example.test.")
    assert dropped is None and removed == [
        "SVCB/HTTPS record for target metadata.example.test (not allowed) dropped"
    ]
    assert screen("1 elsewhere.example.test. alpn=h2")[0] is None  # ServiceMode too


def test_alias_mode_loses_its_parameters() -> None:
    assert screen("0 . echconfig=AEX+DQBB") == ("0 .", ["ech"])


def test_a_mandatory_key_that_was_removed_drops_the_record() -> None:
    zone, removed = screen("1 . mandatory=echconfig alpn=h2 echconfig=AEX+DQBB")
    assert zone is None and removed[-1] == "SVCB/HTTPS record dropped: mandatory ech removed"
    assert screen("1 . mandatory=alpn alpn=h2 echconfig=AEX+DQBB")[0] == "1 . mandatory=alpn alpn=h2"


def test_malformed_records_are_dropped() -> None:
    good = rdata("1 . alpn=h2 port=443")
    assert parse_service_binding(good) is not None
    out_of_order = rdata("1 . port=443 alpn=h2")  # dnslib writes keys in the order given
    twice = rdata("1 . alpn=h2 alpn=h3")
    short_hint = bytes.fromhex("0001" + "00" + "0004" + "0003" + "0a0000")
    compressed = bytes.fromhex("0001" + "c00c")
    mandatory_missing = rdata("1 . mandatory=port alpn=h2")
    for data in (out_of_order, twice, short_hint, compressed, mandatory_missing, b"", b"\x00"):
        assert parse_service_binding(data) is None, data.hex()
        assert screen_service_binding(data, address_allowed, name_allowed) == (
            None,
            ["malformed SVCB/HTTPS record dropped"],
        )


def test_address_records_in_any_section_are_judged() -> None:
    def record(rtype: int, address: str) -> dns.ResourceRecord:
        return dns.ResourceRecord(
            "x.example.com", rtype, dns.classes.IN, 5, ipaddress.ip_address(address).packed
        )

    records = [
        record(dns.types.A, "169.254.169.254"),
        record(dns.types.A, "198.51.100.10"),
        record(dns.types.AAAA, "::1"),
        dns.ResourceRecord("x.example.com", dns.types.TXT, dns.classes.IN, 5, b"\x03abc"),
        dns.ResourceRecord(
            "x.example.com", dns.types.SVCB, dns.classes.IN, 5, rdata("1 . echconfig=AEX+DQBB")
        ),
        dns.ResourceRecord("x.example.com", dns.types.A, dns.classes.IN, 5, b"\x01\x02"),
    ]
    kept, removed = screen_records(records, address_allowed, name_allowed)
    assert [(rr.type, rr.data) for rr in kept] == [
        (dns.types.A, records[1].data),
        (dns.types.TXT, b"\x03abc"),
        (dns.types.SVCB, rdata("1 .")),
    ]
    assert removed == ["A 169.254.169.254", "AAAA ::1", "ech", "malformed A record dropped"]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_no_rdata_makes_the_screen_raise(data: bytes) -> None:
    screened, _removed = screen_service_binding(data, address_allowed, name_allowed)
    if screened is not None:  # what passes parses again, and holds nothing the screen removes
        record = parse_service_binding(screened)
        assert record is not None
        keys = [key for key, _ in record.params]
        assert ECH not in keys and all(key in (MANDATORY, 1, 2, 3, 4, 6, 7) for key in keys)
        for key, value in record.params:
            if key in HINTS:
                size = HINTS[key]
                assert all(
                    address_allowed(str(ipaddress.ip_address(value[i : i + size])))
                    for i in range(0, len(value), size)
                )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(range(8)), max_size=6, unique=True).map(sorted),
    st.lists(st.ip_addresses(v=4), min_size=1, max_size=4),
)
def test_well_formed_records_keep_every_allowed_hint(
    keys: list[int], hints: list[ipaddress.IPv4Address]
) -> None:
    values = {0: b"", 1: b"\x02h2", 2: b"", 3: b"\x01\xbb", 4: b"".join(h.packed for h in hints),
              5: b"\x00\x01", 6: ipaddress.ip_address("2001:db8::10").packed, 7: b"/q{?dns}"}  # fmt: skip
    params = [(key, values[key]) for key in keys if key != MANDATORY]
    data = _pack(HTTPS(1, [], [(k, bytearray(v)) for k, v in params]))
    screened, _removed = screen_service_binding(data, address_allowed, name_allowed)
    assert screened is not None
    record = parse_service_binding(screened)
    assert record is not None
    allowed = b"".join(h.packed for h in hints if address_allowed(str(h)))
    assert dict(record.params).get(4, b"") == (allowed if 4 in keys else b"")
    assert 5 not in dict(record.params)
    assert all(dict(record.params)[key] == value for key, value in params if key in (1, 2, 3, 6, 7))


def test_unchanged_rdata_is_the_same_object() -> None:
    rr = dns.ResourceRecord("svc.example.com", dns.types.HTTPS, dns.classes.IN, 5, rdata("1 . alpn=h2"))
    [kept], _ = screen_records([rr], address_allowed, name_allowed)
    assert kept is rr and dataclasses.asdict(kept) == dataclasses.asdict(rr)

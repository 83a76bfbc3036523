"""The compiled matcher agrees with a naive first-match scan on random policies and requests."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandgate.policy import PolicyError, Request, compile_policy, denied_range, policy_from_dict
from sandgate.policy.addresses import address_to_check
from sandgate.policy.names import canonical_target, parse_target
from tests.policy.reference import ip, naive_decide, port_scheme_miss, same_decision, target_matches
from tests.support.tiers import examples

LABELS = ["a", "b", "api", "example", "test", "cdn"]
ADDRESSES = ["198.51.100.7", "198.51.100.200", "203.0.113.9", "10.1.2.3", "127.0.0.1", "2001:db8::5", "::1"]
NETWORKS = [
    "198.51.100.0/24",
    "198.51.100.0/25",
    "203.0.113.9",
    "10.0.0.0/8",
    "10.1.0.0/16",
    "0.0.0.0/0",
    "2001:db8::/32",
    "127.0.0.0/8",
    "::/0",
]

# Plain paths, spellings of them, and targets refused always or where a rule checks the path.
PATHS = ["/", "/a", "/a/x", "/b", "/b/", "/%61/x", "/a/../b", "/a/%2e", "/a%2Fx", "/a;x", "/a//x", "/b%252F"]
names = st.lists(st.sampled_from(LABELS), min_size=1, max_size=4).map(".".join)
name_targets = st.one_of(names, names.map(lambda n: "*." + n))
maybe = lambda strategy: st.one_of(st.none(), strategy)  # noqa: E731


@st.composite
def rules(draw: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "action": draw(st.sampled_from(["allow", "deny"])),
        "target": draw(st.one_of(name_targets, name_targets, st.sampled_from(NETWORKS))),
    }
    extras = {
        "ports": maybe(st.lists(st.sampled_from([80, 443, 8080]), min_size=1, max_size=2, unique=True)),
        "schemes": maybe(st.lists(st.sampled_from(["http", "https"]), min_size=1, max_size=1)),
        "methods": maybe(st.lists(st.sampled_from(["GET", "POST"]), min_size=1, max_size=2, unique=True)),
        "paths": maybe(
            st.lists(st.sampled_from(["/a", "/a/*", "/b", "/*"]), min_size=1, max_size=2, unique=True)
        ),
        "inspect": st.sampled_from(["auto", "auto", "always"]),
    }
    if draw(st.booleans()):
        for key, strategy in extras.items():
            value = draw(strategy)
            if value is not None:
                rule[key] = value
    return rule


@st.composite
def policies(draw: Any) -> dict[str, Any]:
    egress = draw(st.lists(rules(), max_size=12))
    allowed = [
        r["target"]
        for r in egress
        if r["action"] == "allow" and not r["target"][0].isdigit() and ":" not in r["target"]
    ]
    bindings = []
    for index in range(draw(st.integers(0, 3)) if allowed else 0):
        bindings.append(
            {
                "name": f"b{index}",
                "credential": f"c{index}",
                "match": {
                    "hosts": draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=2, unique=True)),
                    "paths": draw(st.sampled_from([["/*"], ["/a/*"], ["/b"]])),
                    "methods": draw(st.sampled_from([["GET"], ["GET", "POST"]])),
                },
                "auth": {"type": "bearer"},
            }
        )
    return {
        "defaultAction": draw(st.sampled_from(["allow", "deny"])),
        "mode": draw(st.sampled_from(["enforce", "enforce", "report"])),
        "egress": egress,
        "bindings": bindings,
    }


def hosts_near(document: dict[str, Any]) -> st.SearchStrategy[str]:
    """Hosts that hit the policy's own targets (exact, subdomain, apex), so rules really compete."""
    near = []
    for rule in document["egress"]:
        target = rule["target"]
        if target.startswith("*."):
            near += [target[2:], "a." + target[2:], "b.a." + target[2:]]
        else:
            near += [target.split("/")[0], "a." + target]
    pool = st.one_of(names, names.map(lambda n: n.upper() + "."), st.sampled_from(ADDRESSES))
    return st.one_of(st.sampled_from(near), pool) if near else pool


def requests(document: dict[str, Any]) -> st.SearchStrategy[Request]:
    return st.builds(
        Request,
        host=hosts_near(document),
        port=st.sampled_from([80, 443, 8080]),
        scheme=st.sampled_from(["http", "https"]),
        method=maybe(st.sampled_from(["GET", "POST", "get"])),
        path=maybe(st.sampled_from(PATHS)),
    )


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(document=policies(), data=st.data())
def test_compiled_matches_naive_first_match(document: dict[str, Any], data: st.DataObject) -> None:
    try:
        policy = policy_from_dict(document)
    except PolicyError:
        return  # e.g. a binding host shadowed by an earlier deny rule: rejected, nothing to compare
    compiled = compile_policy(policy)
    for request in data.draw(st.lists(requests(document), min_size=1, max_size=10)):
        fast, slow = compiled.decide(request), naive_decide(policy, request)
        assert same_decision(fast, slow), f"{request}\ncompiled {fast}\nnaive    {slow}"


connections = st.one_of(
    st.none(), st.tuples(st.sampled_from([80, 443, 8080]), st.sampled_from(["http", "https"]))
)


@settings(max_examples=examples(200), deadline=None)
@given(
    document=policies(),
    address=st.sampled_from([*ADDRESSES, "169.254.169.254", "::ffff:10.1.2.3"]),
    asked=st.lists(connections, min_size=1, max_size=6),
)
def test_check_address_is_first_matching_ip_rule(
    document: dict[str, Any], address: str, asked: list[tuple[int, str] | None]
) -> None:
    """check_address = first IP/CIDR rule containing the address (and, given a request, matching
    its port and scheme), else the always-deny table; asked repeatedly, so cached answers count."""
    policy = policy_from_dict({**document, "bindings": [], "mode": "enforce"})
    compiled = compile_policy(policy)
    host = address_to_check(ip(address))
    for connection in asked:
        request = None if connection is None else Request(address, *connection)
        decision = compiled.check_address(address, request)
        first = next(
            (
                rule
                for rule in policy.egress
                if target_matches(rule, host)
                and (connection is None or port_scheme_miss(rule, *connection) is None)
            ),
            None,
        )
        if first is not None:
            assert (decision.action, decision.reason, decision.rule) == (first.action, "rule", first.origin)
        elif denied_range(host) is not None:
            assert (decision.action, decision.reason) == ("deny", "always_denied_range")
        else:
            assert (decision.action, decision.reason) == ("allow", "address_ok")


@settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(document=policies(), data=st.data())
def test_cached_decisions_equal_uncached(document: dict[str, Any], data: st.DataObject) -> None:
    """The decision caches change nothing: with a tiny cache (evicting all the time) decisions
    still agree with the naive scan, and equal, detail included, those of an uncached policy."""
    try:
        policy = policy_from_dict(document)
    except PolicyError:
        return
    cached, uncached = compile_policy(policy, cache_size=3), compile_policy(policy, cache_size=0)
    drawn = data.draw(st.lists(requests(document), min_size=1, max_size=12))
    for request in drawn + drawn[::-1]:  # the second pass hits (and evicts) cached entries
        decision = cached.decide(request)
        assert same_decision(decision, naive_decide(policy, request)), request
        assert decision == uncached.decide(request), request
        address = data.draw(st.sampled_from(ADDRESSES))
        assert cached.check_address(address, request) == uncached.check_address(address, request)
        assert cached.check_address(address) == uncached.check_address(address)


@settings(max_examples=examples(300), deadline=None)
@given(
    raw=st.one_of(
        name_targets,
        names.map(lambda n: n.upper() + "."),
        st.sampled_from(
            [*NETWORKS, "[2001:db8::1]", "2001:DB8:0::/48", "198.51.100.7/24", "xn--bcher-kva.example"]
        ),
    )
)
def test_canonical_target_reads_back_what_parse_target_wrote(raw: str) -> None:
    """Rules keep their target as canonical text; reading it back needs no validation but must
    give exactly the Target the validator parsed."""
    parsed = parse_target(raw)
    assert canonical_target(parsed.text) == parsed

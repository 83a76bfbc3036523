"""`suggest_policy`: for any workload, the suggestion is a valid policy that allows every request
it was made from, and refuses what was not seen (another host, another port, and on a host seen
with few paths, another path)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy import Request, compile_policy, policy_from_dict, suggest_policy
from tests.support.tiers import examples

labels = st.text("abcdefghij", min_size=1, max_size=6)
names = st.builds(lambda a, b: f"{a}.{b}.example.test", labels, st.sampled_from(["api", "cdn", "files"]))
addresses = st.builds(lambda n: f"203.0.113.{n}", st.integers(1, 254))
hosts = st.one_of(names, addresses)
paths = st.lists(labels, min_size=0, max_size=3).map(lambda parts: "/" + "/".join(parts))
connections = st.builds(Request, hosts, st.sampled_from([443, 8443]), st.just("https"))
methods = st.sampled_from(["GET", "POST", "PUT"])
requests = st.builds(
    Request, hosts, st.sampled_from([80, 443]), st.sampled_from(["http", "https"]), methods, paths
)
workloads = st.lists(st.one_of(connections, requests), min_size=1, max_size=40)


def compiled(seen: list[Request], wildcard_after: int = 5):  # type: ignore[no-untyped-def]
    suggestion = suggest_policy(seen, wildcard_after=wildcard_after)
    return compile_policy(policy_from_dict(suggestion.document, "<suggested>"))


def same_host_kind(seen: list[Request]) -> list[Request]:
    """A host seen both with and without an L7 view is allowed whole: keep one kind per host so
    the refusal checks below have something to refuse."""
    kinds: dict[str, bool] = {}
    return [r for r in seen if kinds.setdefault(r.host, r.method is None) == (r.method is None)]


@settings(max_examples=examples(300), deadline=None)
@given(workloads)
def test_every_request_seen_is_allowed(seen: list[Request]) -> None:
    policy = compiled(seen)
    for request in seen:
        decision = policy.decide(request)
        assert decision.allowed, (request, decision)


@settings(max_examples=examples(300), deadline=None)
@given(workloads.map(same_host_kind), st.sampled_from([9443, 2222]))
def test_what_was_not_seen_is_refused(seen: list[Request], port: int) -> None:
    policy = compiled(seen, wildcard_after=1000)  # no wildcards: exact names only
    assert not policy.decide(Request("unseen.elsewhere.example.test", 443, "https")).allowed
    for request in seen:
        assert not policy.decide(Request(request.host, port, request.scheme)).allowed
        if request.method is not None:
            other = Request(request.host, request.port, request.scheme, "DELETE", "/never/seen/path")
            assert not policy.decide(other).allowed


def test_exact_names_first_then_a_wildcard_for_many_siblings() -> None:
    seen = [Request(f"shard{n}.cdn.example.test", 443, "https") for n in range(6)]
    seen.append(Request("api.example.test", 443, "https", "GET", "/v1/items"))
    suggestion = suggest_policy(seen, wildcard_after=5)
    targets = [rule["target"] for rule in suggestion.document["egress"]]
    assert targets == ["api.example.test", "*.cdn.example.test"]
    api = {"action": "allow", "target": "api.example.test", "ports": [443]}
    assert suggestion.document["egress"][0] == {**api, "methods": ["GET"], "paths": ["/v1/items"]}
    assert any("*.cdn.example.test stands for 6 names" in note for note in suggestion.notes)


def test_many_paths_become_prefixes_and_ip_literals_cidrs() -> None:
    seen = [Request("pkg.example.test", 443, "https", "GET", f"/packages/p{n}/file") for n in range(12)]
    seen.append(Request("203.0.113.7", 8080, "http"))
    rules = suggest_policy(seen).document["egress"]
    assert rules[0]["paths"] == ["/packages/*"]
    assert rules[1] == {"action": "allow", "target": "203.0.113.7/32", "ports": [8080]}


def test_refusals_are_notes_never_rules() -> None:
    metadata = Request("169.254.169.254", 80, "http", "GET", "/latest/meta-data")
    suggestion = suggest_policy([], refused=[(metadata, "always_denied_range (always)")])
    assert suggestion.document["egress"] == []
    assert suggestion.notes == [
        "not suggested: 169.254.169.254:80 was refused as always_denied_range (always)"
    ]


def test_a_local_name_only_looked_up_is_a_note() -> None:
    seen = [
        Request("sandbox", 0, "https"),
        Request("sandbox", 0, "https"),
        Request("api.example.test", 0, "https"),
    ]
    suggestion = suggest_policy(seen)
    assert suggestion.document["egress"] == [{"action": "allow", "target": "api.example.test"}]
    assert suggestion.notes == ["not suggested: sandbox was only looked up (a local name, no dot)"]

"""The always-deny table, embedded IPv4 decoding, check_address, and OpenSandbox update semantics."""

from __future__ import annotations

import ipaddress

import pytest

from sandgate.policy import (
    ALWAYS_DENIED,
    Policy,
    PolicyError,
    Request,
    compile_policy,
    delete_targets,
    denied_range,
    patch_rules,
    policy_from_dict,
    replace_policy,
    to_document,
    to_opensandbox,
)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "169.254.169.254",
        "10.9.8.7",
        "172.31.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fd00:ec2::254",
        "ff02::1",
        "::ffff:127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::a00:1",
        "2002:7f00:1::",
        "2002:a9fe:a9fe::1",
    ],
)
def test_always_denied_addresses(address: str) -> None:
    assert denied_range(ipaddress.ip_address(address)) is not None
    decision = compile_policy(policy_from_dict({"defaultAction": "allow"})).check_address(address)
    assert (decision.action, decision.reason) == ("deny", "always_denied_range")


@pytest.mark.parametrize("address", ["198.51.100.1", "203.0.113.5", "2001:db8::1", "64:ff9b::cb00:7105"])
def test_public_addresses_pass(address: str) -> None:
    assert compile_policy(policy_from_dict({})).check_address(address).reason == "address_ok"


def test_the_table_is_the_documented_list() -> None:
    assert {str(entry.network) for entry in ALWAYS_DENIED} >= {
        "127.0.0.0/8",
        "169.254.0.0/16",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "fc00::/7",
        "fe80::/10",
        "::1/128",
        "::/128",
        "224.0.0.0/4",
        "ff00::/8",
    }


def test_an_explicit_cidr_allow_inside_the_range_opens_it() -> None:
    policy = policy_from_dict({"egress": [{"action": "allow", "target": "10.20.0.0/16", "ports": [8080]}]})
    compiled = compile_policy(policy)
    assert compiled.check_address("10.20.1.1", Request("mirror.internal", 8080, "http")).action == "allow"
    assert compiled.check_address("10.20.1.1", Request("mirror.internal", 80, "http")).action == "deny"
    assert compiled.check_address("10.21.1.1").reason == "always_denied_range"
    assert compiled.decide(Request("10.20.1.1", 8080, "http")).action == "allow"


@pytest.mark.parametrize("broad", ["0.0.0.0/0", "::/0", "160.0.0.0/3"])
def test_a_broad_allow_never_opens_always_denied_ranges(broad: str) -> None:
    compiled = compile_policy(policy_from_dict({"egress": [{"action": "allow", "target": broad}]}))
    assert compiled.check_address("169.254.169.254").reason == "always_denied_range"
    assert compiled.decide(Request("169.254.169.254", 80, "http")).action == "deny"


def test_cidr_deny_rules_apply_to_resolved_addresses() -> None:
    compiled = compile_policy(policy_from_dict({"egress": [{"action": "deny", "target": "203.0.113.0/24"}]}))
    decision = compiled.check_address("203.0.113.5")
    assert (decision.action, decision.reason, decision.rule) == ("deny", "rule", "<api>:egress[0]")
    assert compiled.check_address("not an ip").reason == "invalid_address"


# -- updates -----------------------------------------------------------------------------------

BASE = {
    "egress": [
        {"action": "allow", "target": "a.example.com"},
        {"action": "deny", "target": "*.example.com"},
        {"action": "allow", "target": "api.github.com", "methods": ["GET"]},
        {"action": "allow", "target": "api.github.com", "methods": ["POST"], "paths": ["/graphql"]},
    ],
    "bindings": [
        {"name": "gh", "credential": "t", "match": {"hosts": ["api.github.com"]}, "auth": {"type": "bearer"}}
    ],
}


def test_patch_puts_incoming_rules_first_and_first_duplicate_wins() -> None:
    patched = patch_rules(
        policy_from_dict(BASE),
        [
            {"action": "allow", "target": "b.example.com"},
            {"action": "deny", "target": "B.Example.com."},
            {"action": "deny", "target": "a.example.com"},
        ],
    )
    assert to_opensandbox(patched)["egress"][:4] == [
        {"action": "allow", "target": "b.example.com"},
        {"action": "deny", "target": "a.example.com"},
        {"action": "deny", "target": "*.example.com"},
        {"action": "allow", "target": "api.github.com"},
    ]
    assert compile_policy(patched).decide(Request("b.example.com", 443, "https")).action == "allow"


def test_patch_keeps_rule_ids_and_other_rules_of_a_target() -> None:
    base = policy_from_dict(BASE)
    patched = patch_rules(base, [{"action": "allow", "target": "new.example.com"}])
    assert [rule.origin for rule in patched.egress][1:] == [rule.origin for rule in base.egress]
    assert len([r for r in patched.egress if r.target == "api.github.com"]) == 2


def test_patch_is_rejected_whole() -> None:
    base = policy_from_dict(BASE)
    with pytest.raises(PolicyError, match=r"<api>:\[1\]\.target"):
        patch_rules(
            base, [{"action": "allow", "target": "ok.example.com"}, {"action": "allow", "target": "*x"}]
        )
    with pytest.raises(PolicyError, match="not covered by an explicit allow"):
        patch_rules(base, [{"action": "deny", "target": "api.github.com"}])


def test_rule_limit_is_enforced_with_a_clear_error() -> None:
    with pytest.raises(PolicyError, match="4 egress rules; the limit is 3"):
        policy_from_dict(BASE, max_rules=3)
    with pytest.raises(PolicyError, match="the limit is 4"):
        patch_rules(policy_from_dict(BASE), [{"action": "allow", "target": "n.example.com"}], max_rules=4)
    with pytest.raises(PolicyError, match="the limit is 4"):
        replace_policy(
            policy_from_dict(BASE),
            {"egress": [*BASE["egress"], {"action": "deny", "target": "x.test"}]},
            max_rules=4,
        )
    assert len(policy_from_dict(BASE, max_rules=4).egress) == 4  # at the limit


def test_delete_is_idempotent_and_normalises_targets() -> None:
    base = policy_from_dict(BASE)
    once = delete_targets(base, ["*.EXAMPLE.com", "missing.example.com"])
    assert [r.target for r in once.egress] == ["a.example.com", "api.github.com", "api.github.com"]
    assert delete_targets(once, ["*.example.com"]) == once
    with pytest.raises(PolicyError, match="not covered"):
        delete_targets(base, ["api.github.com"])


def test_replace_keeps_bindings_and_mode_unless_given() -> None:
    base = policy_from_dict({**BASE, "mode": "report"})
    replaced = replace_policy(base, {"egress": [{"action": "allow", "target": "api.github.com"}]})
    assert replaced.mode == "report" and [b.name for b in replaced.bindings] == ["gh"]
    assert replaced.defaultAction == "deny"
    with pytest.raises(PolicyError, match="not covered"):
        replace_policy(base, None)
    plain = policy_from_dict({"egress": [{"action": "allow", "target": "x.example.com"}]})
    assert replace_policy(plain, {}).egress == []


def test_documents_round_trip() -> None:
    policy = policy_from_dict(BASE)
    assert policy_from_dict(to_document(policy)) == policy
    assert to_opensandbox(policy_from_dict(None)) == {"defaultAction": "deny", "egress": []}


def test_the_document_keeps_every_field() -> None:
    """What the proxy compiles is `to_document`'s output: a field it leaves out is silently off
    (the sandbox's own budgets once were). Every field here differs from its default."""
    policy = policy_from_dict(
        {
            "version": 1,
            "defaultAction": "ask",
            "mode": "report",
            "askTimeout": 7,
            "budgets": {"requestsPerSecond": 5, "burst": 3, "totalBytes": {"in": "1M", "out": 100}},
            "egress": [
                {"action": "allow", "target": "a.example.com", "budgets": {"bytesPerSecond": {"in": 9}}}
            ],
            "bindings": [
                {
                    "name": "gh",
                    "match": {"hosts": ["a.example.com"]},
                    "auth": {"type": "bearer", "credential": "t"},
                }
            ],
        }
    )
    left_default = [
        name
        for name, spec in Policy.model_fields.items()
        if getattr(policy, name) == spec.get_default(call_default_factory=True)
    ]
    # version has one value so far; presets are expanded into `egress` in the document
    assert left_default == ["version", "include"]
    document = to_document(policy)
    assert policy_from_dict(document) == policy
    assert document["budgets"]["totalBytes"] == {"in": 1_000_000, "out": 100}

"""A ceiling bounds a sandbox policy: both must allow (sandgate.policy.within_ceiling).

Each table row is (ceiling, sandbox policy, the ceiling rule that refuses or None). The
property test at the end checks soundness against the decision function itself: whatever a
policy within its ceiling allows, the ceiling allows too.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandgate.policy import Decision, Reason, Request, compile_policy, policy_from_dict, within_ceiling

ALLOW_EXAMPLE = {
    "egress": [
        {"action": "deny", "target": "evil.example.com"},
        {"action": "allow", "target": "*.example.com", "ports": [443]},
        {"action": "allow", "target": "api.example.org", "methods": ["GET"], "paths": ["/v1/*"]},
        {"action": "ask", "target": "review.example.net"},
        {"action": "allow", "target": "203.0.113.0/24"},
        {"action": "deny", "target": "198.51.100.0/24"},
    ]
}


def rule(action: str, target: str, **conditions: Any) -> dict[str, Any]:
    return {"action": action, "target": target, **conditions}


def sandbox(*rules: dict[str, Any], default: str = "deny", **more: Any) -> dict[str, Any]:
    # every sandbox that allows names must deny what the ceiling denies by address (198.51.100.0/24)
    return {"defaultAction": default, "egress": [rule("deny", "198.51.100.0/24"), *rules], **more}


CASES: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    ("deny all is always within", ALLOW_EXAMPLE, {}, None),
    (
        "a name under an allowed wildcard",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "api.example.com", ports=[443])),
        None,
    ),
    (
        "the wildcard itself",
        ALLOW_EXAMPLE,
        sandbox(rule("deny", "evil.example.com"), rule("allow", "*.example.com", ports=[443])),
        None,
    ),
    (
        "a deeper wildcard",
        ALLOW_EXAMPLE,
        sandbox(rule("deny", "evil.example.com"), rule("allow", "*.a.example.com", ports=[443])),
        None,
    ),
    ("any port is wider than 443", ALLOW_EXAMPLE, sandbox(rule("allow", "api.example.com")), "defaultAction"),
    (
        "port 80 is outside",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "api.example.com", ports=[80])),
        "defaultAction",
    ),
    (
        "the apex is not under the wildcard",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "example.com", ports=[443])),
        "defaultAction",
    ),
    (
        "a wildcard meeting the ceiling's deny",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "*.example.com", ports=[443])),
        "<api>:egress[0]",
    ),
    (
        "the denied name itself",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "evil.example.com", ports=[443])),
        "<api>:egress[0]",
    ),
    (
        "a conditional sandbox deny does not excuse",
        ALLOW_EXAMPLE,
        sandbox(rule("deny", "evil.example.com", ports=[443]), rule("allow", "*.example.com", ports=[443])),
        "<api>:egress[0]",
    ),
    (
        "a deny after the allow does not excuse",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "*.example.com", ports=[443]), rule("deny", "evil.example.com")),
        "<api>:egress[0]",
    ),
    (
        "methods and paths within",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "api.example.org", methods=["GET"], paths=["/v1/users/*", "/v1/x"])),
        None,
    ),
    (
        "POST is outside",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "api.example.org", methods=["GET", "POST"], paths=["/v1/*"])),
        "defaultAction",
    ),
    (
        "any path is outside /v1/*",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "api.example.org", methods=["GET"])),
        "defaultAction",
    ),
    (
        "a path beside /v1/*",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "api.example.org", methods=["GET"], paths=["/v2/*"])),
        "defaultAction",
    ),
    (
        "/v1* is wider than /v1/*",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "api.example.org", methods=["GET"], paths=["/v1*"])),
        "defaultAction",
    ),
    ("ask under a ceiling's ask", ALLOW_EXAMPLE, sandbox(rule("ask", "review.example.net")), None),
    (
        "allow under a ceiling's ask",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "review.example.net")),
        "<api>:egress[3]",
    ),
    (
        "ask under a ceiling's allow",
        ALLOW_EXAMPLE,
        sandbox(rule("ask", "api.example.com", ports=[443])),
        None,
    ),
    ("a subnet of an allowed network", ALLOW_EXAMPLE, {"egress": [rule("allow", "203.0.113.128/25")]}, None),
    ("an address in it", ALLOW_EXAMPLE, {"egress": [rule("allow", "203.0.113.7")]}, None),
    ("a supernet", ALLOW_EXAMPLE, {"egress": [rule("allow", "203.0.112.0/23")]}, "defaultAction"),
    ("a denied network", ALLOW_EXAMPLE, {"egress": [rule("allow", "198.51.100.0/25")]}, "<api>:egress[5]"),
    (
        "names need the ceiling's address denies",
        ALLOW_EXAMPLE,
        {"egress": [rule("allow", "api.example.com", ports=[443])]},
        "<api>:egress[5]",
    ),
    (
        "a name allowed by an IP rule is not",
        ALLOW_EXAMPLE,
        sandbox(rule("allow", "203.0.113.7.example.com", ports=[443])),
        None,
    ),
    (
        "defaultAction allow is wider than any ceiling with rules",
        ALLOW_EXAMPLE,
        sandbox(default="allow"),
        "<api>:egress[0]",
    ),
    (
        "mode report lets everything out",
        ALLOW_EXAMPLE,
        {**sandbox(rule("allow", "api.example.com", ports=[443])), "mode": "report"},
        "<api>:egress[0]",
    ),
    (
        "an open ceiling takes everything",
        {"defaultAction": "allow"},
        sandbox(default="allow", mode="report"),
        None,
    ),
    (
        "a mirror of an open ceiling with a deny",
        {"defaultAction": "allow", "egress": [rule("deny", "evil.example.com")]},
        sandbox(rule("deny", "evil.example.com"), default="allow"),
        None,
    ),
    (
        "an allow split over two ceiling rules is refused (sound, not exact)",
        {"egress": [rule("allow", "a.example.com", ports=[443]), rule("allow", "a.example.com", ports=[80])]},
        {"egress": [rule("allow", "a.example.com", ports=[80, 443])]},
        "defaultAction",
    ),
    (
        "schemes",
        {"egress": [rule("allow", "a.example.com", schemes=["https"])]},
        {"egress": [rule("allow", "a.example.com")]},
        "defaultAction",
    ),
    (
        "always-denied ranges need no mirror",
        {"egress": [rule("deny", "10.0.0.0/8"), rule("allow", "a.example.com")]},
        {"egress": [rule("allow", "a.example.com")]},
        None,
    ),
    (
        "but a sandbox CIDR allow inside them is refused",
        {"egress": [rule("deny", "10.0.0.0/8"), rule("allow", "a.example.com")]},
        {"egress": [rule("allow", "10.1.0.0/16")]},
        "<api>:egress[0]",
    ),
]


@pytest.mark.parametrize(("name", "ceiling", "policy", "refused_by"), CASES, ids=[case[0] for case in CASES])
def test_ceiling_table(
    name: str, ceiling: dict[str, Any], policy: dict[str, Any], refused_by: str | None
) -> None:
    decision = within_ceiling(policy_from_dict(ceiling), policy_from_dict(policy))
    assert decision.allowed is (refused_by is None), decision.reason
    assert decision.ceiling_rule == refused_by
    if refused_by is not None:
        assert refused_by in decision.reason  # the reason names the ceiling rule that refuses


def test_the_reason_names_both_rules_and_the_refused_request() -> None:
    decision = within_ceiling(
        policy_from_dict(ALLOW_EXAMPLE),
        policy_from_dict(sandbox(rule("allow", "evil.example.com", ports=[443]))),
    )
    assert decision.reason == (
        "ceiling rule <api>:egress[0] (deny evil.example.com) refuses sandbox rule <api>:egress[1] "
        "(allow evil.example.com): the ceiling does not allow every request it allows"
    )
    assert decision.sandbox_rule == "sandbox rule <api>:egress[1] (allow evil.example.com)"


BINDING_CEILING = {
    "egress": [rule("allow", "*.example.com"), rule("allow", "api.example.org")],
    "bindings": [
        {
            "name": "github",
            "match": {"hosts": ["*.example.com"], "methods": ["GET", "POST"], "paths": ["/repos/*"]},
            "auth": {"type": "bearer", "credential": "gh-token"},
        }
    ],
}


def binding(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "mine",
        "match": {"hosts": ["api.example.com"], "methods": ["GET"], "paths": ["/repos/acme/*"]},
        "auth": {"type": "bearer", "credential": "gh-token"},
    }
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return {"egress": [rule("allow", "api.example.com")], "bindings": [base]}


BINDING_CASES = [
    ("within", binding(), True),
    ("another credential", binding(auth={"credential": "other-token"}), False),
    ("another auth style", binding(auth={"type": "apiKey", "name": "X-Key"}), False),
    ("a host outside", binding(match={"hosts": ["api.example.org"]}), False),
    ("a method outside", binding(match={"methods": ["DELETE"]}), False),
    ("a path outside", binding(match={"paths": ["/admin/*"]}), False),
    ("cleartext", binding(match={"schemes": ["http"], "ports": [80]}), False),
]


@pytest.mark.parametrize(
    ("name", "policy", "allowed"), BINDING_CASES, ids=[case[0] for case in BINDING_CASES]
)
def test_binding_table(name: str, policy: dict[str, Any], allowed: bool) -> None:
    policy["egress"].append(rule("allow", "api.example.org"))
    decision = within_ceiling(policy_from_dict(BINDING_CEILING), policy_from_dict(policy))
    assert decision.allowed is allowed, decision.reason
    if not allowed:
        assert decision.ceiling_rule == "bindings" and "mine" in decision.reason


# --- soundness against the decision function ------------------------------------------------------

HOSTS = ["api.example.com", "evil.example.com", "a.b.example.com", "example.com", "api.example.org", "x.test"]
PORTS = [80, 443, 8443]
PATHS = ["/", "/v1/x", "/v2/x", "/repos/acme/y"]
METHODS = ["GET", "POST"]


def allowed_requests(policy: dict[str, Any]) -> set[tuple[str, int, str, str]]:
    compiled = compile_policy(policy_from_dict(policy))
    return {
        (host, port, method, path)
        for host in HOSTS
        for port in PORTS
        for method in METHODS
        for path in PATHS
        if lets_out(compiled.decide(Request(host=host, port=port, scheme="https", method=method, path=path)))
    }


def lets_out(decision: Decision) -> bool:
    """Allowed, or held for a reviewer who may allow it."""
    return decision.action == "allow" or decision.reason == Reason.ASK


@pytest.mark.parametrize(
    ("name", "ceiling", "policy", "refused_by"),
    [c for c in CASES if c[3] is None],
    ids=[c[0] for c in CASES if c[3] is None],
)
def test_within_means_every_allowed_request_is_allowed_by_the_ceiling(
    name: str, ceiling: dict[str, Any], policy: dict[str, Any], refused_by: str | None
) -> None:
    if policy.get("mode") == "report":
        policy = {**policy, "mode": "enforce", "defaultAction": "allow"}
    assert allowed_requests(policy) <= allowed_requests(ceiling)

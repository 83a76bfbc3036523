"""`action: ask` in the matcher: the connection (SNI, CONNECT, DNS) is allowed for inspection so
the question can be asked per request; the request itself is answered `ask` (a deny the proxy
holds for a reviewer); addresses are never asked about; OpenSandbox's view shows `deny`."""

from __future__ import annotations

import pytest

from sandgate.policy import (
    PolicyError,
    Reason,
    Request,
    compile_policy,
    parse_policy,
    policy_from_dict,
    to_document,
    to_opensandbox,
)

ASKING = """\
defaultAction: ask
askTimeout: 30
egress:
  - action: allow
    target: api.example.test
  - action: ask
    target: "*.tools.example.test"
  - action: deny
    target: never.example.test
  - action: ask
    target: 203.0.113.0/24
"""


@pytest.fixture(scope="module")
def policy():  # type: ignore[no-untyped-def]
    return compile_policy(parse_policy(ASKING, "asking.yaml"))


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ("new.example.test", None),
        ("a.tools.example.test", "asking.yaml:6"),
        ("203.0.113.9", "asking.yaml:10"),
    ],
)
def test_an_ask_is_an_inspected_connection_and_a_held_request(policy, host: str, rule: str | None) -> None:  # type: ignore[no-untyped-def]
    connection = policy.decide(Request(host, 443, "https"))
    assert (connection.action, connection.reason, connection.inspect) == ("allow", Reason.L7_PENDING, True)
    request = policy.decide(Request(host, 443, "https", "GET", "/x"))
    assert (request.action, request.reason, request.rule, request.inspect) == ("deny", Reason.ASK, rule, True)


def test_allow_and_deny_rules_are_not_asked(policy) -> None:  # type: ignore[no-untyped-def]
    assert policy.decide(Request("api.example.test", 443, "https", "GET", "/")).reason == Reason.RULE
    assert policy.decide(Request("api.example.test", 443, "https", "GET", "/")).allowed
    denied = policy.decide(Request("never.example.test", 443, "https", "GET", "/"))
    assert (denied.action, denied.reason) == ("deny", Reason.RULE)
    assert not policy.decide(Request("never.example.test", 443, "https")).allowed  # no DNS, no connect


def test_nobody_is_asked_about_a_resolved_address(policy) -> None:  # type: ignore[no-untyped-def]
    decision = policy.check_address("203.0.113.9", Request("x.tools.example.test", 443, "https"))
    assert (decision.action, decision.rule) == ("deny", "asking.yaml:10")


def test_opensandbox_sees_deny_and_the_document_round_trips() -> None:
    parsed = parse_policy(ASKING, "asking.yaml")
    view = to_opensandbox(parsed)
    assert view["defaultAction"] == "deny" and [r["action"] for r in view["egress"]] == [
        "allow",
        "deny",
        "deny",
        "deny",
    ]
    again = policy_from_dict(to_document(parsed))
    assert (again.defaultAction, again.askTimeout, again.egress[1].action) == ("ask", 30, "ask")


@pytest.mark.parametrize("timeout", [0, 3601, "soon"])
def test_a_bad_ask_timeout_is_a_located_error(timeout: object) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"defaultAction: ask\naskTimeout: {timeout}\n", "bad.yaml")
    assert caught.value.issues[0].line == 2 and "askTimeout" in str(caught.value.issues[0])

"""Every OpenSandbox matching rule in the wire notes (sections 3 and 4), plus sandgate's L7 rules."""

from __future__ import annotations

import pytest

from sandgate.policy import Decision, Request, compile_policy, parse_policy, policy_from_dict


def decide(
    document: str | dict,
    host: str,
    method: str | None = None,
    path: str | None = None,
    port: int = 443,
    scheme: str = "https",
) -> Decision:
    policy = parse_policy(document, "p.yaml") if isinstance(document, str) else policy_from_dict(document)
    return compile_policy(policy).decide(Request(host, port, scheme, method, path))


def rules(*pairs: tuple[str, str], default: str | None = None) -> dict:
    document: dict = {"egress": [{"action": action, "target": target} for action, target in pairs]}
    if default:
        document["defaultAction"] = default
    return document


# -- section 3: policy schema and matching ----------------------------------------------------


def test_exact_fqdn() -> None:
    assert decide(rules(("allow", "api.example.com")), "api.example.com").action == "allow"
    assert decide(rules(("allow", "api.example.com")), "www.example.com").reason == "default"


def test_wildcard_matches_subdomains_only_not_the_apex() -> None:
    policy = rules(("allow", "*.example.com"))
    assert decide(policy, "a.example.com").action == "allow"
    assert decide(policy, "a.b.example.com").action == "allow"
    assert decide(policy, "example.com").action == "deny"
    assert decide(policy, "badexample.com").action == "deny"


def test_first_matching_rule_in_list_order_wins() -> None:
    deny_first = rules(("deny", "api.example.com"), ("allow", "*.example.com"))
    allow_first = rules(("allow", "*.example.com"), ("deny", "api.example.com"))
    assert decide(deny_first, "api.example.com").action == "deny"
    assert decide(allow_first, "api.example.com").action == "allow"
    assert decide(allow_first, "api.example.com").rule == "<api>:egress[0]"


def test_missing_default_action_means_deny() -> None:
    assert decide({"egress": []}, "api.example.com") == Decision("deny", "default")


@pytest.mark.parametrize("body", [None, {}, ""])
def test_empty_null_or_empty_object_is_deny_all(body: object) -> None:
    policy = parse_policy(body) if isinstance(body, str) else policy_from_dict(body)
    assert policy.defaultAction == "deny" and policy.egress == []
    assert compile_policy(policy).decide(Request("api.example.com", 443, "https")).action == "deny"


def test_default_allow() -> None:
    assert decide(rules(("deny", "bad.example.com"), default="allow"), "ok.example.com").reason == "default"
    assert decide(rules(("deny", "bad.example.com"), default="allow"), "bad.example.com").action == "deny"


def test_ip_and_cidr_targets_v4_and_v6() -> None:
    policy = rules(("deny", "203.0.113.0/24"), ("allow", "198.51.100.7"), ("allow", "2001:db8::/32"))
    assert decide(policy, "203.0.113.9").action == "deny"
    assert decide(policy, "198.51.100.7").action == "allow"
    assert decide(policy, "198.51.100.8").reason == "ip_literal_needs_cidr_rule"
    assert decide(policy, "[2001:db8::1]").action == "allow"


def test_ip_literals_only_match_ip_rules_never_names() -> None:
    policy = rules(("allow", "*.0.113.9.example.com"), ("allow", "*.example.com"))
    assert decide(policy, "203.0.113.9").reason == "ip_literal_needs_cidr_rule"


@pytest.mark.parametrize(
    "host", ["::ffff:203.0.113.9", "[::ffff:cb00:7109]", "203.0.113.9.", "3405803785", "0xcb.0.113.9"]
)
def test_every_spelling_of_an_ip_literal_is_that_address(host: str) -> None:
    assert decide(rules(("deny", "203.0.113.0/24"), default="allow"), host).action == "deny"


@pytest.mark.parametrize("host", ["API.Example.COM", "api.example.com.", "Api.Example.Com."])
def test_case_and_trailing_dot_are_normalised(host: str) -> None:
    assert decide(rules(("allow", "api.example.com")), host).action == "allow"


def test_rule_targets_are_normalised_too() -> None:
    assert decide(rules(("allow", "API.Example.com.")), "api.example.com").action == "allow"


def test_idna_names_match_their_punycode() -> None:
    policy = rules(("allow", "bücher.example"))
    assert policy_from_dict(policy).egress[0].target == "xn--bcher-kva.example"
    assert decide(policy, "BÜCHER.example").action == "allow"
    assert decide(policy, "xn--bcher-kva.example").action == "allow"


@pytest.mark.parametrize(
    "host", ["", "exa mple.com", "a..b", "-x.example.com", "x" * 64 + ".com", "1.2.3.4.5"]
)
def test_malformed_hosts_are_denied_even_with_default_allow(host: str) -> None:
    decision = decide(rules(default="allow"), host)
    assert (decision.action, decision.reason) == ("deny", "invalid_host")


def test_rule_ids_are_file_lines() -> None:
    text = (
        "egress:\n  - {action: deny, target: a.example.com}\n\n  - action: allow\n    target: b.example.com\n"
    )
    assert decide(text, "a.example.com").rule == "p.yaml:2"
    assert decide(text, "b.example.com").rule == "p.yaml:4"


def test_actions_are_case_insensitive_like_opensandbox() -> None:
    assert (
        decide(
            {"defaultAction": "ALLOW", "egress": [{"action": "Deny", "target": "x.example.com"}]},
            "x.example.com",
        ).action
        == "deny"
    )


# -- sandgate extensions: ports, schemes, methods, paths, inspect -------------------------------

L7 = """
egress:
  - action: allow
    target: api.github.com
    methods: [GET]
    paths: ["/repos/acme/*", "/user"]
  - {action: allow, target: uploads.example.com, ports: [443], schemes: [https]}
  - {action: allow, target: cdn.example.com, inspect: always}
"""


def test_connection_with_l7_rules_is_pending_and_inspected() -> None:
    decision = decide(L7, "api.github.com")
    assert (decision.action, decision.reason, decision.inspect, decision.rule) == (
        "allow",
        "l7_pending",
        True,
        "p.yaml:3",
    )


def test_method_and_path_rules() -> None:
    assert decide(L7, "api.github.com", "GET", "/repos/acme/app").action == "allow"
    assert decide(L7, "api.github.com", "get", "/user?x=1").action == "allow"
    assert decide(L7, "api.github.com", "GET", "/user/keys").reason == "path_not_allowed"
    assert decide(L7, "api.github.com", "DELETE", "/repos/acme/app").reason == "method_not_allowed"


@pytest.mark.parametrize(
    "path",
    ["/repos/acme/../other/x", "/repos/acme/%2e%2e/other/x", "/repos/acme/./../x", "/repos/acme/..;/x"],
)
def test_dot_segments_cannot_escape_a_path_prefix(path: str) -> None:
    decision = decide(L7, "api.github.com", "GET", path)
    assert (decision.action, decision.reason) == ("deny", "ambiguous_target")


def test_ports_and_schemes() -> None:
    assert decide(L7, "uploads.example.com").action == "allow"
    assert decide(L7, "uploads.example.com", port=8443).reason == "port_not_allowed"
    assert decide(L7, "uploads.example.com", port=443, scheme="http").reason == "scheme_not_allowed"


def test_pass_through_unless_a_rule_needs_l7() -> None:
    assert decide(L7, "uploads.example.com").inspect is False
    assert decide(L7, "cdn.example.com").inspect is True


def test_connection_denied_when_no_request_could_be_allowed() -> None:
    text = "egress:\n  - {action: deny, target: x.example.com, methods: [POST]}\n"
    decision = decide(text, "x.example.com")
    assert (decision.action, decision.reason) == ("deny", "default")


def test_report_mode_lets_would_deny_pass_and_says_so() -> None:
    decision = decide({"mode": "report", "egress": []}, "x.example.com", "GET", "/")
    assert (decision.action, decision.reason, decision.report_only) == ("allow", "default", True)
    assert decision.to_dict()["decision"] == "report"


def test_report_mode_never_opens_always_denied_or_malformed() -> None:
    assert decide({"mode": "report", "defaultAction": "allow"}, "169.254.169.254", port=80).action == "deny"
    assert decide({"mode": "report"}, "bad host").action == "deny"


# -- section 4: credential binding selection ---------------------------------------------------

BINDINGS = """
egress:
  - {action: allow, target: api.example.com}
  - {action: allow, target: "*.example.com"}
bindings:
  - {name: exact, credential: a, match: {hosts: [api.example.com], paths: ["/v1/*"]}, auth: {type: bearer}}
  - {name: wild, credential: b, match: {hosts: ["*.example.com"]}, auth: {type: bearer}}
  - {name: wild-post, credential: c, match: {hosts: ["*.example.com"], methods: [POST], paths: ["/upload"]},
     auth: {type: bearer}}
  - {name: cleartext, credential: d, match: {hosts: [plain.example.com], schemes: [http]},
     auth: {type: bearer}}
"""


def test_binding_defaults_follow_opensandbox() -> None:
    binding = parse_policy(BINDINGS).bindings[1]
    assert binding.match.schemes == ["https"] and binding.match.ports == [443]
    assert binding.match.methods == ["GET", "POST", "PUT", "PATCH", "DELETE"] and binding.match.paths == [
        "/*"
    ]
    assert parse_policy(BINDINGS).bindings[3].match.ports == [80]


def test_exact_host_beats_wildcard() -> None:
    assert decide(BINDINGS, "api.example.com", "GET", "/v1/x").bindings == ("exact",)


def test_binding_conditions_are_checked_before_precedence() -> None:
    assert decide(BINDINGS, "api.example.com", "GET", "/v2/x").bindings == ("wild",)


def test_path_star_is_prefix_anything_else_exact() -> None:
    assert decide(BINDINGS, "x.example.com", "POST", "/upload").reason == "binding_ambiguous"
    assert decide(BINDINGS, "x.example.com", "POST", "/upload/more").bindings == ("wild",)


def test_ambiguity_at_top_precedence_denies() -> None:
    decision = decide(BINDINGS, "x.example.com", "POST", "/upload")
    assert (decision.action, decision.reason, decision.bindings) == ("deny", "binding_ambiguous", ())
    assert "wild" in (decision.detail or "") and "wild-post" in (decision.detail or "")


def test_bindings_match_scheme_port_and_method() -> None:
    assert decide(BINDINGS, "x.example.com", "OPTIONS", "/").bindings == ()
    assert decide(BINDINGS, "x.example.com", "GET", "/", port=8443).bindings == ()
    assert decide(BINDINGS, "plain.example.com", "GET", "/", port=80, scheme="http").bindings == (
        "cleartext",
    )
    assert decide(BINDINGS, "plain.example.com", "GET", "/", port=80, scheme="http").inspect is True


def test_binding_wildcard_does_not_match_apex() -> None:
    text = BINDINGS.replace(
        "  - {action: allow, target: api.example.com}", "  - {action: allow, target: example.com}"
    )
    assert decide(text, "example.com", "GET", "/").bindings == ()


def test_a_host_with_a_binding_is_inspected_at_connection_level() -> None:
    assert decide(BINDINGS, "api.example.com").inspect is True
    assert decide(BINDINGS, "api.example.com", port=80, scheme="http").inspect is False


def test_credential_shorthand_and_opensandbox_form_are_one_model() -> None:
    short = parse_policy(BINDINGS).bindings[0]
    long = policy_from_dict(
        {
            "egress": [{"action": "allow", "target": "api.example.com"}],
            "bindings": [
                {
                    "name": "exact",
                    "match": {"hosts": ["api.example.com"], "paths": ["/v1/*"]},
                    "auth": {"type": "bearer", "credential": "a"},
                }
            ],
        }
    ).bindings[0]
    assert short == long and short.credential_names() == ["a"]


def test_credential_names_of_every_auth_type() -> None:
    text = """
egress: [{action: allow, target: api.example.com}]
bindings:
  - {name: h, match: {hosts: [api.example.com], paths: [/h]},
     auth: {type: customHeaders, headers: [{name: X-A, credential: a}, {name: X-B, credential: b}]}}
  - {name: p, match: {hosts: [api.example.com], paths: [/p]},
     auth: {type: passthrough, substitutions: [{credential: c, placeholder: SANDGATE_C}]}}
  - {name: k, credential: k, match: {hosts: [api.example.com], paths: [/k]},
     auth: {type: apiKey, name: X-Key}}
"""
    policy = parse_policy(text)
    assert [b.credential_names() for b in policy.bindings] == [["a", "b"], ["c"], ["k"]]
    assert policy.bindings[1].auth.substitutions[0].in_ == ["header", "query"]  # type: ignore[union-attr]


# -- decision caches ----------------------------------------------------------------------------


def test_connection_decisions_are_cached_and_bounded() -> None:
    compiled = compile_policy(policy_from_dict(rules(("allow", "*.example.com"))), cache_size=8)
    first = compiled.decide(Request("bad host!", 443, "https"))
    assert first.reason == "invalid_host"
    assert compiled.decide(Request("bad host!", 443, "https")) is first  # built once, then cached
    for n in range(50):
        assert compiled.decide(Request(f"h{n}.example.com", 443, "https")).action == "allow"
    assert compiled._connection_cache.cache_info().currsize == 8  # bounded: least recently used go


def test_cache_size_zero_recomputes_every_decision() -> None:
    compiled = compile_policy(policy_from_dict(rules(("allow", "*.example.com"))), cache_size=0)
    first = compiled.decide(Request("bad host!", 443, "https"))
    again = compiled.decide(Request("bad host!", 443, "https"))
    assert again == first and again is not first

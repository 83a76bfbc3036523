"""The canonical request identity (sandgate.policy.canonical): one spelling per path, the targets
refused always, the ones refused where a rule checks the path, and absolute-form authorities.

The strongest property is checked against models of real origins: whenever a target is accepted
as unambiguous, an nginx-style origin (decode, then resolve dot segments and merge slashes), a
Tomcat-style origin (strip `;params` per segment, then decode and resolve), a double-decoding
framework and a backslash-normalizing server all serve exactly the path that was judged.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy import (
    AmbiguousTarget,
    PolicyError,
    Reason,
    Request,
    RequestIdentity,
    compile_policy,
    policy_from_dict,
    request_identity,
)
from sandgate.policy.canonical import canonical_pattern, canonical_target
from tests.support.tiers import examples

# ------------------------------------------------------------------------------ the forms


@pytest.mark.parametrize(
    ("target", "path", "query"),
    [
        ("/", "/", None),
        ("/v1/messages", "/v1/messages", None),
        ("/v1/messages?beta=true&x=%2F", "/v1/messages", "beta=true&x=%2F"),
        ("/v1/%61dmin", "/v1/admin", None),  # unreserved escapes are the character
        ("/v1/%7euser", "/v1/~user", None),
        ("/wiki/B%C3%BCcher", "/wiki/Bücher", None),
        ("/wiki/Bücher", "/wiki/Bücher", None),
        ("/a%20b", "/a b", None),
        ("/v1/.well-known/x", "/v1/.well-known/x", None),  # a dot inside a name is no dot segment
        ("/v1/..x/...", "/v1/..x/...", None),
        ("/v1/%3Fq%23f", "/v1/%3Fq%23f", None),  # '?' and '#' stay escaped: they would end the path
        ("/100%zz", "/100%25zz", None),  # a '%' that starts no escape is escaped itself
        ("/v1/", "/v1/", None),
        ("/v1?", "/v1", ""),
    ],
)
def test_the_canonical_path(target: str, path: str, query: str | None) -> None:
    assert canonical_target(target) == (path, query, None)


@pytest.mark.parametrize(
    "target",
    [
        # the issue's cases: each is /admin to a normalizing origin
        "/v1/%2E%2E%2Fadmin",
        "/v1/x/..%2f..%2fadmin",
        "/v1/..%2Fadmin",
        "/v1/..;/admin",
        # the same family
        "/v1/../admin",
        "/v1/./x",
        "/v1/..",
        "/v1/.",
        "/v1/%2e%2e/admin",
        "/v1/.%2E/admin",
        "/v1/%2e/admin",
        "/v1/..%5Cadmin",
        "/v1/..\\admin",
        "/v1/..;jsessionid=1/admin",
        "/v1/.;x/admin",
        "/v1/%2e%2e%3b/admin",
        "/v1/..%3B/admin",
        # double encoding
        "/v1/%252e%252e/admin",
        "/v1/%252F",
        "/v1/%25%32%65",
        "/v1/%%32%65",
        "/v1/%2541",
        # control characters, fragments, not a path
        "/v1/x%00.json",
        "/v1/x%0d%0aSet-Cookie:",
        "/v1/\tx",
        "/v1/x#/../../admin",
        "/v1/x?a=1#frag",
        "v1/x",
        "",
        "*",  # only OPTIONS may use it
        "http://other.example.test/x",
    ],
)
def test_targets_refused_whatever_the_policy(target: str) -> None:
    with pytest.raises(AmbiguousTarget):
        canonical_target(target)


def test_asterisk_form_is_for_options_only() -> None:
    assert canonical_target("*", "OPTIONS") == ("*", None, None)
    with pytest.raises(AmbiguousTarget):
        canonical_target("*?x", "OPTIONS")


@pytest.mark.parametrize(
    ("target", "path", "ambiguity"),
    [
        ("/v1/group%2Fproject", "/v1/group%2Fproject", "encoded '/'"),
        ("/v1/group%2fproject", "/v1/group%2Fproject", "encoded '/'"),
        ("/v1/a%5Cb", "/v1/a\\b", "'\\'"),
        ("/v1/a\\b", "/v1/a\\b", "'\\'"),
        ("/admin;x", "/admin;x", "';' path parameter"),
        ("/admin%3Bx", "/admin;x", "';' path parameter"),
        ("/v1//x", "/v1//x", "empty segment"),
        ("//admin", "//admin", "empty segment"),
        ("/v1/%FF", "/v1/%FF", "not UTF-8"),
        ("/v1/%C0%AE%C0%AE/admin", "/v1/%C0%AE%C0%AE/admin", "not UTF-8"),  # overlong '.'
    ],
)
def test_targets_refused_where_a_rule_checks_the_path(target: str, path: str, ambiguity: str) -> None:
    canonical, query, found = canonical_target(target)
    assert (canonical, query) == (path, None)
    assert found is not None and ambiguity in found


# ------------------------------------------------------------------------------ one spelling

SEGMENT_CHARS = st.sampled_from([*"abcXYZ019-._~!$&'()*+,=:@", "ü", "é", "中", " "])
segments = st.text(SEGMENT_CHARS, min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
paths = st.lists(segments, min_size=0, max_size=5).map(lambda parts: "/" + "/".join(parts))


def escape(char: str, upper: bool) -> str:
    return "".join(f"%{byte:02X}" if upper else f"%{byte:02x}" for byte in char.encode())


@settings(max_examples=examples(400), deadline=None)
@given(path=paths, data=st.data())
def test_every_spelling_of_a_path_has_one_canonical_form(path: str, data: st.DataObject) -> None:
    """Escaping any subset of its characters (either hex case) changes nothing."""
    spelled = "".join(
        escape(char, data.draw(st.booleans())) if char != "/" and data.draw(st.booleans()) else char
        for char in path
    )
    assert canonical_target(spelled) == canonical_target(path)
    canonical, _query, ambiguity = canonical_target(path)
    assert ambiguity is None and unquote_to_bytes(canonical) == path.encode()


TRICKY = st.sampled_from(
    [
        *("/", "//", "a", "v1", "admin", ".", "..", "%2e", "%2E", "%2f", "%2F", "%5c", "\\", ";", ";x"),
        *("%3b", "%25", "%252e", "%252f", "%", "32", "e", "%C0%AE", "%00", "?", "#", "x%20y", "%61"),
    ]
)
targets = st.lists(TRICKY, min_size=1, max_size=8).map(lambda parts: "/" + "".join(parts))


def resolve_dots(segments: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for segment in segments:
        if segment == b"..":
            if out:
                out.pop()
        elif segment != b".":
            out.append(segment)
    return out


def nginx(path: bytes) -> bytes:
    """Decode once, then resolve dot segments and merge slashes (nginx's merge_slashes on)."""
    parts = [s for s in unquote_to_bytes(path).split(b"/") if s]
    trailing = path.endswith(b"/") and bool(parts)
    return b"/" + b"/".join(resolve_dots(parts)) + (b"/" if trailing else b"")


def tomcat(path: bytes) -> bytes | None:
    """Strip `;params` from each raw segment, decode, refuse %2F, resolve dot segments."""
    decoded = [unquote_to_bytes(segment.split(b";", 1)[0]) for segment in path.split(b"/")[1:]]
    if any(b"/" in segment for segment in decoded):
        return None
    return b"/" + b"/".join(resolve_dots(decoded))


def double_decoder(path: bytes) -> bytes:
    twice = unquote_to_bytes(unquote_to_bytes(path))
    return b"/" + b"/".join(resolve_dots(twice.split(b"/")[1:]))


def backslash_server(path: bytes) -> bytes:
    decoded = unquote_to_bytes(path).replace(b"\\", b"/")
    return b"/" + b"/".join(resolve_dots(decoded.split(b"/")[1:]))


ORIGINS = (nginx, tomcat, double_decoder, backslash_server)
SOFT_FORMS = re.compile(rb"%2F|%5C|\\|;|%3B|//|%[89A-F][0-9A-F]", re.IGNORECASE)


@settings(max_examples=examples(3000), deadline=None)
@given(target=targets)
def test_an_accepted_target_is_the_path_every_normalizing_origin_serves(target: str) -> None:
    """...and its canonical form is stable (canonical again, it is itself)."""
    try:
        canonical, _query, ambiguity = canonical_target(target)
    except AmbiguousTarget:
        return
    assert canonical_target(canonical) == (canonical, None, ambiguity)
    raw_path = target.partition("?")[0].encode()
    judged = unquote_to_bytes(canonical)
    if ambiguity is None:
        for origin in ORIGINS:
            served = origin(raw_path)
            assert served in (None, judged), (
                f"{origin.__name__} serves {served!r}, the policy judged {judged!r}"
            )
    else:  # refused where a rule checks the path (elsewhere the path decides nothing): never a plain path
        assert SOFT_FORMS.search(raw_path), (target, ambiguity)


# ------------------------------------------------------------------------------ absolute-form


@pytest.mark.parametrize(
    ("authority", "scheme", "host", "port"),
    [
        ("echo.example.test", "https", "echo.example.test", 443),
        ("ECHO.example.test.", "https", "echo.example.test", 443),
        ("echo.example.test:443", "https", "echo.example.test", 443),
        ("echo.example.test:80", "http", "echo.example.test", 80),
        ("echo.example.test:8443", "https", "echo.example.test", 8443),
        ("[2001:db8::1]:443", "https", "2001:db8::1", 443),
        ("bücher.example", "https", "xn--bcher-kva.example", 443),
    ],
)
def test_an_absolute_form_authority_naming_the_connection_is_accepted(
    authority: str, scheme: str, host: str, port: int
) -> None:
    identity = request_identity(scheme, host, port, "get", "/x?y", authority)
    assert identity == RequestIdentity(scheme, host, port, "GET", "/x", "y", None)


@pytest.mark.parametrize(
    "authority",
    [
        "other.example.test",
        "echo.example.test:8443",
        "echo.example.test:80",  # https connection: the default port is 443
        "echo.example.test:x",
        "echo.example.test.other.example.test",
        "198.51.100.10",
        "[2001:db8::1]",
        "",
    ],
)
def test_an_absolute_form_authority_naming_another_target_is_refused(authority: str) -> None:
    with pytest.raises(AmbiguousTarget, match="absolute-form"):
        request_identity("https", "echo.example.test", 443, "GET", "/x", authority)


# ------------------------------------------------------------------------------ in the policy

V1_ONLY = {
    "egress": [
        {"action": "allow", "target": "api.example.com", "methods": ["GET"], "paths": ["/v1/*"]},
        {"action": "allow", "target": "open.example.com"},
        {"action": "allow", "target": "bound.example.com"},
        {"action": "allow", "target": "203.0.113.0/24", "paths": ["/v1/*"]},
    ],
    "bindings": [
        {
            "name": "any",
            "credential": "t",
            "match": {"hosts": ["bound.example.com"]},
            "auth": {"type": "bearer"},
        },
    ],
}


def decide(host: str, path: str, method: str = "GET") -> tuple[str, str]:
    decision = compile_policy(policy_from_dict(V1_ONLY)).decide(Request(host, 443, "https", method, path))
    return decision.action, decision.reason


@pytest.mark.parametrize(
    "path", ["/v1/%2E%2E%2Fadmin", "/v1/x/..%2f..%2fadmin", "/v1/..%2Fadmin", "/v1/..;/admin"]
)
@pytest.mark.parametrize("host", ["api.example.com", "open.example.com", "bound.example.com"])
def test_the_issues_paths_are_refused_on_every_host(host: str, path: str) -> None:
    assert decide(host, path) == ("deny", Reason.AMBIGUOUS_TARGET)


@pytest.mark.parametrize("path", ["/v1/a%2Fb", "/v1/a;b", "/v1//b", "/v1/a%5Cb", "/v1/%FF"])
def test_soft_ambiguities_are_refused_only_where_a_rule_checks_the_path(path: str) -> None:
    assert decide("api.example.com", path) == ("deny", Reason.AMBIGUOUS_TARGET)
    assert decide("203.0.113.9", path) == ("deny", Reason.AMBIGUOUS_TARGET)
    assert decide("open.example.com", path) == ("allow", "rule")
    assert decide("bound.example.com", path) == ("allow", "rule")  # a binding for `/*` checks nothing


@pytest.mark.parametrize("host", ["10.1.2.3", "open.example.com"])
def test_a_path_rule_after_a_rule_without_conditions_checks_nothing(host: str) -> None:
    """The first rule allows every request to the host, so the later path rule is unreachable and
    the soft ambiguity changes nothing (an address's rules were not cut there: Hypothesis found
    `/a%2Fx` to 10.1.2.3 denied as ambiguous)."""
    target = "10.0.0.0/8" if host[0].isdigit() else host
    compiled = compile_policy(
        policy_from_dict(
            {
                "defaultAction": "deny",
                "egress": [
                    {"action": "allow", "target": target},
                    {"action": "allow", "target": target, "paths": ["/a"]},
                ],
            }
        )
    )
    decision = compiled.decide(Request(host, 80, "http", "GET", "/a%2Fx"))
    assert (decision.action, decision.reason, decision.rule) == ("allow", "rule", "<api>:egress[0]")


def test_an_ambiguous_target_is_refused_even_in_report_mode() -> None:
    compiled = compile_policy(policy_from_dict({**V1_ONLY, "mode": "report"}))
    decision = compiled.decide(Request("api.example.com", 443, "https", "GET", "/v1/..;/admin"))
    assert (decision.action, decision.reason, decision.report_only) == (
        "deny",
        Reason.AMBIGUOUS_TARGET,
        False,
    )


def test_a_decoded_spelling_matches_the_rule_it_spells() -> None:
    assert decide("api.example.com", "/%76%31/messages") == ("allow", "rule")
    assert decide("api.example.com", "/v2/messages") == ("deny", "path_not_allowed")
    assert decide("api.example.com", "/%76%32/messages") == ("deny", "path_not_allowed")


def test_an_identity_is_decided_as_it_is() -> None:
    compiled = compile_policy(policy_from_dict(V1_ONLY))
    identity = request_identity("https", "api.example.com", 443, "GET", "/v1/%61")
    assert identity.path == "/v1/a"
    assert compiled.decide(identity) == compiled.decide(
        Request("api.example.com", 443, "https", "GET", "/v1/a")
    )


def test_rule_patterns_are_canonical_too() -> None:
    document = {
        "egress": [{"action": "allow", "target": "wiki.example.com", "paths": ["/wiki/B%C3%BCcher*"]}]
    }
    compiled = compile_policy(policy_from_dict(document))
    for path in ("/wiki/Bücher", "/wiki/B%c3%bccher/x", "/wiki/B%C3%BCcher"):
        assert compiled.decide(Request("wiki.example.com", 443, "https", "GET", path)).allowed, path
    assert canonical_pattern("/v1/.*") == "/v1/.*"  # a prefix may end inside a name such as `.well-known`


@pytest.mark.parametrize(
    "pattern", ["/v1/../admin", "/v1/./x", "/v1/a%2Fb", "/v1//x", "/v1/a;b", "/v1/%252F*"]
)
def test_a_pattern_no_request_could_match_is_a_policy_error(pattern: str) -> None:
    document = {"egress": [{"action": "allow", "target": "api.example.com", "paths": [pattern]}]}
    with pytest.raises(PolicyError, match="can never match"):
        policy_from_dict(document)

"""One broken policy file per fault (tests/policy/testdata/), each reported at its line with a hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy import PolicyError, load_policy

TESTDATA = Path(__file__).parent / "testdata"

# file -> (line, column, words in the message, words in the hint or None)
FAULTS: dict[str, tuple[int, int, str, str | None]] = {
    "unknown_key.yaml": (5, 5, "unknown key 'method'", "did you mean 'methods'"),
    "bad_cidr.yaml": (3, 20, "not a valid CIDR", "203.0.113.0/24"),
    "wildcard_not_leftmost.yaml": (2, 21, "misplaced wildcard", "whole leftmost label"),
    "wildcard_without_dot.yaml": (2, 21, "misplaced wildcard", "subdomains, not example.com"),
    "bare_star_target.yaml": (3, 21, "matches nothing", "defaultAction: allow"),
    "url_as_target.yaml": (2, 21, "is a URL, not a host", "paths:"),
    "port_in_target.yaml": (2, 21, "includes a port", "ports:"),
    "bad_action.yaml": (2, 6, "'allow', 'deny' or 'ask'", None),
    "duplicate_binding_name.yaml": (5, 6, "duplicate binding name 'api'", "bindings[0]"),
    "binding_host_not_allowed.yaml": (
        7,
        32,
        "'upload.example.com' is not covered by an explicit allow",
        "egress",
    ),
    "binding_host_default_allow_only.yaml": (5, 21, "not covered by an explicit allow", "defaultAction"),
    "reserved_header.yaml": (7, 26, "'X-Forwarded-For' is reserved", "reserved:"),
    "binding_host_is_ip.yaml": (6, 13, "must be a fully qualified domain name", "IP addresses"),
    "unknown_auth_type.yaml": (7, 5, "'oauth'", "bearer, basic, apiKey, customHeaders, passthrough"),
    "credential_on_custom_headers.yaml": (4, 5, "does not apply to auth type 'customHeaders'", "per header"),
    "path_without_slash.yaml": (4, 5, "must start with '/'", "/repos/acme/*"),
    "port_out_of_range.yaml": (4, 5, "port 70000 is out of range", "1-65535"),
    "duplicate_key.yaml": (4, 1, "duplicate key 'defaultAction'", "once"),
    "syntax_error.yaml": (3, 5, "syntax error", "indentation"),
    "empty_ports_list.yaml": (2, 46, "empty ports list", "omit `ports`"),
    "bad_version.yaml": (1, 1, "version", None),
    "not_a_mapping.yaml": (1, 1, "a policy is a mapping", "egress:"),
    "invalid_idna.yaml": (2, 21, "not a valid internationalised name", None),
    "oauth2_grant_missing_secret.yaml": (6, 5, "'client_credentials' needs clientSecret", "docs/vault.md"),
    "oauth2_token_url_not_https.yaml": (6, 5, "must be an https URL", "https://auth.example.com"),
    "aws_placeholder_not_a_key_id.yaml": (10, 7, "is not an access key id", "AKIASANDGATEPLACEHOLDER"),
    "budget_on_deny_rule.yaml": (3, 5, "budgets on a deny rule limit nothing", "allow rules"),
    "budget_rate_not_positive.yaml": (3, 3, "requestsPerSecond: Input should be greater than 0", None),
    "budget_bad_byte_count.yaml": (5, 28, "'10MB' is not a byte count", "'10Mi'"),
}


def test_every_testdata_file_has_a_case() -> None:
    assert sorted(path.name for path in TESTDATA.glob("*.yaml")) == sorted(FAULTS)


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_reported_where_it_is(name: str) -> None:
    line, column, message, hint = FAULTS[name]
    with pytest.raises(PolicyError) as caught:
        load_policy(TESTDATA / name)
    issue = caught.value.issues[0]
    assert (issue.file, issue.line, issue.column) == (str(TESTDATA / name), line, column), str(caught.value)
    assert message in issue.message
    if hint is not None:
        assert issue.hint is not None and hint in issue.hint
    assert str(caught.value).startswith(f"{TESTDATA / name}:{line}:{column}: ")


def test_all_problems_of_a_file_are_reported_together(tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(
        "egress:\n"
        "  - {action: allow, target: '*x.example.com'}\n"
        "  - {action: allow, target: 10.0.0.0/40}\n"
        "  - {action: allow, target: ok.example.com, colour: red}\n"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert [issue.line for issue in caught.value.issues] == [2, 3, 4]
    rendered = str(caught.value).splitlines()
    assert len(rendered) == 3 and all(line.startswith(f"{path}:") for line in rendered)


def test_api_bodies_are_located_by_path() -> None:
    from sandgate.policy import policy_from_dict

    with pytest.raises(PolicyError) as caught:
        policy_from_dict(
            {"egress": [{"action": "allow", "target": "ok.example.com"}, {"action": "x", "target": "*"}]}
        )
    assert [str(issue) for issue in caught.value.issues] == [
        "<api>:egress[1].action: action: input should be 'allow', 'deny' or 'ask'",
        "<api>:egress[1].target: target '*' matches nothing (hint: to allow every destination set "
        "`defaultAction: allow`)",
    ]


def test_unreadable_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.yaml")

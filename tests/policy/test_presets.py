"""Presets: `include: [preset:NAME]` brings a preset's rules in after the policy's own, each named
by its file:line in the preset (so `explain` and audit records point into it); a reference that
cannot be satisfied is an error at the include's line listing what there is; `policy fmt` keeps
the include, the enforced document expands it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.policy import (
    PolicyError,
    Presets,
    Request,
    compile_policy,
    parse_policy,
    policy_from_dict,
    to_document,
    to_source_document,
)
from tests.support.cli import sandgate

PRESETS = Path(__file__).parent / "testdata" / "presets"
INDEX = str(PRESETS / "index.yaml")
POLICY = """\
include: [preset:index]
egress:
  - action: deny
    target: files.example.test
    paths: ["/private/*"]
  - action: allow
    target: api.example.test
"""


def test_included_rules_follow_the_own_rules_with_their_line_in_the_preset() -> None:
    policy = parse_policy(POLICY, "p.yaml", Presets((PRESETS,)))
    assert [(r.target, r.origin, r.preset) for r in policy.egress] == [
        ("files.example.test", "p.yaml:3", None),
        ("api.example.test", "p.yaml:6", None),
        ("index.example.test", f"{INDEX}:7", "preset:index@2"),
        ("files.example.test", f"{INDEX}:10", "preset:index@2"),
    ]
    compiled = compile_policy(policy)
    index = compiled.decide(Request("index.example.test", 443, "https", "GET", "/simple/"))
    assert index.allowed and index.rule == f"{INDEX}:7"
    assert not compiled.decide(Request("index.example.test", 80, "http", "GET", "/")).allowed  # HTTPS only
    private = compiled.decide(Request("files.example.test", 443, "https", "GET", "/private/x"))
    assert not private.allowed and private.rule == "p.yaml:3"  # the own deny comes first


def test_the_enforced_document_is_the_expansion_and_the_source_keeps_the_include() -> None:
    policy = parse_policy(POLICY, "p.yaml", Presets((PRESETS,)))
    expanded = policy_from_dict(to_document(policy))  # what the proxy compiles: no preset files needed
    assert "include" not in to_document(policy) and len(expanded.egress) == 4
    source = to_source_document(policy)
    assert source["include"] == ["preset:index"] and len(source["egress"]) == 2


@pytest.mark.parametrize(
    ("reference", "message", "hint"),
    [
        ("preset:nope", "unknown preset 'nope'", f"presets in {PRESETS}: broken, index"),
        ("preset:index@1", "preset 'index' is version 2, not 1", "include preset:index@2"),
        ("pypi", "'pypi' is not a preset reference", "write preset:NAME or preset:NAME@VERSION"),
    ],
)
def test_a_reference_that_cannot_be_met_is_an_error_at_its_line(
    reference: str, message: str, hint: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"egress: []\ninclude:\n  - {reference}\n", "p.yaml", Presets((PRESETS,)))
    [issue] = caught.value.issues
    assert (issue.line, issue.column, issue.message) == (3, 5, message) and hint in (issue.hint or "")


def test_without_preset_directories_the_error_says_so() -> None:
    with pytest.raises(PolicyError, match="no preset directory is configured"):
        parse_policy("include: [preset:index]\n", "p.yaml")


def test_a_broken_preset_is_reported_in_its_own_file() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy("include: [preset:broken]\n", "p.yaml", Presets((PRESETS,)))
    assert caught.value.issues[0].file == str(PRESETS / "broken.yaml") and caught.value.issues[0].line == 5


def test_the_cli_checks_explains_and_formats_with_presets(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text(POLICY)
    presets = ("--preset-dir", str(PRESETS))
    assert sandgate("policy", "check", str(file), *presets).returncode == 0
    assert sandgate("policy", "check", str(file)).returncode == 2  # no preset directory given
    explained = sandgate("policy", "explain", str(file), "https://index.example.test/simple/", *presets)
    assert explained.returncode == 0 and f"rule={INDEX}:7" in explained.stdout
    formatted = sandgate("policy", "fmt", str(file), *presets).stdout
    assert "include: ['preset:index']" in formatted and "index.example.test" not in formatted

"""Changing a policy at runtime in OpenSandbox's semantics, and the two ways of writing one out.

Rules of this module:
1. Every function is pure: it returns a new, fully validated Policy or raises PolicyError, so a
   bad update is rejected whole and the caller's current policy stays in force.
2. `patch_rules` is OpenSandbox's PATCH /policy: incoming rules come first (they take priority),
   the first of several incoming rules with one target wins, and existing rules with a target the
   patch names are dropped; other existing rules keep their order after them.
3. `delete_targets` is OpenSandbox's DELETE /policy: targets not present are ignored.
4. Targets are compared in canonical form (case, trailing dot, IDNA, CIDR spelling).
5. Every result goes through the loader's one validation (`build_policy`) with the caller's rule
   limit; rules and bindings already validated are kept as they are (pydantic does not validate
   a model instance again), the whole-document checks run on the result.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sandgate.policy.compiled import DEFAULT_MAX_RULES
from sandgate.policy.errors import HintedValueError, PolicyError
from sandgate.policy.loader import build_policy, issues_from_validation
from sandgate.policy.models import Binding, EgressRule, Policy
from sandgate.policy.names import parse_target


def replace_policy(
    current: Policy,
    new: Policy | dict[str, Any] | None,
    source: str = "<api>",
    max_rules: int = DEFAULT_MAX_RULES,
) -> Policy:
    """OpenSandbox's PUT /policy: the keys `new` sets replace the current ones.

    An OpenSandbox body ({defaultAction, egress}) keeps the current mode and bindings; empty,
    null or {} means deny-all. A Policy counts only the fields it was built with.
    """
    if isinstance(new, Policy):
        body = {name: getattr(new, name) for name in new.model_fields_set}
    else:
        body = dict(new or {})
    body.setdefault("defaultAction", "deny")
    body.setdefault("egress", [])
    return build_policy({**_fields(current), **body}, source, None, max_rules=max_rules)


def patch_rules(
    policy: Policy,
    rules: list[EgressRule] | list[dict[str, Any]],
    source: str = "<api>",
    max_rules: int = DEFAULT_MAX_RULES,
) -> Policy:
    """OpenSandbox's PATCH /policy: merge `rules` by target, incoming rules first."""
    incoming = _validated_rules(rules, source)
    first_by_target: dict[str, EgressRule] = {}
    for rule in incoming:
        first_by_target.setdefault(rule.target, rule)
    kept = [rule for rule in policy.egress if rule.target not in first_by_target]
    return _rebuild(policy, {"egress": [*first_by_target.values(), *kept]}, source, max_rules)


def delete_targets(
    policy: Policy, targets: list[str], source: str = "<api>", max_rules: int = DEFAULT_MAX_RULES
) -> Policy:
    """OpenSandbox's DELETE /policy: drop every rule with one of these targets (idempotent)."""
    doomed = {_canonical_target(target) for target in targets}
    kept = [rule for rule in policy.egress if rule.target not in doomed]
    return _rebuild(policy, {"egress": kept}, source, max_rules)


def add_bindings(
    policy: Policy,
    bindings: list[Binding] | list[dict[str, Any]],
    source: str = "<api>",
    max_rules: int = DEFAULT_MAX_RULES,
) -> Policy:
    """`policy` with more bindings (a sandbox's credential vault), validated with it: each
    binding's hosts must be allowed by an explicit rule."""
    return _rebuild(policy, {"bindings": [*policy.bindings, *bindings]}, source, max_rules)


def to_opensandbox(policy: Policy) -> dict[str, Any]:
    """The OpenSandbox `networkPolicy` view: {defaultAction, egress: [{action, target}]}.

    Lossy for sandgate extensions (ports, schemes, methods, paths, inspect, bindings); `ask`,
    which OpenSandbox lacks, shows as `deny`: what a request gets without a reviewer's answer.
    """
    return {
        "defaultAction": _opensandbox_action(policy.defaultAction),
        "egress": [
            {"action": _opensandbox_action(rule.action), "target": rule.target} for rule in policy.egress
        ],
    }


def _opensandbox_action(action: str) -> str:
    return "deny" if action == "ask" else action


def to_document(policy: Policy) -> dict[str, Any]:
    """The full sandgate document, JSON-able, with presets expanded (what a sandbox keeps and the
    proxy compiles: neither needs the preset files); `policy_from_dict(to_document(p))` equals
    `p` but for `include`, whose rules it holds."""
    return _document(policy, policy.egress)


def to_source_document(policy: Policy) -> dict[str, Any]:
    """The document as its author wrote it: its own rules and its `include` (for `policy fmt`)."""
    document = _document(policy, [rule for rule in policy.egress if rule.preset is None])
    if policy.include:
        document["include"] = list(policy.include)
    return document


def _document(policy: Policy, rules: list[EgressRule]) -> dict[str, Any]:
    document: dict[str, Any] = {
        "version": policy.version,
        "defaultAction": policy.defaultAction,
        "mode": policy.mode,
        "egress": [_rule_document(rule) for rule in rules],
    }
    if policy.askTimeout != Policy.model_fields["askTimeout"].default:
        document["askTimeout"] = policy.askTimeout
    if policy.bindings:
        document["bindings"] = [
            binding.model_dump(mode="json", by_alias=True, exclude_none=True) for binding in policy.bindings
        ]
    if policy.budgets is not None:
        document["budgets"] = policy.budgets.model_dump(mode="json", by_alias=True, exclude_none=True)
    return document


def _rule_document(rule: EgressRule) -> dict[str, Any]:
    data = rule.model_dump(mode="json", by_alias=True, exclude_none=True)
    if data.get("inspect") == "auto":
        del data["inspect"]
    return data


def _fields(policy: Policy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in Policy.model_fields}


def _validated_rules(rules: list[EgressRule] | list[dict[str, Any]], source: str) -> list[EgressRule]:
    validated: list[EgressRule] = []
    issues = []
    for index, rule in enumerate(rules):
        if isinstance(rule, EgressRule):
            validated.append(rule)
            continue
        try:
            validated.append(EgressRule.model_validate(rule))
        except ValidationError as exc:
            issues.extend(issues_from_validation(exc, source, None, prefix=(index,)))
    if issues:
        raise PolicyError(issues)
    return validated


def _rebuild(policy: Policy, changed: dict[str, Any], source: str, max_rules: int) -> Policy:
    """A validated copy of `policy` with `changed` fields; rules without an id get
    `<source>:egress[i]`."""
    return build_policy({**_fields(policy), **changed}, source, None, max_rules=max_rules)


def _canonical_target(target: str) -> str:
    try:
        return parse_target(target).text
    except HintedValueError:
        return target.strip().lower()

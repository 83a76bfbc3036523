"""sandgate.policy as the control plane sees it: OpenSandbox shapes and documents in, `Policy` out.

Rules:
1. Inside lifecycle a sandbox's policy is a `sandgate.policy.Policy`, the typed model of the
   policy file, and it reaches the proxy as that type (`SandboxEntry.policy`). Its JSON form
   (`sandgate.policy.to_document`) exists only at the edges: the sandbox store's column, the
   control socket, the audit record and the API's answers.
2. Every `Policy` that leaves the book went through sandgate.policy's one validation with the
   deployment's rule limit; a bad one is a `ValueError` (`PolicyError`) saying where and why.
3. `NetworkPolicy` (opensandbox_shapes.py) is the OpenSandbox shape: what the lifecycle API's
   create and `/networkpolicy`, and the egress API's `/policy`, speak.
4. A ceiling bounds every policy the book hands out for a sandbox: the deployment's
   (`policy_ceiling`) and, when the caller has one, a tenant's; both must allow
   (sandgate.policy.within_ceiling, docs/policy.md "Ceilings").
5. No networkPolicy at create means the operator's default policy (the `default_policy`
   setting) or, without one, deny everything (egress-first), unlike OpenSandbox, which leaves
   egress open.
"""

from __future__ import annotations

from typing import Any, Protocol

from sandgate.lifecycle.opensandbox_shapes import NetworkPolicy, NetworkRule
from sandgate.policy import (
    WITHIN,
    CeilingDecision,
    Policy,
    Presets,
    add_bindings,
    delete_targets,
    patch_rules,
    policy_from_dict,
    replace_policy,
    to_opensandbox,
    within_ceiling,
)

# A policy file's JSON, or a binding's: free-form until `policy_from_dict` checks it, so that a
# fault is reported with its place in the document (bindings[2].auth...), not as a 422.
PolicyJSON = dict[str, Any]


class PolicyBook(Protocol):
    def from_opensandbox(self, network_policy: NetworkPolicy | None) -> Policy: ...
    def parse(self, document: PolicyJSON) -> Policy: ...
    def with_bindings(self, policy: Policy, bindings: list[PolicyJSON]) -> Policy: ...
    def to_opensandbox(self, policy: Policy) -> NetworkPolicy: ...
    def replace_opensandbox(self, policy: Policy, wanted: NetworkPolicy | None) -> Policy: ...
    def patch_rules(self, policy: Policy, rules: list[NetworkRule]) -> Policy: ...
    def delete_targets(self, policy: Policy, targets: list[str]) -> Policy: ...
    def within_ceilings(self, policy: Policy, ceiling: Policy | None = None) -> CeilingDecision: ...


class SandgatePolicies:
    """`PolicyBook` on sandgate.policy, with the deployment's rule limit."""

    def __init__(
        self,
        max_rules: int,
        default: Policy | None = None,
        presets: Presets | None = None,
        ceiling: Policy | None = None,
    ) -> None:
        self.max_rules = max_rules
        self.ceiling = ceiling
        self.presets = presets or Presets()
        self.default = default if default is not None else policy_from_dict({})

    def from_opensandbox(self, network_policy: NetworkPolicy | None) -> Policy:
        return self.parse(network_policy.wire()) if network_policy else self.default

    def parse(self, document: PolicyJSON) -> Policy:
        return policy_from_dict(document, presets=self.presets, max_rules=self.max_rules)

    def with_bindings(self, policy: Policy, bindings: list[PolicyJSON]) -> Policy:
        """`policy` with more bindings, validated together (a binding's host must be allowed)."""
        return add_bindings(policy, bindings, max_rules=self.max_rules)

    def to_opensandbox(self, policy: Policy) -> NetworkPolicy:
        return NetworkPolicy.model_validate(to_opensandbox(policy))

    def replace_opensandbox(self, policy: Policy, wanted: NetworkPolicy | None) -> Policy:
        return replace_policy(policy, wanted.wire() if wanted else None, max_rules=self.max_rules)

    def patch_rules(self, policy: Policy, rules: list[NetworkRule]) -> Policy:
        return patch_rules(policy, [rule.model_dump() for rule in rules], max_rules=self.max_rules)

    def delete_targets(self, policy: Policy, targets: list[str]) -> Policy:
        return delete_targets(policy, targets, max_rules=self.max_rules)

    def within_ceilings(self, policy: Policy, ceiling: Policy | None = None) -> CeilingDecision:
        """The deployment's ceiling and `ceiling` (a tenant's) must both allow `policy` (rule 4)."""
        for bound in (self.ceiling, ceiling):
            if bound is not None and not (decision := within_ceiling(bound, policy)).allowed:
                return decision
        return WITHIN

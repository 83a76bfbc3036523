"""sandgate.policy as the control plane sees it: documents in, validated documents out.

Rules:
1. A `PolicyDocument` is the sandgate policy file model as JSON (what `sandgate.policy.to_document`
   returns): that is what the store keeps, the proxy's entry carries and the audit log diffs.
   Lifecycle never looks inside one except to add the credential vault's bindings.
2. Every document that leaves the book went through `validate` (or an update of sandgate.policy
   that validates), so a stored or pushed policy always compiles; a bad one is a `ValueError`
   (`PolicyError`) saying where and why.
3. No networkPolicy at create means deny everything (egress-first), unlike OpenSandbox.
"""

from __future__ import annotations

from typing import Any, Protocol

from sandgate.policy import (
    delete_targets,
    patch_rules,
    policy_from_dict,
    replace_policy,
    to_document,
    to_opensandbox,
)

PolicyDocument = dict[str, Any]  # rule 1
OpenSandboxPolicy = dict[str, Any]  # a NetworkPolicy of the OpenSandbox API, as JSON


class PolicyBook(Protocol):
    def from_opensandbox(self, network_policy: OpenSandboxPolicy | None) -> PolicyDocument: ...
    def validate(self, document: PolicyDocument) -> PolicyDocument: ...
    def to_opensandbox(self, document: PolicyDocument) -> OpenSandboxPolicy: ...
    def replace_opensandbox(
        self, document: PolicyDocument, wanted: OpenSandboxPolicy | None
    ) -> PolicyDocument: ...
    def patch_rules(self, document: PolicyDocument, rules: list[dict[str, str]]) -> PolicyDocument: ...
    def delete_targets(self, document: PolicyDocument, targets: list[str]) -> PolicyDocument: ...


class SandgatePolicies:
    """`PolicyBook` on sandgate.policy, with the deployment's rule limit."""

    def __init__(self, max_rules: int) -> None:
        self.max_rules = max_rules

    def from_opensandbox(self, network_policy: OpenSandboxPolicy | None) -> PolicyDocument:
        return self.validate(network_policy or {})

    def validate(self, document: PolicyDocument) -> PolicyDocument:
        policy = policy_from_dict(document)
        if len(policy.egress) > self.max_rules:
            raise ValueError(
                f"{len(policy.egress)} rules exceed the limit of {self.max_rules} (policy_max_rules)"
            )
        return to_document(policy)

    def to_opensandbox(self, document: PolicyDocument) -> OpenSandboxPolicy:
        return to_opensandbox(policy_from_dict(document))

    def replace_opensandbox(
        self, document: PolicyDocument, wanted: OpenSandboxPolicy | None
    ) -> PolicyDocument:
        return to_document(replace_policy(policy_from_dict(document), wanted, max_rules=self.max_rules))

    def patch_rules(self, document: PolicyDocument, rules: list[dict[str, str]]) -> PolicyDocument:
        return to_document(patch_rules(policy_from_dict(document), rules, max_rules=self.max_rules))

    def delete_targets(self, document: PolicyDocument, targets: list[str]) -> PolicyDocument:
        return to_document(delete_targets(policy_from_dict(document), targets))

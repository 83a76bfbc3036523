"""What the console pages show, computed from the audit index and the sandbox list; no HTTP here.

Rules: pure functions from index/sandbox data to template values. Policy diffs come from
policy_change records whose `detail` is a `PolicyChange` (lifecycle/audit/policy_change.py,
docs/audit.md): old/new are the policy or vault-state documents (rule and binding names, never
secret values).
"""

from __future__ import annotations

import difflib
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from sandgate.lifecycle.audit import PolicyChange


class ConsoleSandbox(BaseModel):
    """What the console needs of one sandbox; build it from dicts or from lifecycle's objects."""

    model_config = ConfigDict(from_attributes=True, extra="ignore")

    id: str
    status: str = "Running"
    address: str | None = None
    policy: dict[str, Any] = Field(default_factory=dict)  # the policy file's JSON, shown as YAML

    @property
    def rule_count(self) -> int:
        egress = self.policy.get("egress")
        return len(egress) if isinstance(egress, list) else 0

    @property
    def binding_names(self) -> list[str]:
        bindings = self.policy.get("bindings") or []
        if isinstance(bindings, dict):
            return sorted(bindings)
        return [str(b.get("name")) for b in bindings if isinstance(b, dict)]


def policy_yaml(document: dict[str, Any] | None) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False) if document else ""


def policy_diff(change: PolicyChange) -> list[tuple[str, str]]:
    """Unified diff lines of old -> new policy YAML as (kind, text); kind: add, del, hunk, ctx."""
    if not change.has_documents:
        return []
    lines = difflib.unified_diff(
        policy_yaml(change.old).splitlines(),
        policy_yaml(change.new).splitlines(),
        fromfile=f"old {change.old_digest or ''}".strip(),
        tofile=f"new {change.new_digest or ''}".strip(),
        lineterm="",
        n=3,
    )
    return [(_diff_kind(line), line) for line in lines]


def _diff_kind(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")

"""What the console pages show, computed from the audit index and the sandbox list; no HTTP here.

Rules: pure functions from index/sandbox data to template values. Policy diffs come from
policy_change records whose `detail` is the JSON summary lifecycle writes (docs/audit.md):
`{"actor", "revision", "old_digest", "new_digest", "old", "new"}` where old/new are the policy
documents (they hold rule and binding names, never secret values).
"""

from __future__ import annotations

import difflib
import json
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field


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


class PolicyChange(BaseModel):
    """The parsed `detail` of a policy_change record; tolerant of missing fields."""

    model_config = ConfigDict(extra="ignore")

    actor: str | None = None
    revision: int | str | None = None
    old_digest: str | None = None
    new_digest: str | None = None
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None

    @property
    def has_documents(self) -> bool:
        return self.old is not None or self.new is not None

    @classmethod
    def from_detail(cls, detail: str | None) -> PolicyChange:
        try:
            data = json.loads(detail or "{}")
        except ValueError:
            return cls()
        return cls.model_validate(data) if isinstance(data, dict) else cls()


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

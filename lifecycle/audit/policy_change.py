"""The `detail` of a policy_change audit record: egress control writes it, the console reads it.

Rules:
1. `old`/`new` are whole documents, a policy's or a credential-vault state's stored JSON (rule,
   binding and vault entry names, never a value), so a reviewer can diff them (docs/audit.md).
2. One model for the writer and the reader. The writer fills every field; `to_detail` is the
   JSON every version wrote (keys sorted).
3. Reading never fails: records of older servers lack fields (then None), and a detail that is
   not a JSON object reads as an empty change.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict


class PolicyChange(BaseModel):
    model_config = ConfigDict(extra="ignore")

    actor: str | None = None
    change: str | None = None
    old_revision: int | None = None
    revision: int | str | None = None
    old_digest: str | None = None
    new_digest: str | None = None
    old: dict[str, Any] | None = None  # rule 1: the stored JSON of either document kind, as the
    new: dict[str, Any] | None = None  # server that wrote the record stored it
    isolation: str | None = None  # a create's: the sandbox's isolation (lifecycle/isolation.py)

    @property
    def has_documents(self) -> bool:
        return self.old is not None or self.new is not None

    def to_detail(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True)

    @classmethod
    def from_detail(cls, detail: str | None) -> PolicyChange:
        try:
            data = json.loads(detail or "{}")
        except ValueError:
            return cls()
        return cls.model_validate(data) if isinstance(data, dict) else cls()

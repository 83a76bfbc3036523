"""Policy errors: every problem carries where it is (file:line:column) and how to fix it.

A `PolicyError` holds all problems found in one document, not just the first, so `sandgate policy
check` can show a user everything at once. Sources without line numbers (API bodies) locate a
problem by its path in the document instead, e.g. `<api>:egress[3].target`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyIssue:
    """One problem in a policy document; line and column are 1-based, 0 when unknown."""

    file: str
    line: int
    column: int
    message: str
    hint: str | None = None
    path: str = ""

    @property
    def location(self) -> str:
        if self.line:
            return f"{self.file}:{self.line}:{self.column}"
        return f"{self.file}:{self.path}" if self.path else self.file

    def __str__(self) -> str:
        text = f"{self.location}: {self.message}"
        return f"{text} (hint: {self.hint})" if self.hint else text


class PolicyError(ValueError):
    """A policy document (or an update to one) was rejected; `issues` lists every reason."""

    def __init__(self, issues: list[PolicyIssue]) -> None:
        super().__init__("\n".join(str(issue) for issue in issues))
        self.issues = issues

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)


class HintedValueError(ValueError):
    """Raised inside model validators so the loader can report the hint next to the message."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def check_rule_limit(count: int, max_rules: int) -> None:
    """The rule limit (the setting policy_max_rules), checked by the one validation every policy
    goes through (loader.build_policy)."""
    if count > max_rules:
        raise PolicyError(
            [
                PolicyIssue(
                    "<policy>",
                    0,
                    0,
                    f"policy has {count} egress rules; the limit is {max_rules}",
                    "merge rules with wildcards or CIDRs, or raise the limit (the setting policy_max_rules)",
                    "egress",
                )
            ]
        )

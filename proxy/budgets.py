"""Budgets: how many requests per second a sandbox, and each host one of its rules matches, may send.

Rules:
1. One token bucket per scope: the sandbox (its policy's `budgets`) and each (rule, host) pair of
   a rule with `budgets`. A request goes only if every bucket that applies has a token; only then
   is one taken from each, so a refused request spends nothing.
2. Checked at request level (plain HTTP and intercepted TLS), after the decision allowed the
   request and before anything goes upstream; refused: 429, reason `budget`, `Retry-After` and a
   detail naming the budget, recorded like any refusal. Pass-through connections carry no
   requests the proxy can count: they are not budgeted (docs/proxy.md says what is left).
3. Per process: with N workers each enforces `requestsPerSecond / N` and `ceil(burst / N)` (the
   kernel spreads a sandbox's connections evenly; the fairness limits divide the same way), with
   no counter shared between processes.
4. Buckets are keyed by the sandbox's address (its identity here). A bucket whose budget changed
   starts afresh; a dropped sandbox's buckets go with it (`forget`, on the table's change). A rule
   with a wildcard target has one bucket per host it met, at most MAX_SCOPES per sandbox (then
   the oldest is forgotten: a sandbox cannot grow the proxy's memory by naming hosts).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sandgate.policy import Budget

MAX_SCOPES = 4096
EPSILON = 1e-9  # a token refilled in pieces (0.1 s x 10/s) may add up to 0.9999999


@dataclass
class Bucket:
    rate: float
    capacity: float
    tokens: float
    stamp: float

    def wait(self, now: float) -> float:
        """Refill to `now`; 0 if a token is there, else the seconds until one is."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return 0.0 if self.tokens >= 1 - EPSILON else (1 - self.tokens) / self.rate


@dataclass(frozen=True)
class OverBudget:
    detail: str
    retry_after: int  # seconds


class Budgets:
    def __init__(self, share: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.share = max(1, share)
        self.clock = clock
        self._buckets: dict[str, OrderedDict[tuple[str, ...], tuple[Budget, Bucket]]] = {}

    def admit(
        self,
        address: str,
        sandbox_budget: Budget | None,
        rule: str | None,
        rule_budget: Budget | None,
        host: str,
    ) -> OverBudget | None:
        """None: the request may go (a token taken from each bucket); else why not (rule 1)."""
        scopes: list[tuple[tuple[str, ...], Budget, str]] = []
        if sandbox_budget is not None:
            scopes.append((("sandbox",), sandbox_budget, f"the sandbox's budget of {_rate(sandbox_budget)}"))
        if rule_budget is not None and rule is not None:
            where = f"the budget of rule {rule} for {host}, {_rate(rule_budget)}"
            scopes.append((("rule", rule, host), rule_budget, where))
        if not scopes:
            return None
        now = self.clock()
        buckets = [(self._bucket(address, key, budget, now), where) for key, budget, where in scopes]
        for bucket, where in buckets:
            if (wait := bucket.wait(now)) > 0:
                return OverBudget(f"{where}, is spent; retry in {wait:.2f} s", max(1, math.ceil(wait)))
        for bucket, _ in buckets:
            bucket.tokens -= 1
        return None

    def forget(self, address: str) -> None:
        self._buckets.pop(address, None)

    def _bucket(self, address: str, key: tuple[str, ...], budget: Budget, now: float) -> Bucket:
        scopes = self._buckets.setdefault(address, OrderedDict())
        held = scopes.get(key)
        if held is None or held[0] != budget:
            capacity = max(1.0, math.ceil(budget.capacity / self.share))
            held = (budget, Bucket(budget.requestsPerSecond / self.share, capacity, capacity, now))
            scopes[key] = held
            while len(scopes) > MAX_SCOPES:
                scopes.popitem(last=False)
        return held[1]


def _rate(budget: Budget) -> str:
    return f"{budget.requestsPerSecond:g} requests/s (burst {budget.capacity:g})"

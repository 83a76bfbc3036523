"""Budgets: how many requests per second, and how many bytes in all, a sandbox and each host one
of its rules matches may use.

Rules:
1. One scope per budget that applies: the sandbox (its policy's `budgets`) and each (rule, host)
   pair of a rule with `budgets`. A scope holds a token bucket of requests (`requestsPerSecond`),
   one of bytes each way (`bytesPerSecond`, one second's worth at once, at least MIN_BYTE_BURST)
   and the bytes used each way (`totalBytes`). A request goes only if every scope has room: a
   token, no byte bucket in debt, bytes left; only then is a token taken from each, so a refused
   request spends nothing. A new pass-through connection needs bytes left only (it carries no
   requests the proxy can count); the splice then takes byte tokens for each chunk and parks a
   direction until its buckets have MIN_BYTE_BURST again (`Throttle`).
2. Checked after the decision allowed a request (plain HTTP, intercepted TLS) and before anything
   goes upstream: refused, it is a 429 with reason `budget`, `Retry-After` and a detail naming
   the budget, recorded like any refusal; a pass-through connection is closed at its ClientHello
   with a `connection` record with reason `budget`. Bytes are spent when they are known: a
   request's body sizes when it ends (into the byte buckets too, which may go into debt: the next
   request waits until it is paid), a pass-through connection's relayed bytes when it closes
   (its byte buckets were spent chunk by chunk); so the last request or connection that fits may
   go over a total by its own size.
3. Per process: with N workers each enforces `requestsPerSecond / N`, `ceil(burst / N)` and
   `ceil(total / N)` (the kernel spreads a sandbox's connections evenly; the fairness limits
   divide the same way), with no counter shared between processes.
4. Scopes are keyed by the sandbox's address (its identity here). A changed budget gets a new
   bucket and keeps the bytes used; a dropped sandbox's scopes go with it (`forget`, on the
   table's change). A rule with a wildcard target has one scope per host it met, at most
   MAX_SCOPES per sandbox (then the oldest is forgotten: a sandbox cannot grow the proxy's memory
   by naming hosts).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sandgate.policy import Budget

MAX_SCOPES = 4096
MIN_BYTE_BURST = 16 * 1024  # a byte bucket holds at least this, so a throttled splice moves chunks
EPSILON = 1e-9  # a token refilled in pieces (0.1 s x 10/s) may add up to 0.9999999


@dataclass
class Bucket:
    rate: float
    capacity: float
    tokens: float
    stamp: float

    def wait(self, now: float) -> float:
        """Refill to `now`; 0 if a token is there, else the seconds until one is."""
        tokens = self.refill(now)
        return 0.0 if tokens >= 1 - EPSILON else (1 - tokens) / self.rate

    def refill(self, now: float) -> float:
        """The tokens at `now` (negative: a debt being paid off)."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return self.tokens


@dataclass
class Scope:
    budget: Budget
    bucket: Bucket | None
    bytes_in: Bucket | None = None
    bytes_out: Bucket | None = None
    used_in: int = 0
    used_out: int = 0

    def byte_buckets(self) -> list[tuple[str, Bucket]]:
        return [(way, b) for way, b in (("in", self.bytes_in), ("out", self.bytes_out)) if b is not None]


@dataclass(frozen=True)
class OverBudget:
    detail: str
    retry_after: int | None  # seconds; None: not by waiting (a total is spent)


@dataclass(frozen=True)
class Subject:
    """Whose budgets: a sandbox (by address) with its policy's budget, and the rule (with its
    budget) and host a request or connection was allowed by."""

    address: str
    sandbox_budget: Budget | None
    rule: str | None
    rule_budget: Budget | None
    host: str

    def applies(self) -> list[tuple[tuple[str, ...], Budget, str]]:
        """(scope key, budget, how a detail names it) for each budget that applies."""
        applies: list[tuple[tuple[str, ...], Budget, str]] = []
        if self.sandbox_budget is not None:
            applies.append((("sandbox",), self.sandbox_budget, "the sandbox's budget"))
        if self.rule_budget is not None and self.rule is not None:
            where = f"the budget of rule {self.rule} for {self.host}"
            applies.append((("rule", self.rule, self.host), self.rule_budget, where))
        return applies


class Budgets:
    def __init__(self, share: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.share = max(1, share)
        self.clock = clock
        self._scopes: dict[str, OrderedDict[tuple[str, ...], Scope]] = {}

    def admit(self, subject: Subject, request: bool = True) -> OverBudget | None:
        """None: it may go (a request takes a token from each bucket); else why not (rule 1)."""
        now = self.clock()
        applies = subject.applies()
        scopes = [(self._scope(subject.address, key, budget, now), where) for key, budget, where in applies]
        for scope, where in scopes:
            if spent := self._spent_direction(scope):
                return OverBudget(f"{where}: {spent} is spent", None)
        if not request:
            return None
        for scope, where in scopes:
            for way, byte_bucket in scope.byte_buckets():
                if (debt := -byte_bucket.refill(now)) > 0:
                    wait = debt / byte_bucket.rate
                    spent = f"bytesPerSecond {way} {_bytes_rate(scope.budget, way)}"
                    return OverBudget(
                        f"{where}: {spent} is spent; retry in {wait:.2f} s", max(1, math.ceil(wait))
                    )
            if scope.bucket is not None and (wait := scope.bucket.wait(now)) > 0:
                return OverBudget(f"{where}: {_rate(scope.budget)} is spent; retry in {wait:.2f} s",
                                  max(1, math.ceil(wait)))  # fmt: skip
        for scope, _ in scopes:
            if scope.bucket is not None:
                scope.bucket.tokens -= 1
        return None

    def spend(self, subject: Subject, bytes_in: int, bytes_out: int, request: bool = True) -> None:
        """Count bytes moved; `request` False: a spliced connection, whose Throttle took its byte
        tokens already."""
        now = self.clock()
        for key, budget, _ in subject.applies():
            scope = self._scope(subject.address, key, budget, now)
            scope.used_in += bytes_in
            scope.used_out += bytes_out
            if request:  # a pass-through connection's byte buckets were spent by its Throttle
                for way, byte_bucket in scope.byte_buckets():
                    byte_bucket.refill(now)
                    byte_bucket.tokens -= bytes_in if way == "in" else bytes_out

    def throttle(self, subject: Subject, way: str) -> Throttle | None:
        """The byte buckets a pass-through connection's `way` ("in"/"out") is slowed by, if any."""
        now = self.clock()
        buckets = []
        for key, budget, _ in subject.applies():
            scope = self._scope(subject.address, key, budget, now)
            buckets += [bucket for bucket_way, bucket in scope.byte_buckets() if bucket_way == way]
        return Throttle(buckets, self.clock) if buckets else None

    def _byte_bucket(self, rate: int | None, now: float) -> Bucket | None:
        if rate is None:
            return None
        share = rate / self.share
        capacity = max(float(MIN_BYTE_BURST), share)
        return Bucket(share, capacity, capacity, now)

    def forget(self, address: str) -> None:
        self._scopes.pop(address, None)

    def _spent_direction(self, scope: Scope) -> str | None:
        total = scope.budget.totalBytes
        if total is None:
            return None
        for used, limit, way in ((scope.used_in, total.in_, "in"), (scope.used_out, total.out, "out")):
            if limit is not None and used >= math.ceil(limit / self.share):
                return f"totalBytes {way} {limit} (used {used * self.share})"
        return None

    def _scope(self, address: str, key: tuple[str, ...], budget: Budget, now: float) -> Scope:
        scopes = self._scopes.setdefault(address, OrderedDict())
        scope = scopes.get(key)
        if scope is None or scope.budget != budget:
            bucket = None
            if budget.requestsPerSecond is not None:
                capacity = max(1.0, math.ceil(budget.capacity / self.share))
                bucket = Bucket(budget.requestsPerSecond / self.share, capacity, capacity, now)
            used = (scope.used_in, scope.used_out) if scope else (0, 0)
            rates = budget.bytesPerSecond
            scope = scopes[key] = Scope(
                budget,
                bucket,
                self._byte_bucket(rates.in_ if rates else None, now),
                self._byte_bucket(rates.out if rates else None, now),
                *used,
            )
            while len(scopes) > MAX_SCOPES:
                scopes.popitem(last=False)
        return scope


class Throttle:
    """What a splice direction may move now: `allowance(most)` is (bytes, 0.0) or (0, seconds to
    wait); `spend(n)` takes n bytes from every bucket (rule 1)."""

    def __init__(self, buckets: list[Bucket], clock: Callable[[], float]) -> None:
        self.buckets, self.clock = buckets, clock

    def allowance(self, most: int) -> tuple[int, float]:
        now = self.clock()
        room = min(bucket.refill(now) for bucket in self.buckets)
        if room >= 1:
            return min(most, int(room)), 0.0
        return 0, max((min(MIN_BYTE_BURST, b.capacity) - b.tokens) / b.rate for b in self.buckets)

    def spend(self, n: int) -> None:
        for bucket in self.buckets:
            bucket.tokens -= n


def _bytes_rate(budget: Budget, way: str) -> str:
    rates = budget.bytesPerSecond
    return f"{(rates.in_ if way == 'in' else rates.out) if rates else 0}/s"


def _rate(budget: Budget) -> str:
    return f"{budget.requestsPerSecond:g} requests/s (burst {budget.capacity:g})"

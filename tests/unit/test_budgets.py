"""The budget buckets alone (proxy/budgets.py), on a clock of the test's own."""

from __future__ import annotations

from sandgate.policy import Budget
from sandgate.proxy.budgets import MAX_SCOPES, Budgets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_rate_and_a_refusal_spends_nothing() -> None:
    clock = Clock()
    budgets = Budgets(clock=clock)
    sandbox, rule = Budget(requestsPerSecond=10, burst=3), Budget(requestsPerSecond=1)
    admit = lambda host: budgets.admit("10.0.0.2", sandbox, "r1", rule, host)  # noqa: E731
    assert admit("a.example.com") is None  # sandbox 3 -> 2, rule(a) 1 -> 0
    over = admit("a.example.com")
    assert over is not None and "the budget of rule r1 for a.example.com" in over.detail
    assert over.retry_after == 1
    assert admit("b.example.com") is None and admit("c.example.com") is None  # the refusal took nothing
    assert "the sandbox's budget of 10 requests/s (burst 3)" in (admit("d.example.com") or over).detail
    clock.now += 0.1  # one sandbox token back
    assert admit("d.example.com") is None


def test_each_worker_has_its_share_and_a_changed_budget_starts_afresh() -> None:
    clock = Clock()
    budgets = Budgets(share=2, clock=clock)
    budget = Budget(requestsPerSecond=4, burst=4)
    taken = sum(budgets.admit("10.0.0.2", budget, None, None, "x") is None for _ in range(10))
    assert taken == 2  # ceil(4 / 2)
    bigger = Budget(requestsPerSecond=4, burst=8)
    assert sum(budgets.admit("10.0.0.2", bigger, None, None, "x") is None for _ in range(10)) == 4


def test_a_sandbox_cannot_grow_the_buckets_by_naming_hosts() -> None:
    budgets = Budgets(clock=Clock())
    rule = Budget(requestsPerSecond=1)
    for n in range(MAX_SCOPES + 50):
        budgets.admit("10.0.0.2", None, "r", rule, f"h{n}.example.com")
    assert len(budgets._buckets["10.0.0.2"]) == MAX_SCOPES
    budgets.forget("10.0.0.2")
    assert "10.0.0.2" not in budgets._buckets

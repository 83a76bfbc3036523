"""The budget buckets alone (proxy/budgets.py), on a clock of the test's own."""

from __future__ import annotations

from sandgate.policy import Budget
from sandgate.proxy.budgets import MAX_SCOPES, Budgets, Subject


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_rate_and_a_refusal_spends_nothing() -> None:
    clock = Clock()
    budgets = Budgets(clock=clock)
    sandbox, rule = Budget(requestsPerSecond=10, burst=3), Budget(requestsPerSecond=1)
    admit = lambda host: budgets.admit(Subject("10.0.0.2", sandbox, "r1", rule, host))  # noqa: E731
    assert admit("a.example.com") is None  # sandbox 3 -> 2, rule(a) 1 -> 0
    over = admit("a.example.com")
    assert over is not None and "the budget of rule r1 for a.example.com: 1 requests/s" in over.detail
    assert over.retry_after == 1
    assert admit("b.example.com") is None and admit("c.example.com") is None  # the refusal took nothing
    assert "the sandbox's budget: 10 requests/s (burst 3)" in (admit("d.example.com") or over).detail
    clock.now += 0.1  # one sandbox token back
    assert admit("d.example.com") is None


def test_each_worker_has_its_share_and_a_changed_budget_starts_afresh() -> None:
    clock = Clock()
    budgets = Budgets(share=2, clock=clock)
    budget = Budget(requestsPerSecond=4, burst=4)
    taken = sum(budgets.admit(Subject("10.0.0.2", budget, None, None, "x")) is None for _ in range(10))
    assert taken == 2  # ceil(4 / 2)
    bigger = Budget(requestsPerSecond=4, burst=8)
    assert sum(budgets.admit(Subject("10.0.0.2", bigger, None, None, "x")) is None for _ in range(10)) == 4


def test_a_sandbox_cannot_grow_the_scopes_by_naming_hosts() -> None:
    budgets = Budgets(clock=Clock())
    rule = Budget(requestsPerSecond=1)
    for n in range(MAX_SCOPES + 50):
        budgets.admit(Subject("10.0.0.2", None, "r", rule, f"h{n}.example.com"))
    assert len(budgets._scopes["10.0.0.2"]) == MAX_SCOPES
    budgets.forget("10.0.0.2")
    assert "10.0.0.2" not in budgets._scopes


def test_totals_each_way_shared_by_the_workers_and_kept_across_a_changed_budget() -> None:
    budgets = Budgets(share=2, clock=Clock())
    total = Budget.model_validate({"totalBytes": {"in": "10k", "out": 100}})
    assert budgets.admit(Subject("10.0.0.2", total, None, None, "x"), request=False) is None
    budgets.spend(Subject("10.0.0.2", total, None, None, "x"), 4_999, 0)
    assert budgets.admit(Subject("10.0.0.2", total, None, None, "x")) is None  # 4,999 of this worker's 5,000
    budgets.spend(Subject("10.0.0.2", total, None, None, "x"), 1, 0)
    over = budgets.admit(Subject("10.0.0.2", total, None, None, "x"), request=False)
    assert over is not None and over.retry_after is None and "totalBytes in 10000" in over.detail
    changed = Budget.model_validate({"requestsPerSecond": 5, "totalBytes": {"in": "10k"}})
    assert budgets.admit(Subject("10.0.0.2", changed, None, None, "x")) is not None  # the bytes used stay


def test_bytes_per_second_debt_for_requests_and_a_throttle_for_a_splice() -> None:
    clock = Clock()
    budgets = Budgets(clock=clock)
    rate = Budget.model_validate({"bytesPerSecond": {"in": "100k"}})
    assert budgets.admit(Subject("10.0.0.2", rate, None, None, "x")) is None
    budgets.spend(
        Subject("10.0.0.2", rate, None, None, "x"), 150_000, 0
    )  # a request's answer: 50,000 in debt
    over = budgets.admit(Subject("10.0.0.2", rate, None, None, "x"))
    assert over is not None and "retry in 0.50 s" in over.detail and over.retry_after == 1
    clock.now += 0.5
    assert budgets.admit(Subject("10.0.0.2", rate, None, None, "x")) is None
    throttle = budgets.throttle(Subject("10.0.0.2", rate, None, None, "x"), "in")
    assert (
        throttle is not None and budgets.throttle(Subject("10.0.0.2", rate, None, None, "x"), "out") is None
    )
    assert throttle.allowance(1 << 20) == (0, 16 * 1024 / 100_000)  # empty: wait for a chunk's worth
    clock.now += 1
    assert throttle.allowance(1 << 20) == (100_000, 0.0)  # one second's worth at most
    throttle.spend(100_000)
    assert throttle.allowance(10)[0] == 0

"""Policy decision time at 10, 1,000 and 100,000 rules (goal: < 10 us at 100,000, flat).

Each size gets a policy of mixed exact names, wildcards and CIDRs (a few L7 rules and bindings
too); decisions are timed for hits on the last rules (worst case for a linear scan), wildcard
hits, misses and IP literals, at connection and request level.
"""

from __future__ import annotations

import time
from typing import Any

from sandgate.policy import Request, compile_policy, policy_from_dict

SIZES = (10, 1_000, 100_000)
ROUNDS = 20_000


def _document(size: int) -> dict[str, Any]:
    egress: list[dict[str, Any]] = []
    for i in range(size - 4):
        kind = i % 3
        if kind == 0:
            egress.append({"action": "allow", "target": f"host{i}.example.com"})
        elif kind == 1:
            egress.append({"action": "deny", "target": f"*.zone{i}.example.test"})
        else:
            egress.append(
                {"action": "allow", "target": f"{(i >> 8) % 256}.{i % 256}.0.0/16".replace("0.", "2.", 1)}
            )
    egress += [
        {"action": "allow", "target": "api.github.com", "methods": ["GET"], "paths": ["/repos/acme/*"]},
        {"action": "allow", "target": "*.pkgcdn.example.com"},
        {"action": "allow", "target": "last.example.com"},
        {"action": "deny", "target": "203.0.113.0/24"},
    ]
    bindings = [
        {"name": "gh", "credential": "t", "match": {"hosts": ["api.github.com"]}, "auth": {"type": "bearer"}}
    ]
    return {"egress": egress, "bindings": bindings}


REQUESTS = {
    "exact hit (last rule)": Request("last.example.com", 443, "https"),
    "wildcard hit": Request("a.b.pkgcdn.example.com", 443, "https"),
    "miss (default deny)": Request("nothing.example.org", 443, "https"),
    "ip literal": Request("203.0.113.9", 443, "https"),
    "request + binding": Request("api.github.com", 443, "https", "GET", "/repos/acme/app"),
}


def _per_decision_us(decide: Any, request: Request) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(ROUNDS):
            decide(request)
        best = min(best, (time.perf_counter() - start) / ROUNDS * 1e6)
    return best


def main() -> None:
    print(
        f"{'rules':>8}  {'compile s':>9}  "
        + "  ".join(f"{name:>22}" for name in REQUESTS)
        + "   (us/decision)"
    )
    for size in SIZES:
        start = time.perf_counter()
        compiled = compile_policy(policy_from_dict(_document(size)), max_rules=size)
        compile_s = time.perf_counter() - start
        times = [_per_decision_us(compiled.decide, request) for request in REQUESTS.values()]
        print(f"{size:>8}  {compile_s:>9.2f}  " + "  ".join(f"{t:>22.2f}" for t in times))
    address_us = _per_decision_us(lambda r: compiled.check_address("198.51.100.7", r), REQUESTS["ip literal"])
    print(f"check_address at {SIZES[-1]} rules: {address_us:.2f} us")


if __name__ == "__main__":
    main()

"""Policy decision time at 10, 1,000 and 100,000 rules (goal: < 10 us at 100,000, flat), and
the time to validate and compile each policy, and the per-request cost of the canonical request
identity (the target put in canonical form, ambiguous ones refused) with and without the decision.

Each size gets a policy of mixed exact names, wildcards and CIDRs (a few L7 rules and a binding
too); decisions are timed for a hit on the last name rule (worst case for a linear scan), a
wildcard hit, a miss, an IP literal (connection level) and a request that a binding applies to.

Two tables: "uncached" compiles with `cache_size=0`, so every call does the whole decision (the
cost of a host seen for the first time); "cached" uses the default LRU, where repeated
connection-level decisions are a cache hit (request-level decisions are never cached).
Decision times are CPU microseconds of this process (time.process_time), medians of several
repeats: on a shared, loaded machine wall-clock time mostly measures how long the process waited
for a core. The wall/CPU ratio of the decision loops is printed so the load can be judged; compile
times are given both ways.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bench import sized
from sandgate.policy import (
    DEFAULT_CACHE_SIZE,
    AmbiguousTarget,
    CompiledPolicy,
    Decision,
    Request,
    compile_policy,
    policy_from_dict,
    request_identity,
)

SIZES = sized((10, 1_000, 100_000), (10, 1_000))
ROUNDS = sized(5_000, 50)
REPEATS = sized(7, 1)


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
    "exact hit": Request("last.example.com", 443, "https"),
    "wildcard hit": Request("a.b.pkgcdn.example.com", 443, "https"),
    "miss": Request("nothing.example.org", 443, "https"),
    "IP literal": Request("203.0.113.9", 443, "https"),
    "request+binding": Request("api.github.com", 443, "https", "GET", "/repos/acme/app"),
}


# Request targets for api.github.com (a GET /repos/acme/* rule and a binding): the usual path, one
# with escapes (the decoding path), a long one, and one refused before any decision.
TARGETS = {
    "plain": "/repos/acme/app/pulls?state=open&page=2",
    "escaped": "/repos/acme/%61pp/issues%3Fx",
    "long (400 B)": "/repos/acme/" + "segment/" * 48,
    "refused": "/repos/acme/..%2Fother",
}

_spent = {"wall": 0.0, "cpu": 0.0}


def _median_us(call: Callable[[], object]) -> float:
    """CPU microseconds per call, median of REPEATS batches of ROUNDS calls."""
    samples = []
    for _ in range(REPEATS):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(ROUNDS):
            call()
        cpu = time.process_time() - cpu
        _spent["wall"] += time.perf_counter() - wall
        _spent["cpu"] += cpu
        samples.append(cpu / ROUNDS * 1e6)
    return statistics.median(samples)


def _timed[T](build: Callable[[], T]) -> tuple[T, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = build()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _row(label: str, cells: list[float], width: int) -> str:
    return f"{label:>8}  " + "  ".join(f"{cell:>{width}.2f}" for cell in cells)


def _compile_table() -> dict[int, tuple[CompiledPolicy, CompiledPolicy]]:
    """Validate and compile each size; returns (uncached, cached) compiled policies per size."""
    compiled: dict[int, tuple[CompiledPolicy, CompiledPolicy]] = {}
    print("compile (seconds; validate = document -> Policy, compile = Policy -> indexes)")
    print(f"{'rules':>8}  {'validate':>9}  {'compile':>9}  {'total':>9}  {'total CPU':>9}")
    for size in SIZES:
        document = _document(size)
        policy, validate_s, validate_cpu = _timed(partial(policy_from_dict, document))
        uncached, compile_s, compile_cpu = _timed(partial(compile_policy, policy, cache_size=0))
        compiled[size] = (uncached, compile_policy(policy))
        print(_row(str(size), [validate_s, compile_s, validate_s + compile_s, validate_cpu + compile_cpu], 9))
    return compiled


def _identify(target: str) -> object:
    try:
        return request_identity("https", "api.github.com", 443, "GET", target)
    except AmbiguousTarget as exc:
        return exc


def _identify_and_decide(policy: CompiledPolicy, target: str) -> Decision | None:
    try:
        return policy.decide(request_identity("https", "api.github.com", 443, "GET", target))
    except AmbiguousTarget:
        return None


def _identity_table(policy: CompiledPolicy) -> None:
    print(f"\nrequest identity at {policy.rule_count:,} rules: CPU microseconds per request")
    print(f"{'':>22}  " + "  ".join(f"{name:>13}" for name in TARGETS))
    rows = {"identity": _identify, "identity + decision": partial(_identify_and_decide, policy)}
    for label, call in rows.items():
        cells = [_median_us(partial(call, target)) for target in TARGETS.values()]
        print(f"{label:>22}  " + "  ".join(f"{cell:>13.2f}" for cell in cells))


def main() -> None:
    compiled = _compile_table()
    for title, which in (("uncached (cache_size=0)", 0), (f"cached (cache_size={DEFAULT_CACHE_SIZE})", 1)):
        print(f"\ndecide, {title}: CPU microseconds per decision, median of {REPEATS} x {ROUNDS:,}")
        print(f"{'rules':>8}  " + "  ".join(f"{name:>15}" for name in REQUESTS))
        for size in SIZES:
            decide = compiled[size][which].decide
            print(
                _row(str(size), [_median_us(partial(decide, request)) for request in REQUESTS.values()], 15)
            )
    connection = REQUESTS["IP literal"]
    address_us = [
        _median_us(partial(policy.check_address, "198.51.100.7", connection))
        for policy in compiled[SIZES[-1]]
    ]
    print(
        f"\ncheck_address at {SIZES[-1]:,} rules: {address_us[0]:.2f} us uncached, {address_us[1]:.2f} cached"
    )
    _identity_table(compiled[1_000][0])
    print(f"decision loops: wall/CPU time {_spent['wall'] / _spent['cpu']:.2f} (1.00 = an idle machine)")


if __name__ == "__main__":
    main()

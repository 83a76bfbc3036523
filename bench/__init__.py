"""Benchmarks, run by `make bench`: every bench/bench_*.py module's `main()` in turn.

`make bench-smoke` (`python -m bench --smoke`) runs each with its smallest bounded settings: the
modules read `SMOKE` through `sized(full, smoke)`; tests/bench/test_smoke.py checks that every
row and ratio each one promises was printed. Benchmarks use sandgate only through the faces a
user has: the HTTP API (`sandgate serve`), the CLIs, and a component's `__init__`.
"""

import os

SMOKE_FLAG = "SANDGATE_BENCH_SMOKE"
SMOKE = os.environ.get(SMOKE_FLAG) == "1"


def sized[T](full: T, smoke: T) -> T:
    """`full` for `make bench`, `smoke` for `make bench-smoke` (the smallest run that still
    produces every row)."""
    return smoke if SMOKE else full

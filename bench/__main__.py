"""Run the benchmarks: `python -m bench [--smoke] [NAME ...]` (default all bench_*.py modules).

Each module has a `main() -> None` that prints its own table; see docs/benchmarks.md. `--smoke`
runs each with its smallest bounded settings (bench/__init__.py), to prove it still works.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import bench


def main(argv: list[str]) -> int:
    if "--smoke" in argv:
        os.environ[bench.SMOKE_FLAG] = "1"  # before any module reads it; children inherit it
        bench.SMOKE = True
        argv = [arg for arg in argv if arg != "--smoke"]
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    wanted = [n if n.startswith("bench_") else f"bench_{n}" for n in argv] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; have: {', '.join(names)}", file=sys.stderr)
        return 2
    for name in wanted:
        print(f"== {name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

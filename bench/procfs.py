"""What the benchmarks read of processes from /proc (not from sandgate's internals)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def process_family(pid: int) -> list[int]:
    """`pid` and every process below it (each thread's `children` list, recursively)."""
    family, todo = [], [pid]
    while todo:
        member = todo.pop()
        family.append(member)
        with contextlib.suppress(OSError):  # a process that just exited
            for task in Path(f"/proc/{member}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
    return family

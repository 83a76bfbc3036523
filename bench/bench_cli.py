"""CLI start-up: `sandgate --help`, `policy check` and `policy explain` (goal: < 300 ms wall each).

Each command runs RUNS times as its own process, the way a user runs it (the venv's `sandgate`
script); the table gives the median wall time and the median CPU time of the child
(user + system from wait4), so a loaded machine's waiting for a core can be told apart from
the work itself. tests/unit/test_cli_imports.py keeps the import graph that makes this fast.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import sized

ROOT = Path(__file__).resolve().parents[1]
SANDGATE = os.environ.get("SANDGATE_BIN", str(Path(sys.executable).with_name("sandgate")))
POLICY = str(ROOT / "examples" / "policy.yaml")
RUNS = sized(11, 1)
GOAL_MS = 300
COMMANDS = {
    "sandgate --help": ["--help"],
    "sandgate policy check": ["policy", "check", POLICY],
    "sandgate policy explain": ["policy", "explain", POLICY, "https://api.example.com/v1/chat"],
}


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of argv."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, 1):  # explain exits 1 for a deny
        raise RuntimeError(f"{' '.join(argv)} failed with {process.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    print(f"{'command':<26} {'wall p50 ms':>12} {'CPU p50 ms':>11} {'goal':>8}")
    for name, args in COMMANDS.items():
        runs = [timed([SANDGATE, *args]) for _ in range(RUNS)]
        wall = statistics.median(w for w, _ in runs) * 1000
        cpu = statistics.median(c for _, c in runs) * 1000
        verdict = "ok" if wall < GOAL_MS else "over"
        print(f"{name:<26} {wall:>12.0f} {cpu:>11.0f} {f'<{GOAL_MS} {verdict}':>8}")


if __name__ == "__main__":
    main()

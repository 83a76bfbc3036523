"""Proxy start-up benchmark: how fast the proxy serves after it is started, how fast a killed
worker serves again, and what all its processes hold in memory.

For one proxy process (`workers: 1`) and the worker pool (`workers: N`, N = max(2, cores)):
`python -m sandgate.proxy --config FILE` is started with no sandbox, listening on loopback
ports only, and its control socket polled until it (and, for the pool, every worker) serves.
For the pool, worker 1 is then killed (SIGKILL, by the PID the pool reports) and the time until
its replacement serves is taken; 0.5 s of it is the pool's restart backoff. Memory is PSS summed
over the proxy's processes (forked workers share pages) and RSS beside it. ROUNDS rounds each.
No root needed.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import sized
from bench.procfs import process_family
from sandgate.proxy import ProxyConfig, ProxyControl

ROUNDS = max(1, int(os.environ.get("SANDGATE_BENCH_ROUNDS", sized(3, 1))))
WORKERS = max(2, os.cpu_count() or 2)
PORTS = {"transparent_port": 25001, "explicit_port": 25002, "dns_port": 25053}
TIMEOUT = 60.0


def health(config: ProxyConfig) -> dict[str, object] | None:
    try:
        with ProxyControl(config.socket_path) as control:
            return control.health()  # type: ignore[no-any-return]
    except Exception:  # not answering yet: keep polling
        return None


def wait_for(
    ready: Callable[[dict[str, object]], bool], config: ProxyConfig, process: subprocess.Popen[bytes]
) -> dict[str, object]:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:  # e.g. a port of PORTS in use
            log = (config.state_dir / "log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the proxy exited with status {process.returncode}:\n{log}")
        state = health(config)
        if state is not None and ready(state):
            return state
        time.sleep(0.01)
    raise RuntimeError(f"the proxy did not get ready within {TIMEOUT:g} s")


def all_serving(workers: int) -> Callable[[dict[str, object]], bool]:
    def ready(state: dict[str, object]) -> bool:
        if workers == 1:
            return state.get("status") == "ok"
        listed = state.get("workers")
        return isinstance(listed, list) and sum(bool(w["serving"]) for w in listed) == workers

    return ready


def memory_mib(pid: int) -> tuple[float, float]:
    """(PSS, RSS) summed over the process and its descendants."""
    pss = rss = 0
    for member in process_family(pid):
        for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "Pss":
                pss += int(value.split()[0])
            elif key == "Rss":
                rss += int(value.split()[0])
    return pss / 1024, rss / 1024


def one_round(workers: int, state_dir: Path) -> dict[str, float]:
    config = ProxyConfig(state_dir=state_dir, listen_host="127.0.0.1", workers=workers, **PORTS)
    config_path = state_dir / "proxy.json"
    config_path.write_text(config.model_dump_json())
    with (state_dir / "log").open("ab") as log:
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "sandgate.proxy", "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        state = wait_for(all_serving(workers), config, process)
        found = {"start_s": time.monotonic() - started}
        found["pss_mib"], found["rss_mib"] = memory_mib(process.pid)
        if workers > 1:
            victim = state["workers"][1]["pid"]  # type: ignore[index]
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            wait_for(
                lambda s: s["workers"][1]["pid"] != victim and s["workers"][1]["serving"], config, process
            )  # type: ignore[index]
            found["restart_s"] = time.monotonic() - killed
        return found
    finally:
        process.terminate()
        process.wait(10)


def median(rounds: list[dict[str, float]], key: str) -> str:
    values = [found[key] for found in rounds if key in found]
    return f"{statistics.median(values):.2f}" if values else "-"


def main() -> None:
    widths = {"start_s": 8, "restart_s": 14, "pss_mib": 8, "rss_mib": 8}
    titles = ("start s", "worker back s", "PSS MiB", "RSS MiB")
    header = " ".join(f"{title:>{width}}" for title, width in zip(titles, widths.values(), strict=True))
    print(f"{'proxy':28} {header}  (median of {ROUNDS})")
    for workers in (1, WORKERS):
        rounds = []
        for _ in range(ROUNDS):
            with tempfile.TemporaryDirectory(prefix="sandgate-bench-start-") as state_dir:
                rounds.append(one_round(workers, Path(state_dir)))
        name = "one proxy process" if workers == 1 else f"pool of {workers} workers"
        print(f"{name:28} " + " ".join(f"{median(rounds, key):>{width}}" for key, width in widths.items()))


if __name__ == "__main__":
    main()

"""The host hop to execd: a sandbox's execd reached through `sandgate serve`'s reverse proxy (the
default execd endpoint) against the same execd reached directly at the sandbox's address.

Runs as root in a network namespace of its own (the module re-executes itself after unshare):
one real `sandgate serve` (tests.support.server) and one real `sandgate/host` sandbox. Each row
pair runs back to back, A B in one round and B A in the next, on one keep-alive client each, as
the SDKs use it. Rows: `GET /ping` (the hop alone: execd answers at once), a command round trip
(`POST /command` `true`, up to the last event), the time to the first SSE event of a command
that keeps running, and a 100 MiB download (MiB/s, with serve's peak RSS: nothing buffered).
serve's own CPU time per proxied `/ping` is printed too (load-independent).
SANDGATE_BENCH_GATEWAY_RUNS sets the round trips per row and round (default 200).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench import sized
from bench.sandbox_rig import enter_own_netns, run_as_root_child

CHILD_FLAG = "SANDGATE_BENCH_GATEWAY_CHILD"
RUNS = int(os.environ.get("SANDGATE_BENCH_GATEWAY_RUNS", sized(200, 5)))
ROUNDS = sized(4, 2)
WARM_UP = sized(10, 2)
DOWNLOAD_MIB = sized(100, 4)
TRUE = {"command": "true"}
FIRST_EVENT = {"command": "echo first; sleep 0.3; echo second"}


def main() -> None:
    run_as_root_child("bench.bench_gateway", CHILD_FLAG, "netns, nftables, mounts")


def _timed(action: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        action()
        times.append(time.perf_counter() - began)
    return times


def _command(client: httpx.Client, body: dict[str, str]) -> None:
    with client.stream("POST", "/command", json=body) as response:
        response.raise_for_status()
        for _ in response.iter_raw():
            pass


def _first_event(client: httpx.Client) -> float:
    began = time.perf_counter()
    with client.stream("POST", "/command", json=FIRST_EVENT) as response:
        for chunk in response.iter_raw():
            if b'"first"' in chunk:
                took = time.perf_counter() - began
        return took


def _cpu_s(pid: int) -> float:
    """User + system CPU time of a process (load-independent, unlike wall time)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _download(client: httpx.Client, serve_pid: int) -> tuple[float, int]:
    """MiB/s of a DOWNLOAD_MIB download, and serve's peak RSS growth (KiB) meanwhile."""
    idle, peak, done = _rss_kib(serve_pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_kib(serve_pid))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.perf_counter()
    with client.stream("GET", "/files/download", params={"path": "/tmp/bench-download.bin"}) as response:
        size = sum(len(chunk) for chunk in response.iter_raw(1 << 20))
    took = time.perf_counter() - began
    done.set()
    sampler.join()
    assert size == DOWNLOAD_MIB << 20, size
    return DOWNLOAD_MIB / took, max(0, peak[0] - idle)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _compare(label: str, unit: str, host: list[float], direct: list[float], scale: float = 1000) -> None:
    def cells(values: list[float]) -> str:
        return f"p50 {statistics.median(values) * scale:7.2f} {unit} p95 {_p(values, 0.95) * scale:7.2f}"

    ratio = statistics.median(host) / statistics.median(direct)
    print(f"  {label:<36} direct {cells(direct)} | host {cells(host)} | host/direct p50 {ratio:.2f}x")


def _child() -> None:
    enter_own_netns()
    from tests.support.server import sandgate_server

    with (
        tempfile.TemporaryDirectory(prefix="sandgate-bench-gateway-") as temp,
        # direct: the endpoint is the sandbox's own address and execd token (a key's endpoint
        # token is bound to the key, which only the host's reverse proxy checks), and the reverse
        # proxy takes that same token, so both paths carry the same header
        sandgate_server(Path(temp), {"SANDGATE_EXECD_ENDPOINT": "direct"}) as server,
    ):
        sandbox_id = server.create_sandbox()["id"]
        with server.client() as api:
            found = api.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772").json()
        headers = found["headers"]
        assert found["endpoint"] == f"{server.sandbox_address(sandbox_id)}:44772", found
        server.run(sandbox_id, f"head -c {DOWNLOAD_MIB}M /dev/urandom > /tmp/bench-download.bin")
        host = f"{server.domain}/v1/sandboxes/{sandbox_id}/proxy/44772"
        clients = {
            name: httpx.Client(base_url=f"http://{address}", headers=headers, timeout=60, trust_env=False)
            for name, address in (("host", host), ("direct", found["endpoint"]))
        }
        assert server.process is not None
        serve_pid = server.process.pid
        rows: dict[str, dict[str, list[float]]] = {}
        try:
            for name in clients:  # warm both paths (connections, imports, execd's first spawn)
                for _ in range(WARM_UP):
                    _command(clients[name], TRUE)
            for round_number in range(ROUNDS):
                order = list(clients) if round_number % 2 == 0 else list(reversed(clients))
                for name in order:
                    client = clients[name]
                    row = rows.setdefault(name, {})
                    cpu = _cpu_s(serve_pid)
                    row.setdefault("ping", []).extend(
                        _timed(lambda c=client: c.get("/ping").raise_for_status(), RUNS)
                    )
                    row.setdefault("serve_cpu", []).append((_cpu_s(serve_pid) - cpu) / RUNS)
                    row.setdefault("true", []).extend(_timed(lambda c=client: _command(c, TRUE), RUNS))
                    row.setdefault("first", []).extend(_first_event(client) for _ in range(5))
                    speed, rss = _download(client, serve_pid)
                    row.setdefault("download", []).append(speed)
                    row.setdefault("rss", []).append(rss)
        finally:
            for client in clients.values():
                client.close()
        _report(rows["host"], rows["direct"])


def _report(host: dict[str, list[float]], direct: dict[str, list[float]]) -> None:
    print(
        f"execd through sandgate serve's reverse proxy (host) vs the sandbox's address (direct); "
        f"{ROUNDS} rounds x {RUNS} runs, load average {os.getloadavg()[0]:.1f}"
    )
    _compare("GET /ping (the hop alone)", "ms", host["ping"], direct["ping"])
    print(f"  {'':<36} serve's CPU per proxied /ping: {statistics.median(host['serve_cpu']) * 1e6:.0f} us")
    _compare("command round trip `true`", "ms", host["true"], direct["true"])
    _compare("first SSE event of a running command", "ms", host["first"], direct["first"])
    print(
        f"  {f'download {DOWNLOAD_MIB} MiB':<34} direct {statistics.median(direct['download']):.0f} MiB/s"
        f" | host {statistics.median(host['download']):.0f} MiB/s, serve RSS growth at most"
        f" {max(host['rss']) // 1024} MiB (streamed, not buffered)"
    )


if __name__ == "__main__":
    if os.environ.get(CHILD_FLAG) == "1":
        _child()
    else:
        main()

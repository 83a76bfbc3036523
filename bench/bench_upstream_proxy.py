"""What chaining to an upstream proxy costs per request: one sandgate proxy that dials the origin,
one that leaves through squid (`upstream_proxies`, a CONNECT per connection with the sandbox id),
same sandbox, same origin, back to back.

Rules: the world is bench_proxy's (bench/topology.py: a private network namespace, nginx and a
DNS server in an origin namespace, the client's TCP redirected by nftables to the proxy under
test; nothing leaves it, everything is stopped by PID). Both sandgate proxies and squid are
pinned to the proxy core, so the chained rows pay for squid's CPU as a company's gateway host
would not (squid runs elsewhere there): the added latency is an upper bound. Each run lasts
SANDGATE_BENCH_SECONDS (default 2) s, SANDGATE_BENCH_ROUNDS (default 3) rounds, A B then B A;
a row shows its best round. Rows: keep-alive plain HTTP (wrk), intercepted HTTPS with injection
and TLS pass-through (curl, certificates verified), and pass-through with a new connection per
request (so each request is a new CONNECT at squid).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

from bench.bench_proxy import (
    CHILD_FLAG,
    ROUNDS,
    SQUID_PORT,
    Load,
    Proxy,
    bench_world,
    curl_load,
    measured,
    start_load_sandgate,
    start_squid,
    wrk,
)
from bench.topology import GATEWAY, REPO, Topology

DIRECT_PORTS = {"transparent_port": 23001, "explicit_port": 23002, "dns_port": 23053}
CHAINED_PORTS = {"transparent_port": 24001, "explicit_port": 24002, "dns_port": 24053}


@dataclass(frozen=True)
class Case:
    name: str
    url: str
    c: int
    fresh: bool = False
    tool: str = "curl"


CASES = (
    Case("plain HTTP 1 KiB, keep-alive", "http://plain.example.com/1k.json", 8, tool="wrk"),
    Case("intercepted HTTPS 1 KiB (injected)", "https://api.example.com/1k.json", 1),
    Case("intercepted HTTPS 1 KiB (injected)", "https://api.example.com/1k.json", 8),
    Case("TLS pass-through 1 KiB, keep-alive", "https://pass.example.com/1k.json", 1),
    Case("TLS pass-through 1 KiB, new connection", "https://pass.example.com/1k.json", 1, fresh=True),
)


def run_case(topo: Topology, case: Case, proxy: Proxy, port: int) -> Load:
    topo.redirect_to(port)
    cafile = proxy.ca_cert if "api." in case.url and proxy.ca_cert else topo.ca_cert
    if case.tool == "wrk":
        return measured(proxy, lambda: wrk(topo, case.url, case.c))
    return measured(proxy, lambda: curl_load(topo, case.url, case.c, None, cafile, case.fresh))


def squid_connects(topo: Topology) -> int:
    """CONNECTs squid served (its access log), to prove the chained rows went through it."""
    log = topo.workdir / "squid" / "access.log"
    return sum(1 for line in log.read_text().splitlines() if " CONNECT " in line) if log.exists() else 0


def _child() -> None:
    from sandgate.proxy import UpstreamProxy

    with bench_world("sg-bench-chain-") as topo:
        squid = start_squid(topo, access_log=True)
        upstream = UpstreamProxy(url=f"http://{GATEWAY}:{SQUID_PORT}", identity_header="X-Sandgate-Sandbox")
        direct = start_load_sandgate(topo, "sandgate-direct", DIRECT_PORTS)
        chained = start_load_sandgate(topo, "sandgate-chained", CHAINED_PORTS, upstream_proxies=[upstream])
        arms = (("direct", direct, DIRECT_PORTS), ("via squid", chained, CHAINED_PORTS))
        best: dict[tuple[int, str], Load] = {}
        for round_number in range(ROUNDS):
            for index, case in enumerate(CASES):
                order = arms if round_number % 2 == 0 else arms[::-1]  # ABBA
                for label, proxy, ports in order:
                    load = run_case(topo, case, proxy, ports["transparent_port"])
                    print(f"  {case.name:42} c={case.c:<2} {label:9} {load.rps:8.0f} req/s", flush=True)
                    if load.errors:
                        raise RuntimeError(f"{case.name} {label}: {load.errors} failed requests")
                    key = (index, label)
                    if key not in best or load.rps > best[key].rps:
                        best[key] = load
        topo.redirect_to(None)
        connects = squid_connects(topo)
        if not connects:
            raise RuntimeError("squid served no CONNECT: the chained rows did not go through it")
        for process in (direct.process, chained.process, squid.process):
            topo.stop(process)
    print(f"squid served {connects} CONNECTs (the chained rows went through it)")
    head = f"{'scenario':42} {'c':>2} | {'direct req/s':>12} {'p50 ms':>7} | {'chained req/s':>13}"
    print(f"{head} {'p50 ms':>7} | {'+p50 ms':>7} {'CPU ms/req d/c':>15}")
    for index, case in enumerate(CASES):
        plain, via = best[(index, "direct")], best[(index, "via squid")]
        added = (via.p50_ms or 0) - (plain.p50_ms or 0)
        cpu = f"{plain.cpu_ms_per_request or 0:.2f}/{via.cpu_ms_per_request or 0:.2f}"
        print(f"{case.name:42} {case.c:>2} | {plain.rps:12.0f} {plain.p50_ms or 0:7.2f} | {via.rps:13.0f}"
              f" {via.p50_ms or 0:7.2f} | {added:+7.2f} {cpu:>15}")  # fmt: skip


def main() -> None:
    if os.geteuid() != 0:
        print("bench_upstream_proxy needs root (network namespaces, nftables); skipped")
        return
    env = {**os.environ, CHILD_FLAG: "1"}
    argv = [sys.executable, "-m", "bench.bench_upstream_proxy"]
    subprocess.run(argv, env=env, cwd=REPO, check=True, timeout=1200)


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()

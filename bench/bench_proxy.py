"""Egress proxy benchmark: sandgate's proxy vs direct, stock mitmdump and squid, in one run.

Rules:
1. Nothing leaves the machine: the module re-executes itself in a fresh network namespace and
   builds its own origin (Debian nginx + a DNS server) and client namespaces (bench/topology.py);
   every process, namespace, veth and nft table is removed by PID or name, also on failure.
2. Bounded: every load run lasts SANDGATE_BENCH_SECONDS (default 2) seconds; the 57 runs are
   gone through SANDGATE_BENCH_ROUNDS (default 3) times. Rows that are compared run back to
   back (A B, then B A), each row shows its best round (the machine may be shared: the best
   round is the least disturbed one), and ratios are the median of the per-round ratios. The
   whole benchmark takes under 5 minutes at the defaults, about 1 with
   SANDGATE_BENCH_SECONDS=1 SANDGATE_BENCH_ROUNDS=1.
3. Same conditions for every proxy: each is pinned to CPU 1 (`taskset`), nginx and the load
   generators share CPU 0. Load generators are C programs, never Python threads: `wrk` for
   direct, transparent (the client dials the origin; nftables redirects it to the proxy, as in a
   sandbox) and absolute-form runs; `curl` (parallel transfers, --http1.1, keep-alive) for
   CONNECT tunnels with full CA verification. wrk does not verify certificates, so curl checks
   with CA verification first prove which certificate each path presents.
4. A run with failed or non-2xx requests is shown with its error count, and no ratio is
   computed from a row that had any: the ratio is printed as invalid (goal MISSED) with the
   counts, since a proxy that refuses work looks cheap per request. Ratios are given in
   throughput (req/s, MB/s) and per core (the proxies' own CPU time per request, which holds up
   when other work shares the proxy's core); per-core goals are judged per core.
5. The load rows measure the data path, not the fairness limits: their sandgate proxies run with
   per-sandbox limits far above any load here (`NO_LIMITS`; the defaults, 50 new connections/s,
   would reset most of a new-connection-per-request run). The noisy-neighbour rows measure the
   limits, with sandgate proxies of their own: one with the defaults, one without limits.

Proxies: sandgate (`python -m sandgate.proxy --config`, one sandbox entry pushed through
ProxyControl with policy, a bearer binding for api.example.com, audit on), stock `mitmdump -q`
(transparent and explicit, intercepting every TLS connection), squid (plain HTTP absolute-form
and CONNECT). Then 100 MiB downloads through sandgate with its peak RSS, and the RSS of a fresh
sandgate proxy with 0 and IDLE_SANDBOXES registered sandboxes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench import sized
from bench.procfs import process_family
from bench.topology import (
    CLIENT,
    DIRECT,
    DNS_ADDR,
    GATEWAY,
    NOISY,
    PROXY_CPU,
    REDIRECTED,
    REPO,
    Topology,
    enter_private_netns,
)

SECONDS = max(1, round(float(os.environ.get("SANDGATE_BENCH_SECONDS", sized(2, 1)))))
ROUNDS = max(1, int(os.environ.get("SANDGATE_BENCH_ROUNDS", sized(3, 1))))
# Parts to run: "load" (the back-to-back rows, downloads, idle sandboxes), "noisy" (fairness),
# "workers" (only the 1 vs N workers rows of "load")
ONLY = set(os.environ.get("SANDGATE_BENCH_ONLY", "load,noisy").split(","))
NOISY_CONNECTIONS = int(os.environ.get("SANDGATE_BENCH_NOISY_CONNECTIONS", sized(1500, 100)))
QUIET_RATE = 20  # the quiet sandbox's requests per second in the noisy-neighbour rows
NOISY_SECONDS = sized(max(4, 2 * SECONDS), 2)
UNLIMITED_PORTS = {"transparent_port": 18001, "explicit_port": 18002, "dns_port": 18053}
LIMITED_PORTS = {"transparent_port": 22001, "explicit_port": 22002, "dns_port": 22053}
# ConnectionLimits for sandgate proxies measuring the data path (rule 5)
NO_LIMITS = {"max_connections": 10**6, "accept_rate": 1e9, "accept_burst": 10**6}
RELAY_PORTS = {"transparent_port": 19001, "explicit_port": 19002, "dns_port": 19053}
CHILD_FLAG = "SANDGATE_BENCH_PROXY_CHILD"
SANDGATE_PORTS = {"transparent_port": 15001, "explicit_port": 15002, "dns_port": 15053}
IDLE_PORTS = {"transparent_port": 17001, "explicit_port": 17002, "dns_port": 17053}
MITMDUMP_PORT, MITMDUMP_EXPLICIT_PORT, SQUID_PORT = 16001, 16002, 3128
IDLE_SANDBOXES = sized(1000, 20)
WORKERS = max(2, os.cpu_count() or 2)  # the N of the 1 vs N workers rows
PINNED_WORKER_PORTS = {"transparent_port": 20001, "explicit_port": 20002, "dns_port": 20053}
SPREAD_WORKER_PORTS = {"transparent_port": 21001, "explicit_port": 21002, "dns_port": 21053}
ALL_CPUS = f"0-{(os.cpu_count() or 2) - 1}"
SECRET = "bench-secret-7f3a9c2e5d1b"
NAMES = ("api", "pass", "plain", "direct")  # client view: api/pass/plain are redirected, direct is not
POLICY = {
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": "api.example.com"},  # has a binding: intercepted
        {"action": "allow", "target": "pass.example.com"},  # no L7 rule: passed through
        {"action": "allow", "target": "plain.example.com"},
    ],
    "bindings": [
        {
            "name": "api",
            "credential": "api-token",
            "match": {"hosts": ["api.example.com"]},
            "auth": {"type": "bearer"},
        }
    ],
}
WRK_REPORT = """\
local absolute = os.getenv("BENCH_PATH")
if absolute and absolute ~= "" then wrk.path = absolute end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH %d %d %d %d %d %d\\n", summary.requests, summary.bytes,
    summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout + e.status))
end
"""
SQUID_CONF = """\
http_port {gateway}:{port}
http_access allow all
cache deny all
cache_mem 0 MB
access_log none
cache_store_log none
cache_log {dir}/cache.log
pid_filename {dir}/squid.pid
coredump_dir {dir}
dns_nameservers {dns}
pinger_enable off
netdb_filename none
shutdown_lifetime 1 seconds
max_filedescriptors 16384
"""


# ---------------------------------------------------------------- measurements


@dataclass
class Load:
    requests: int
    bytes: int
    seconds: float
    p50_ms: float | None  # None: the generator reports no percentiles (h2load)
    p99_ms: float | None
    errors: int
    p95_ms: float | None = None  # only where the rows show it (noisy neighbour)
    cpu_seconds: float | None = None  # the proxy's (with workers: the pool's and theirs), during the run
    pss_mib: float | None = None  # the proxy's (summed over its processes), at the end of the run
    loadgen_cores: float | None = None  # CPU the load generator (and its wrappers) used, in cores
    idle_cores: float | None = None  # CPU nobody used during the run, in cores (the whole machine)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def mbps(self) -> float:
        return self.bytes / self.seconds / 1e6

    @property
    def cpu_ms_per_request(self) -> float | None:
        return (
            self.cpu_seconds / self.requests * 1000
            if self.cpu_seconds is not None and self.requests
            else None
        )


@dataclass
class Proxy:
    """A proxy process under test; CPU and memory are read from /proc by PID."""

    name: str
    process: subprocess.Popen[bytes]
    ca_cert: Path | None = None  # the CA a client must trust for its intercepted TLS
    state_dir: Path | None = None

    def pids(self) -> list[int]:
        """The proxy's processes: itself and, for sandgate's worker pool, its workers."""
        return process_family(self.process.pid)

    def cpu_seconds(self) -> float:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def memory_kib(self, key: str = "VmRSS") -> int:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith(f"{key}:"):
                        total += int(line.split()[1])
        if not total:
            raise RuntimeError(f"{key} not in /proc/{self.process.pid}/status")
        return total

    def pss_kib(self) -> int:
        """Proportional set size summed over the processes: pages a forked worker shares with
        its template count once in all, where RSS would count them in each process."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
                total += int(rollup.split("\nPss:")[1].split()[0])
        return total

    def reset_peak(self) -> None:
        for pid in self.pids():
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := current RSS


@dataclass
class Row:
    section: str
    scenario: str
    concurrency: int
    rounds: list[Load] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def load(self) -> Load:
        """The best round (most requests per second, or bytes for a download)."""
        return max(self.rounds, key=lambda load: (load.rps, load.mbps))


def measured(proxy: Proxy | None, run: Callable[[], Load]) -> Load:
    """Run a load and attach the proxy's CPU time and RSS for it, the load generator's CPU and
    the machine's idle CPU."""
    cpu = proxy.cpu_seconds() if proxy else 0.0
    children, idle, started = _children_cpu(), _idle_seconds(), time.monotonic()
    load = run()
    elapsed = time.monotonic() - started
    load.loadgen_cores = (_children_cpu() - children) / elapsed
    load.idle_cores = (_idle_seconds() - idle) / elapsed
    if proxy:
        load.cpu_seconds = proxy.cpu_seconds() - cpu
        load.pss_mib = proxy.pss_kib() / 1024
    return load


def _children_cpu() -> float:
    """CPU seconds of every child this process has waited for (the load generators)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _idle_seconds() -> float:
    """Idle CPU seconds of the whole machine so far (/proc/stat: idle + iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def wrk(topo: Topology, url: str, c: int, path: str | None = None, headers: tuple[str, ...] = ()) -> Load:
    """Closed-loop keep-alive load for SECONDS (HTTP/1.1; TLS without certificate checks)."""
    script = topo.workdir / "report.lua"
    script.write_text(WRK_REPORT)
    argv = ["wrk", "-t1", f"-c{c}", f"-d{SECONDS}s", "--timeout", "10s", "-s", str(script)]
    for header in headers:
        argv += ["-H", header]
    env = {**os.environ, "BENCH_PATH": path or ""}
    done = subprocess.run(
        topo.client_cmd([*argv, url]), capture_output=True, text=True, timeout=SECONDS + 30, env=env
    )
    report = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("BENCH ")]
    if done.returncode or not report:
        raise RuntimeError(f"wrk {url} failed ({done.returncode}): {done.stdout}{done.stderr}")
    requests, size, micros, p50, p99, errors = (int(v) for v in report[0])
    return Load(requests, size, micros / 1e6, p50 / 1000, p99 / 1000, errors)


def h2load(topo: Topology, url: str, streams: int) -> Load:
    """HTTP/2 load: `streams` concurrent streams on one TLS connection, for SECONDS (no cert checks)."""
    argv = ["h2load", "-t1", "-c1", f"-m{streams}", "-D", str(SECONDS), url]
    done = topo.run_client(argv, SECONDS + 30)
    finished = re.search(r"finished in ([\d.]+)s", done.stdout)
    counts = re.search(r"(\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout", done.stdout)
    data = re.search(r"\((\d+)\) data", done.stdout)
    if done.returncode or not (finished and counts and data):
        raise RuntimeError(f"h2load {url} failed ({done.returncode}): {done.stdout}{done.stderr}")
    succeeded, *failures = (int(n) for n in counts.groups())
    return Load(succeeded, int(data.group(1)), float(finished.group(1)), None, None, sum(failures))


FIRST_SUCCESS_WAIT = 30.0


def until_a_success(out: Path, process: subprocess.Popen[bytes]) -> None:
    """Returns once curl's output has a 200, curl ended, or FIRST_SUCCESS_WAIT s passed."""
    deadline = time.monotonic() + FIRST_SUCCESS_WAIT
    while process.poll() is None and time.monotonic() < deadline:
        if any(line.startswith("200 ") for line in out.read_text().splitlines()):
            return
        time.sleep(0.05)


def curl_load(
    topo: Topology,
    url: str,
    c: int,
    proxy_port: int | None,
    cafile: Path,
    fresh: bool = False,
    rate: int | None = None,
    seconds: float = SECONDS,
) -> Load:
    """Keep-alive HTTP/1.1, through an explicit proxy (CONNECT for https) if given, certificates
    verified; `fresh`: a new connection (and tunnel) per request; `rate`: at most that many
    requests per second (then c must be 1), for `seconds`.

    curl is given far more URLs than it can fetch and stopped after SECONDS; each finished
    transfer prints one line (line-buffered), so the count and latencies are exact. On a machine
    so starved that no request succeeded in the window (a new TLS connection each, beside a noisy
    neighbour, at load 20), it runs on until the first one does, at most FIRST_SUCCESS_WAIT s
    more: the row then reports what it got over the time it really ran."""
    argv = ["stdbuf", "-oL", "curl", "-s", "--http1.1", "--cacert", str(cafile)]
    argv += ["--proxy", f"http://{GATEWAY}:{proxy_port}"] if proxy_port else []
    argv += ["-o", "/dev/null"]
    argv += ["-w", "%{http_code} %{size_download} %{time_total}\\n"]
    if c > 1:
        argv += ["-Z", "--parallel-max", str(c), "--parallel-immediate"]
    if fresh:
        argv += ["-H", "Connection: close"]
    if rate:
        argv += ["--rate", f"{rate}/s"]
    out = topo.workdir / "curl.out"
    with out.open("w") as fh:
        argv = topo.client_cmd([*argv, f"{url}?[1-10000000]"])
        process = subprocess.Popen(argv, stdout=fh, stderr=subprocess.DEVNULL)  # stderr: progress meter
        started = time.monotonic()
        try:
            process.wait(seconds)
            raise RuntimeError(f"curl {url} ended early ({process.returncode}): {out.read_text()[-500:]}")
        except subprocess.TimeoutExpired:
            until_a_success(out, process)
            process.send_signal(signal.SIGTERM)
            elapsed = time.monotonic() - started
            process.wait(10)
    lines = [line.split() for line in out.read_text().splitlines() if line.count(" ") == 2]
    good = [(int(size), float(total)) for code, size, total in lines if code == "200"]
    if not good:
        raise RuntimeError(f"curl {url} via :{proxy_port} got no 200: {out.read_text()[-500:]}")
    latencies = sorted(total * 1000 for _, total in good)

    def percentile(share: float) -> float:
        return latencies[min(len(latencies) - 1, int(len(latencies) * share))]

    return Load(
        len(good),
        sum(s for s, _ in good),
        elapsed,
        statistics.median(latencies),
        percentile(0.99),
        len(lines) - len(good),
        p95_ms=percentile(0.95),
    )


# ---------------------------------------------------------------- the proxies


def start_sandgate(
    topo: Topology, name: str, ports: dict[str, int], cpus: str = PROXY_CPU, **extra: object
) -> tuple[Proxy, object]:
    """`python -m sandgate.proxy --config`, as lifecycle starts it, on `cpus` (`extra`: more
    ProxyConfig fields); returns it and its ProxyControl."""
    from sandgate.proxy import ProxyConfig, ProxyControl
    from sandgate.vault import StoreSecrets, StoreSettings, generate_master_key, open_store

    key = generate_master_key()
    vault_dir = topo.workdir / f"{name}-vault"
    open_store("local", vault_dir, key).put("api-token", SECRET)
    config = ProxyConfig(
        state_dir=topo.workdir / name,
        upstream_dns=[DNS_ADDR],
        upstream_ca=topo.ca_cert,
        vault=StoreSettings(state_dir=vault_dir),
        **ports,
        **extra,  # type: ignore[arg-type]
    )
    config.state_dir.mkdir(parents=True)
    config_file = config.state_dir / "proxy.json"
    config_file.write_text(config.model_dump_json())
    argv = ["taskset", "-c", cpus, sys.executable, "-m", "sandgate.proxy", "--config", str(config_file)]
    secrets, write = os.pipe()  # the vault key, as lifecycle hands it over: a pipe, written whole
    with os.fdopen(write, "wb") as pipe:
        pipe.write(StoreSecrets(vault_key=key).revealed_json())
    try:
        process = topo.spawn(name, [*argv, f"--secrets-fd={secrets}"], cwd=REPO, pass_fds=(secrets,))
    finally:
        os.close(secrets)
    control = ProxyControl(config.socket_path)
    deadline = time.monotonic() + 30
    while True:
        try:
            control.health()
            break
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sandgate proxy did not start:\n{topo.log_of(name)}") from None
            time.sleep(0.1)
    return Proxy("sandgate", process, config.state_dir / "mitmproxy-ca-cert.pem", config.state_dir), control


def start_mitmdump(topo: Topology) -> Proxy:
    confdir = topo.workdir / "mitmdump"
    confdir.mkdir()
    mitmdump = Path(sys.executable).parent / "mitmdump"
    argv = ["taskset", "-c", PROXY_CPU, str(mitmdump), "-q"]
    argv += [
        "--mode",
        f"transparent@0.0.0.0:{MITMDUMP_PORT}",
        "--mode",
        f"regular@{GATEWAY}:{MITMDUMP_EXPLICIT_PORT}",
    ]
    argv += ["--set", f"confdir={confdir}", "--set", f"ssl_verify_upstream_trusted_ca={topo.ca_cert}"]
    # mitmdump resolves CONNECT targets with the system resolver: give it the origin's names
    process = topo.spawn("mitmdump", topo.with_hosts_file(argv, topo.origin_hosts_file))
    topo.wait_tcp(None, GATEWAY, MITMDUMP_EXPLICIT_PORT)
    return Proxy("mitmdump", process, confdir / "mitmproxy-ca-cert.pem")


def start_squid(topo: Topology, access_log: bool = False) -> Proxy:
    """squid on the proxy core; `access_log`: it logs each request to squid/access.log."""
    import shutil

    squid_dir = topo.workdir / "squid"
    squid_dir.mkdir()
    shutil.chown(squid_dir, "proxy", "proxy")  # squid drops root for its cache_effective_user
    conf = squid_dir / "squid.conf"
    text = SQUID_CONF.format(gateway=GATEWAY, port=SQUID_PORT, dir=squid_dir, dns=DNS_ADDR)
    if access_log:
        text = text.replace("access_log none", f"access_log stdio:{squid_dir}/access.log")
    conf.write_text(text)
    process = topo.spawn("squid", ["taskset", "-c", PROXY_CPU, "squid", "-N", "-f", str(conf)])
    topo.wait_tcp(None, GATEWAY, SQUID_PORT)
    return Proxy("squid", process)


# ---------------------------------------------------------------- checks


def check_paths(topo: Topology, sandgate: Proxy, mitmdump: Proxy) -> list[str]:
    """Prove, with certificate verification, what each path does before timing it."""

    def fetched(*args: str) -> bool:
        argv = ["curl", "-sS", "--max-time", "10", "-o", "/dev/null", *args]
        return topo.run_client(argv, 20).returncode == 0

    sandgate_ca, mitmdump_ca, origin_ca = str(sandgate.ca_cert), str(mitmdump.ca_cert), str(topo.ca_cert)
    topo.redirect_to(SANDGATE_PORTS["transparent_port"])
    checks = {
        "sandgate intercepts api.example.com: its CA verifies": fetched(
            "--cacert", sandgate_ca, f"{API}/check"
        ),
        "... and the origin's CA does not": not fetched("--cacert", origin_ca, f"{API}/{K}"),
        "sandgate passes pass.example.com through: the origin's CA verifies": fetched(
            "--cacert", origin_ca, f"{PASS}/{K}"
        ),
        "sandgate relays plain HTTP": fetched(f"{PLAIN}/{K}"),
        "the origin received the bearer sandgate injected": any(
            f"Bearer {SECRET}" in line for line in topo.authorization_seen()
        ),
    }
    topo.redirect_to(MITMDUMP_PORT)
    checks["mitmdump intercepts: its CA verifies"] = fetched("--cacert", mitmdump_ca, f"{API}/{K}")
    topo.redirect_to(None)
    squid = f"http://{GATEWAY}:{SQUID_PORT}"
    checks["squid CONNECT: the origin's CA verifies"] = fetched(
        "--proxy", squid, "--cacert", origin_ca, f"{PASS}/{K}"
    )
    failed = [name for name, passed in checks.items() if not passed]
    if failed:
        raise RuntimeError(f"path checks failed: {failed}; logs in {topo.workdir}")
    return [f"ok: {name}" for name in checks]


# ---------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Scenario:
    """One load: `tool` wrk (transparent when the URL's host is redirected) or curl (explicit proxy)."""

    section: str
    name: str
    proxy: str | None  # sandgate | mitmdump | squid | None (direct)
    tool: str
    url: str
    concurrency: tuple[int, ...]
    absolute_path: str | None = None  # wrk: absolute-form request through an explicit proxy
    fresh: bool = False  # a new connection per request


KEEP, FRESH, BIG = "1 KiB, keep-alive", "new TLS connection per request, 1 KiB", "1 MiB bodies, keep-alive"
H2 = "HTTP/2 (h2load), 1 KiB, c = streams on one connection"
DOWNLOAD = "100 MiB download (curl, one connection, certificate verified)"
C = (1, 32)
K, M = "1k.json", "1m.bin"
DIRECT_HTTP, DIRECT_HTTPS = "http://direct.example.com", "https://direct.example.com"
API, PASS, PLAIN = "https://api.example.com", "https://pass.example.com", "http://plain.example.com"
KEEP_ROWS = [  # (name, proxy, tool, origin); each at c=1 and c=32, 1 KiB
    ("direct HTTP", None, "wrk", DIRECT_HTTP),
    ("direct HTTPS", None, "wrk", DIRECT_HTTPS),
    ("direct HTTPS (curl, verified)", None, "curl", DIRECT_HTTPS),
    ("mitmdump HTTP (transparent)", "mitmdump", "wrk", PLAIN),
    ("mitmdump HTTPS intercepted", "mitmdump", "wrk", API),
    ("mitmdump CONNECT intercepted (curl)", "mitmdump", "curl", API),
    ("squid HTTP (absolute-form)", "squid", "wrk", DIRECT_HTTP),
    ("squid CONNECT tunnel (curl)", "squid", "curl", PASS),
    ("sandgate HTTP (transparent)", "sandgate", "wrk", PLAIN),
    ("sandgate HTTPS intercepted+inject+audit", "sandgate", "wrk", API),
    ("sandgate CONNECT intercepted (curl)", "sandgate", "curl", API),
    ("sandgate TLS pass-through (transparent)", "sandgate", "wrk", PASS),
    ("sandgate CONNECT pass-through (curl)", "sandgate", "curl", PASS),
    *(
        PASS_ROWS := [
            ("sandgate pass-through, splice (curl)", "sandgate", "curl-transparent", PASS),
            ("sandgate pass-through, mitmproxy relay (curl)", "sandgate-relay", "curl-transparent", PASS),
        ]
    ),
]
H2_ROWS = [
    ("direct HTTPS h2", None, "h2load", DIRECT_HTTPS),
    ("mitmdump HTTPS h2 intercepted", "mitmdump", "h2load", API),
    ("sandgate HTTPS h2 intercepted+inject+audit", "sandgate", "h2load", API),
]
HEAVY_ROWS = [  # at c=8: new connection per request (1 KiB), and 1 MiB bodies
    ("direct HTTPS", None, "wrk", DIRECT_HTTPS),
    ("direct HTTPS (curl, verified)", None, "curl", DIRECT_HTTPS),
    ("mitmdump HTTPS intercepted", "mitmdump", "wrk", API),
    ("squid CONNECT tunnel (curl)", "squid", "curl", PASS),
    ("sandgate HTTPS intercepted+inject+audit", "sandgate", "wrk", API),
    ("sandgate TLS pass-through (transparent)", "sandgate", "wrk", PASS),
    ("sandgate CONNECT pass-through (curl)", "sandgate", "curl", PASS),
    *PASS_ROWS,
]


WORKER_SECTION = "workers: intercepted HTTPS + inject + audit, 1 KiB keep-alive (wrk)"
ONE_WORKER, PINNED_WORKERS = "sandgate, 1 worker (CPU 1)", f"sandgate, {WORKERS} workers, all on CPU 1"
SPREAD_WORKERS = f"sandgate, {WORKERS} workers on CPUs {ALL_CPUS} (with the load generator)"
WORKER_ROWS = [
    (ONE_WORKER, "sandgate", "wrk", API),
    (PINNED_WORKERS, "sandgate-workers-pinned", "wrk", API),
    (SPREAD_WORKERS, "sandgate-workers", "wrk", API),
]


def _scenario(section: str, row: tuple[str, str | None, str, str], body: str, c: tuple[int, ...]) -> Scenario:
    name, proxy, tool, origin = row
    if proxy == "squid" and tool == "wrk":  # wrk speaks to squid, asking for the absolute URL
        return Scenario(section, name, proxy, tool, f"http://{GATEWAY}:{SQUID_PORT}/", c, f"{origin}/{body}")
    return Scenario(section, name, proxy, tool, f"{origin}/{body}", c, fresh=section == FRESH)


SCENARIOS = (
    [_scenario(KEEP, row, K, C) for row in KEEP_ROWS]
    + [_scenario(FRESH, row, K, (8,)) for row in HEAVY_ROWS]
    + [_scenario(BIG, row, M, (8,)) for row in HEAVY_ROWS]
    + [_scenario(H2, row, K, (32,)) for row in H2_ROWS]
    + [_scenario(WORKER_SECTION, row, K, (8, 32)) for row in WORKER_ROWS]
)


@dataclass(frozen=True)
class Ratio:
    """A design goal: `ours` over `theirs` in one section at one concurrency. `per_core` goals
    compare CPU time per request (requests/s per core); the others compare throughput."""

    what: str
    ours: str
    theirs: str
    section: str
    concurrency: int
    goal: float
    per_core: bool


OURS_INTERCEPTED, STOCK_INTERCEPTED = "sandgate HTTPS intercepted+inject+audit", "mitmdump HTTPS intercepted"
SQUID_TUNNEL, DIRECT_CURL = "squid CONNECT tunnel (curl)", "direct HTTPS (curl, verified)"
OURS_PASS, RELAY_PASS = PASS_ROWS[0][0], PASS_ROWS[1][0]  # transparent, as sandboxes connect
VERIFIED = ("sandgate CONNECT intercepted (curl)", "mitmdump CONNECT intercepted (curl)")
H2_INTERCEPTED = ("sandgate HTTPS h2 intercepted+inject+audit", "mitmdump HTTPS h2 intercepted")
RATIOS = [
    Ratio("intercepted HTTPS, sandgate / mitmdump", OURS_INTERCEPTED, STOCK_INTERCEPTED, KEEP, 1, 1.5, True),
    Ratio("intercepted HTTPS, sandgate / mitmdump", OURS_INTERCEPTED, STOCK_INTERCEPTED, KEEP, 32, 1.5, True),
    Ratio("intercepted via CONNECT (curl), sandgate / mitmdump", *VERIFIED, KEEP, 32, 1.5, True),
    Ratio(
        "new intercepted TLS conns, sandgate / mitmdump",
        OURS_INTERCEPTED,
        STOCK_INTERCEPTED,
        FRESH,
        8,
        1.5,
        True,
    ),
    Ratio("pass-through, sandgate / squid CONNECT", OURS_PASS, SQUID_TUNNEL, KEEP, 1, 1.0, False),
    Ratio("pass-through, sandgate / squid CONNECT", OURS_PASS, SQUID_TUNNEL, KEEP, 32, 1.0, False),
    Ratio("pass-through new conns, sandgate / squid", OURS_PASS, SQUID_TUNNEL, FRESH, 8, 1.0, False),
    Ratio("pass-through 1 MiB (MB/s), sandgate / squid", OURS_PASS, SQUID_TUNNEL, BIG, 8, 1.0, False),
    Ratio("pass-through per core, sandgate / squid", OURS_PASS, SQUID_TUNNEL, KEEP, 1, 1.0, True),
    Ratio("pass-through per core, sandgate / squid", OURS_PASS, SQUID_TUNNEL, KEEP, 32, 1.0, True),
    Ratio("pass-through new conns per core, sandgate / squid", OURS_PASS, SQUID_TUNNEL, FRESH, 8, 1.0, True),
    Ratio("pass-through 1 MiB per core, sandgate / squid", OURS_PASS, SQUID_TUNNEL, BIG, 8, 1.0, True),
    Ratio("pass-through, sandgate / direct (curl)", OURS_PASS, DIRECT_CURL, KEEP, 32, 0.5, False),
    Ratio("pass-through 1 MiB (MB/s), sandgate / direct", OURS_PASS, DIRECT_CURL, BIG, 8, 0.8, False),
    Ratio("pass-through, splice / mitmproxy relay per core", OURS_PASS, RELAY_PASS, KEEP, 32, 1.0, True),
    Ratio("pass-through new conns, splice / relay per core", OURS_PASS, RELAY_PASS, FRESH, 8, 1.0, True),
    Ratio("pass-through 1 MiB, splice / relay per core", OURS_PASS, RELAY_PASS, BIG, 8, 1.0, True),
    Ratio("intercepted HTTP/2 streams, sandgate / mitmdump", *H2_INTERCEPTED, H2, 32, 1.5, True),
    *(
        Ratio(
            f"{WORKERS} workers on one core / 1 worker",
            PINNED_WORKERS,
            ONE_WORKER,
            WORKER_SECTION,
            c,
            1.0,
            True,
        )
        for c in (8, 32)
    ),
    *(
        Ratio(
            f"{WORKERS} workers on {ALL_CPUS} / 1 worker",
            SPREAD_WORKERS,
            ONE_WORKER,
            WORKER_SECTION,
            c,
            1.0,
            per,
        )
        for c in (8, 32)
        for per in (True, False)
    ),
]


def run_scenario(topo: Topology, scenario: Scenario, c: int, proxies: dict[str, Proxy]) -> Load:
    proxy = proxies.get(scenario.proxy or "")
    transparent = {
        "sandgate": SANDGATE_PORTS["transparent_port"],
        "sandgate-relay": RELAY_PORTS["transparent_port"],
        "sandgate-workers-pinned": PINNED_WORKER_PORTS["transparent_port"],
        "sandgate-workers": SPREAD_WORKER_PORTS["transparent_port"],
        "mitmdump": MITMDUMP_PORT,
    }
    if scenario.tool == "h2load":
        topo.redirect_to(transparent.get(scenario.proxy or ""))

        def run() -> Load:
            return h2load(topo, scenario.url, c)

    elif scenario.tool == "wrk":
        topo.redirect_to(transparent.get(scenario.proxy or "") if not scenario.absolute_path else None)
        headers = ("Connection: close",) if scenario.fresh else ()
        if scenario.absolute_path:
            headers += ("Host: direct.example.com",)

        def run() -> Load:
            return wrk(topo, scenario.url, c, scenario.absolute_path, headers)

    else:
        explicit = {
            "sandgate": SANDGATE_PORTS["explicit_port"],
            "mitmdump": MITMDUMP_EXPLICIT_PORT,
            "squid": SQUID_PORT,
        }
        intercepted = "api." in scenario.url
        cafile = proxy.ca_cert if proxy and intercepted and proxy.ca_cert else topo.ca_cert
        port = explicit.get(scenario.proxy or "")
        if scenario.tool == "curl-transparent":  # the client dials the origin, nft redirects it
            topo.redirect_to(transparent[scenario.proxy or ""])
            port = None

        def run() -> Load:
            return curl_load(topo, scenario.url, c, port, cafile, scenario.fresh)

    load = measured(proxy, run)
    print(f"  {scenario.name:44} c={c:<3} {load.rps:9.0f} req/s {load.mbps:8.1f} MB/s", flush=True)
    return load


def download(topo: Topology, label: str, url: str, cafile: Path, proxy: Proxy | None) -> Row:
    """One 100 MiB download with curl (certificate verified); the proxy's peak RSS during it."""
    if proxy:
        proxy.reset_peak()
    before = proxy.memory_kib() if proxy else 0

    def run() -> Load:
        argv = ["curl", "-sS", "--http1.1", "--cacert", str(cafile), "-o", "/dev/null"]
        done = topo.run_client([*argv, "-w", "%{http_code} %{size_download} %{time_total}", url], 120)
        code, size, seconds = done.stdout.split()
        millis = float(seconds) * 1000
        return Load(1, int(size), float(seconds), millis, millis, int(code != "200"))

    row = Row(DOWNLOAD, label, 1, [measured(proxy, run)])
    if proxy:
        row.extra = {"rss_before_mib": before / 1024, "peak_mib": proxy.memory_kib("VmHWM") / 1024}
    print(f"  {label:44} {row.load.mbps:8.1f} MB/s", flush=True)
    return row


def idle_sandboxes(topo: Topology) -> dict[str, float]:
    """A fresh sandgate proxy's RSS with 0 and IDLE_SANDBOXES registered (never used) sandboxes."""
    from sandgate.proxy import ProxyControlError, SandboxEntry

    proxy, control = start_sandgate(topo, "sandgate-idle", IDLE_PORTS)
    time.sleep(1.0)
    empty = proxy.memory_kib()
    started = time.monotonic()
    for n in range(IDLE_SANDBOXES):
        address = f"10.213.{(4 * n) // 256}.{(4 * n) % 256 + 2}"  # lifecycle's /30 pool layout
        try:
            control.put_sandbox(SandboxEntry(sandbox_id=f"idle-{n}", address=address, policy=POLICY))  # type: ignore[attr-defined]
        except ProxyControlError as exc:
            raise RuntimeError(f"{exc}; proxy log:\n{topo.log_of('sandgate-idle')}") from exc
    push_ms = (time.monotonic() - started) / IDLE_SANDBOXES * 1000
    time.sleep(1.0)
    full = proxy.memory_kib()
    control.close()  # type: ignore[attr-defined]
    topo.stop(proxy.process)
    return {
        "rss_0_mib": empty / 1024,
        "rss_n_mib": full / 1024,
        "kib_per_sandbox": (full - empty) / IDLE_SANDBOXES,
        "push_ms": push_ms,
    }


# ---------------------------------------------------------------- noisy neighbour

# Sandbox A: NOISY_CONNECTIONS connections to the plain-HTTP host at once, one request each, then
# held open; no retries. Plain HTTP keeps A cheap on the load generators' core, which B's curl and
# nginx share. Prints "started" at once and its tally when stdin says so.
NOISY_SCRIPT = """
import asyncio, json, resource, sys
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
tally = {"ok": 0, "failed": 0}
held = []

async def one():
    try:
        reader, writer = await asyncio.open_connection("plain.example.com", 80)
        writer.write(b"GET /1k.json HTTP/1.1\\r\\nHost: plain.example.com\\r\\n\\r\\n")
        head = await reader.readuntil(b"\\r\\n\\r\\n")
        tally["ok" if head.startswith(b"HTTP/1.1 200") else "failed"] += 1
        held.append(writer)
    except Exception:
        tally["failed"] += 1

async def main():
    tasks = [asyncio.create_task(one()) for _ in range(COUNT)]
    print("started", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(json.dumps({**tally, "pending": sum(not t.done() for t in tasks)}), flush=True)

asyncio.run(main())
"""
NOISY_SECTION = "noisy neighbour: quiet sandbox B, one verified HTTPS request per new connection"


def noisy_neighbour(topo: Topology, proxy: Proxy, port: int, label: str) -> list[Row]:
    """B's latency alone, then while A opens NOISY_CONNECTIONS connections (B: QUIET_RATE
    requests/s, a new intercepted TLS connection each, for NOISY_SECONDS)."""
    topo.redirect_to(port)
    cafile = proxy.ca_cert or topo.ca_cert

    def quiet_sandbox() -> Load:
        return curl_load(
            topo, f"{API}/{K}", 1, None, cafile, fresh=True, rate=QUIET_RATE, seconds=NOISY_SECONDS
        )

    alone = Row(NOISY_SECTION, f"{label}: B alone", 1, [measured(proxy, quiet_sandbox)])
    code = f"COUNT = {NOISY_CONNECTIONS}\n" + NOISY_SCRIPT
    argv = topo.client_cmd([sys.executable, "-c", code], noisy=True)
    noisy = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert noisy.stdout and noisy.stdin
        if noisy.stdout.readline().strip() != "started":
            raise RuntimeError("the noisy neighbour did not start")
        crowded = Row(NOISY_SECTION, f"{label}: B while A opens {NOISY_CONNECTIONS}", 1)
        crowded.rounds.append(measured(proxy, quiet_sandbox))
        noisy.stdin.write("\n")
        noisy.stdin.flush()
        crowded.extra = {f"A {key}": float(n) for key, n in json.loads(noisy.stdout.readline()).items()}
    finally:
        noisy.kill()
        noisy.wait(10)
    for row in (alone, crowded):
        print(f"  {row.scenario:52} p95 {row.load.p95_ms or 0:7.1f} ms, {row.load.errors} failed", flush=True)
    return [alone, crowded]


def noisy_rows(topo: Topology) -> list[Row]:
    """A sandgate with the default limits, then one without them (backlog 100, no per-sandbox
    limits: how it was before), each measured alone and crowded."""
    from sandgate.proxy import SandboxEntry

    rows: list[Row] = []
    variants: tuple[tuple[str, str, dict[str, int], dict[str, object]], ...] = (
        ("limits (defaults)", "sandgate-limited", LIMITED_PORTS, {}),
        (
            "no limits, backlog 100",
            "sandgate-unlimited",
            UNLIMITED_PORTS,
            {"limits": NO_LIMITS, "listen_backlog": 100},
        ),
    )
    for label, name, ports, extra in variants:
        proxy, control = start_sandgate(topo, name, ports, PROXY_CPU, **extra)
        try:
            for sandbox_id, address in (("bench", CLIENT), ("noisy", NOISY)):
                control.put_sandbox(SandboxEntry(sandbox_id=sandbox_id, address=address, policy=POLICY))  # type: ignore[attr-defined]
            rows += noisy_neighbour(topo, proxy, ports["transparent_port"], label)
        finally:
            control.close()  # type: ignore[attr-defined]
            topo.stop(proxy.process)
    return rows


# ---------------------------------------------------------------- the run


def run_all(topo: Topology) -> None:
    rows: list[Row] = []
    audit_lines: int | None = None
    if "noisy" in ONLY:
        rows += noisy_rows(topo)
    if ONLY & {"load", "workers"}:
        sandgate = start_load_sandgate(topo, "sandgate", SANDGATE_PORTS)
        rows += load_rows(topo, sandgate)
        audit_lines = sum(
            len(p.read_bytes().splitlines())
            for p in (sandgate.state_dir or topo.workdir).glob("audit.jsonl*")
        )
        topo.stop(sandgate.process)
    idle = idle_sandboxes(topo) if "load" in ONLY else None
    report(rows, idle, audit_lines)


def start_load_sandgate(
    topo: Topology, name: str, ports: dict[str, int], cpus: str = PROXY_CPU, **extra: object
) -> Proxy:
    """A sandgate proxy for the load rows: the client's sandbox entry pushed, no limits (rule 5)."""
    from sandgate.proxy import SandboxEntry

    proxy, control = start_sandgate(topo, name, ports, cpus, limits=NO_LIMITS, **extra)
    control.put_sandbox(SandboxEntry(sandbox_id="bench", address=CLIENT, policy=POLICY))  # type: ignore[attr-defined]
    control.close()  # type: ignore[attr-defined]
    return proxy


def load_rows(topo: Topology, sandgate: Proxy) -> list[Row]:
    """The back-to-back rows against mitmdump and squid, then the 100 MiB downloads."""
    proxies = {
        "sandgate": sandgate,
        "sandgate-relay": start_load_sandgate(topo, "sandgate-relay", RELAY_PORTS, splice_passthrough=False),
        "sandgate-workers-pinned": start_load_sandgate(
            topo, "sandgate-workers-pinned", PINNED_WORKER_PORTS, workers=WORKERS
        ),
        "sandgate-workers": start_load_sandgate(
            topo, "sandgate-workers", SPREAD_WORKER_PORTS, cpus=ALL_CPUS, workers=WORKERS
        ),
        "mitmdump": start_mitmdump(topo),
        "squid": start_squid(topo),
    }
    for note in check_paths(topo, sandgate, proxies["mitmdump"]):
        print(f"  {note}")
    chosen = [s for s in SCENARIOS if "load" in ONLY or s.section == WORKER_SECTION]
    plan = [(s, c) for s in chosen for c in s.concurrency]
    rows = [Row(s.section, s.name, c) for s, c in plan]
    groups: dict[tuple[str, int], list[int]] = {}  # rows compared with each other run back to back
    for index, (scenario, c) in enumerate(plan):
        groups.setdefault((scenario.section, c), []).append(index)
    for round_number in range(ROUNDS):
        print(f"round {round_number + 1} of {ROUNDS}", flush=True)
        for members in groups.values():
            for index in members if round_number % 2 == 0 else reversed(members):  # ABBA
                rows[index].rounds.append(run_scenario(topo, *plan[index], proxies))
    topo.redirect_to(None)
    if "load" not in ONLY:
        for name in ("sandgate-relay", "sandgate-workers-pinned", "sandgate-workers", "mitmdump", "squid"):
            topo.stop(proxies[name].process)
        return rows
    downloads = [download(topo, "direct", "https://direct.example.com/100m.bin", topo.ca_cert, None)]
    topo.redirect_to(SANDGATE_PORTS["transparent_port"])
    sandgate_ca = sandgate.ca_cert or topo.ca_cert
    downloads += [
        download(topo, "sandgate intercepted", "https://api.example.com/100m.bin", sandgate_ca, sandgate),
        download(
            topo, "sandgate TLS pass-through", "https://pass.example.com/100m.bin", topo.ca_cert, sandgate
        ),
    ]
    for name in ("sandgate-relay", "sandgate-workers-pinned", "sandgate-workers", "mitmdump", "squid"):
        topo.stop(proxies[name].process)
    return rows + downloads


def report(rows: list[Row], idle: dict[str, float] | None, audit_lines: int | None) -> None:
    columns = [("c", 3), ("req/s", 8), ("p50 ms", 8), ("p99 ms", 8), ("MB/s", 8), ("CPU%", 5)]
    columns += [("CPU ms/req", 10), ("PSS MiB", 8), ("err", 4), ("LG cores", 8), ("idle", 5)]
    header = f"{'scenario':46} " + " ".join(f"{name:>{width}}" for name, width in columns)
    for section in dict.fromkeys(row.section for row in rows if row.section != NOISY_SECTION):
        print(f"\n{section}\n{header}")
        for row in (r for r in rows if r.section == section):
            print(_line(row))
            if row.extra:
                before, peak = row.extra["rss_before_mib"], row.extra["peak_mib"]
                print(f"{'':50} proxy RSS before {before:.1f} MiB, peak during (VmHWM) {peak:.1f} MiB")
    noisy = [row for row in rows if row.section == NOISY_SECTION]
    if noisy:
        report_noisy(noisy)
    if ONLY & {"load", "workers"}:
        report_ratios(rows, idle)
    if audit_lines is not None:
        print(f"  sandgate wrote {audit_lines} audit records during the load rows")


def report_noisy(rows: list[Row]) -> None:
    print(f"\n{NOISY_SECTION} ({QUIET_RATE}/s for {NOISY_SECONDS} s)")
    print(
        f"{'scenario':52} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'B ok':>5} {'B err':>5}  A's connections"
    )
    for row in rows:
        load = row.load
        tally = ", ".join(f"{key.split()[1]} {n:.0f}" for key, n in row.extra.items())
        print(
            f"{row.scenario:52} {load.p50_ms or 0:8.1f} {load.p95_ms or 0:8.1f} {load.p99_ms or 0:8.1f}"
            f" {load.requests:5} {load.errors:5}  {tally}"
        )
    for alone, crowded in zip(rows[::2], rows[1::2], strict=True):
        ratio = (crowded.load.p95_ms or 0) / (alone.load.p95_ms or float("inf"))
        met = ratio <= 2.0 and crowded.load.errors == 0
        print(
            f"  {crowded.scenario.split(':')[0]}: B's p95 crowded / alone {ratio:.2f}x, "
            f"{crowded.load.errors} failed [goal <= 2x and none failed: {'met' if met else 'MISSED'}]"
        )


def report_ratios(rows: list[Row], idle: dict[str, float] | None) -> None:
    print(
        "\nratios, median over the rounds (each round compares runs made back to back; min-max):"
        "\nthroughput = req/s (MB/s for 1 MiB); per core = inverse of the proxies' CPU time per request"
    )
    for ratio in RATIOS:
        if not any(r.section == ratio.section for r in rows):
            continue
        ours, theirs = (
            _find(rows, name, ratio.section, ratio.concurrency) for name in (ratio.ours, ratio.theirs)
        )
        goal = f"goal >= {ratio.goal}x {'per core' if ratio.per_core else 'throughput'}"
        invalid = _invalid((ours, theirs), ratio.per_core)
        if invalid:
            print(f"  {ratio.what:52} c={ratio.concurrency:<3} invalid: {invalid}  [{goal}: MISSED]")
            continue
        pairs = list(zip(ours.rounds, theirs.rounds, strict=True))
        throughput = [a.mbps / b.mbps if ratio.section == BIG else a.rps / b.rps for a, b in pairs]
        per_core = [
            b.cpu_ms_per_request / a.cpu_ms_per_request
            for a, b in pairs
            if a.cpu_ms_per_request and b.cpu_ms_per_request
        ]
        judged = statistics.median(per_core if ratio.per_core else throughput)
        print(
            f"  {ratio.what:52} c={ratio.concurrency:<3} throughput {_spread(throughput)}  "
            f"per core {_spread(per_core) if per_core else '    -'}  "
            f"[{goal}: {'met' if judged >= ratio.goal else 'MISSED'}]"
        )
    if idle is None:
        return
    per = idle["kib_per_sandbox"]
    print(
        f"  idle sandboxes: RSS {idle['rss_0_mib']:.1f} MiB with 0, "
        f"{idle['rss_n_mib']:.1f} MiB with {IDLE_SANDBOXES}"
        f" -> {per:.0f} KiB per sandbox [< 1024 KiB: {'met' if per < 1024 else 'MISSED'}];"
        f" {idle['push_ms']:.1f} ms per PUT"
    )


def _line(row: Row) -> str:
    load = row.load

    def opt(value: float | None, width: int, digits: int) -> str:
        return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

    cpu_percent = load.cpu_seconds / load.seconds * 100 if load.cpu_seconds is not None else None
    return (
        f"{row.scenario:46} {row.concurrency:>3} {load.rps:8.0f} {opt(load.p50_ms, 8, 2)} "
        f"{opt(load.p99_ms, 8, 2)} {load.mbps:8.1f} {opt(cpu_percent, 5, 0)} "
        f"{opt(load.cpu_ms_per_request, 10, 2)} {opt(load.pss_mib, 8, 1)} {load.errors:>4} "
        f"{opt(load.loadgen_cores, 8, 2)} {opt(load.idle_cores, 5, 2)}"
    )


def _invalid(rows: tuple[Row, Row], per_core: bool) -> str | None:
    """Why no ratio of these rows can be computed: a round with failed requests, with none
    finished, or (for a per-core ratio) without the proxy's CPU time."""
    reasons = []
    for row in rows:
        errors = [load.errors for load in row.rounds]
        if any(errors):
            reasons.append(f"{row.scenario} had {'/'.join(map(str, errors))} failed requests per round")
        elif not all(load.requests for load in row.rounds):
            reasons.append(f"{row.scenario} finished no request in a round")
        elif per_core and not all(load.cpu_ms_per_request for load in row.rounds):
            reasons.append(f"{row.scenario} has no CPU time per request")
    return "; ".join(reasons) or None


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f}x ({min(values):.2f}-{max(values):.2f})"


def _find(rows: list[Row], scenario: str, section: str, c: int) -> Row:
    return next(r for r in rows if r.scenario == scenario and r.section == section and r.concurrency == c)


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    pressure = (
        Path("/proc/pressure/cpu").read_text().split()[1:3] if Path("/proc/pressure/cpu").exists() else []
    )
    busy = f", CPU pressure (time some task waited for a CPU) {' '.join(pressure)}" if pressure else ""
    return f"{os.cpu_count()} CPUs ({cpu}), kernel {os.uname().release}, load average {load}{busy}"


@contextlib.contextmanager
def terminated_by_signals() -> Iterator[None]:
    """SIGTERM/SIGINT raise, so `finally` blocks tear the topology down."""

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def bench_world(prefix: str) -> Iterator[Topology]:
    """This process in a fresh network namespace with the benchmark's world started in it (rule
    1), torn down when the block ends, also on SIGTERM/SIGINT; the machine's state before and after."""
    enter_private_netns()
    print(f"machine: {machine()}; {SECONDS} s per run, {ROUNDS} round(s)", flush=True)
    names = {f"{n}.example.com": DIRECT if n == "direct" else REDIRECTED for n in NAMES}
    with (
        terminated_by_signals(),
        tempfile.TemporaryDirectory(prefix=prefix) as tmp,
        Topology(Path(tmp)) as topo,
    ):
        topo.start(names)
        yield topo
    print(f"machine after the run: {machine()}")


def _child() -> None:
    with bench_world("sg-bench-proxy-") as topo:
        run_all(topo)


def main() -> None:
    if os.geteuid() != 0:
        print("bench_proxy needs root (network namespaces, nftables); skipped")
        return
    env = {**os.environ, CHILD_FLAG: "1"}
    subprocess.run([sys.executable, "-m", "bench.bench_proxy"], env=env, cwd=REPO, check=True, timeout=1200)


if __name__ == "__main__" and os.environ.get(CHILD_FLAG) == "1":
    _child()

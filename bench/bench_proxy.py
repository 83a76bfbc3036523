"""Egress proxy throughput: sandgate's proxy vs stock mitmdump, on this machine, in one run.

Runs in a fresh network namespace of its own (re-executes itself under `unshare --net`, as
root) with the test internet (tests/support/internet.py) as origin and DNS, so no packet leaves
the machine. Load: closed-loop keep-alive clients (2 processes x 8 connections), each scenario
bounded to DURATION seconds. Scenarios:

- intercepted HTTPS, small responses: sandgate (policy + bearer injection + scrub + audit) vs
  stock `mitmdump -q` (intercepting, no addons) -> requests/s and the ratio;
- pass-through TLS, 8 MiB downloads: sandgate (policy decides at ClientHello, bytes relayed
  untouched) vs mitmdump `--ignore-hosts .*` vs direct -> MB/s and ratios.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

DURATION = 5.0
PROCESSES, CONNECTIONS = 2, 8
DOWNLOAD = 8 * 1024 * 1024
OURS, STOCK, STOCK_PASS = 15002, 16002, 16003


def main() -> None:
    if os.geteuid() != 0:
        print("bench_proxy needs root (own network namespace); skipped")
        return
    if os.environ.get("SANDGATE_BENCH_NETNS") != "1":
        env = {**os.environ, "SANDGATE_BENCH_NETNS": "1"}
        subprocess.run(["unshare", "--net", sys.executable, "-m", "bench", "proxy"], env=env, check=True)
        return
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    from tests.support.internet import ORIGIN_V4, start_internet

    work = Path(tempfile.mkdtemp(prefix="sg-bench-"))
    try:
        with start_internet(work / "internet") as net:
            net.set_names({"api.example.com": [ORIGIN_V4], "pass.example.com": [ORIGIN_V4]})
            run_all(work, net)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_all(work: Path, net) -> None:  # type: ignore[no-untyped-def]
    from tests.support.internet import ORIGIN_V4

    ours = start_ours(work, net)
    stock = start_stock(work, net, STOCK, [])
    stock_pass = start_stock(work, net, STOCK_PASS, ["--ignore-hosts", ".*"])
    try:
        proxy_ca = str(work / "sandgate" / "mitmproxy-ca-cert.pem")
        stock_ca = str(work / f"mitm{STOCK}" / "mitmproxy-ca-cert.pem")
        rows = []
        ours_rps = load(OURS, "api.example.com", proxy_ca, "/echo")
        stock_rps = load(STOCK, ORIGIN_V4, stock_ca, "/echo", sni="api.example.com")
        rows.append(("intercepted HTTPS req/s (policy+inject+audit)", ours_rps, stock_rps))
        direct = load(
            None, ORIGIN_V4, str(net.ca_cert), f"/bytes?n={DOWNLOAD}", sni="pass.example.com", mb=True
        )
        ours_mb = load(OURS, "pass.example.com", str(net.ca_cert), f"/bytes?n={DOWNLOAD}", mb=True)
        stock_mb = load(
            STOCK_PASS, ORIGIN_V4, str(net.ca_cert), f"/bytes?n={DOWNLOAD}", sni="pass.example.com", mb=True
        )
        print(f"{'scenario':48} {'sandgate':>10} {'mitmdump':>10} {'ratio':>7}")
        for name, mine, theirs in rows:
            print(f"{name:48} {mine:10.1f} {theirs:10.1f} {mine / theirs:7.2f}")
        print(
            f"{'pass-through TLS MB/s (8 MiB downloads)':48} {ours_mb:10.1f} {stock_mb:10.1f} "
            f"{ours_mb / stock_mb:7.2f}"
        )
        print(
            f"{'direct (no proxy) MB/s, same downloads':48} {direct:10.1f} {'':>10} {ours_mb / direct:7.2f}"
        )
        records = sum(1 for _ in (work / "sandgate" / "audit.jsonl").open())
        print(f"audit records written by sandgate during the run: {records}")
    finally:
        for process in (ours, stock, stock_pass):
            process.terminate()
            process.wait(10)


def start_ours(work: Path, net) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    from sandgate.proxy import ProxyConfig, ProxyControl, SandboxEntry
    from sandgate.vault import generate_master_key, open_store
    from tests.support.internet import DNS_ADDR

    key = generate_master_key()
    open_store("local", work / "vault", key).put("api-token", "bench-secret-value-1234")
    policy = {
        "egress": [
            {"action": "allow", "target": "api.example.com"},
            {"action": "allow", "target": "pass.example.com"},
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
    config = ProxyConfig(
        state_dir=work / "sandgate",
        listen_host="127.0.0.1",
        explicit_port=OURS,
        transparent_port=OURS - 1,
        dns_port=OURS + 51,
        upstream_dns=[DNS_ADDR],
        upstream_ca=net.ca_cert,
        vault={"backend": "local", "state_dir": str(work / "vault"), "vault_key": key},
        sandboxes=[SandboxEntry(sandbox_id="bench", address="127.0.0.1", policy=policy)],
    )
    config.state_dir.mkdir(parents=True)
    (work / "proxy.json").write_text(config.model_dump_json())
    process = subprocess.Popen([sys.executable, "-m", "sandgate.proxy", "--config", str(work / "proxy.json")])
    wait_until(lambda: ProxyControl(config.socket_path).health())
    return process


def start_stock(work: Path, net, port: int, extra: list[str]) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    import certifi

    confdir = work / f"mitm{port}"
    confdir.mkdir()
    bundle = confdir / "trust.pem"
    bundle.write_bytes(Path(certifi.where()).read_bytes() + net.ca_cert.read_bytes())
    mitmdump = Path(sys.executable).parent / "mitmdump"
    process = subprocess.Popen(
        [
            str(mitmdump),
            "-q",
            "--mode",
            f"regular@127.0.0.1:{port}",
            "--set",
            f"confdir={confdir}",
            "--set",
            f"ssl_verify_upstream_trusted_ca={bundle}",
            *extra,
        ]
    )
    wait_until(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close())
    wait_until(lambda: (confdir / "mitmproxy-ca-cert.pem").stat())
    return process


def wait_until(probe, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def load(
    proxy_port: int | None, target: str, cafile: str, path: str, sni: str | None = None, mb: bool = False
) -> float:
    """Requests/s (or MB/s with mb=True) over PROCESSES x CONNECTIONS keep-alive connections."""
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        results = pool.starmap(_worker, [(proxy_port, target, cafile, path, sni)] * PROCESSES)
    requests = sum(r[0] for r in results)
    size = sum(r[1] for r in results)
    return (size / 1e6 if mb else requests) / DURATION


def _worker(proxy_port: int | None, target: str, cafile: str, path: str, sni: str | None) -> tuple[int, int]:
    import http.client

    deadline = time.monotonic() + DURATION
    totals = [0, 0]
    lock = threading.Lock()

    def connection() -> None:
        context = ssl.create_default_context(cafile=cafile)
        context.check_hostname = (
            False  # the load is the subject, not name checks (the proxy verifies upstream)
        )
        if proxy_port is None:
            conn = http.client.HTTPSConnection(target, 443, context=context, timeout=30)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", proxy_port, context=context, timeout=30)
            conn.set_tunnel(target, 443)
        if sni:
            conn._create_connection = _with_sni(conn, context, sni)  # type: ignore[attr-defined]
        done = size = 0
        try:
            while time.monotonic() < deadline:
                conn.request("GET", path, headers={"Host": sni or target})
                size += len(conn.getresponse().read())
                done += 1
        except (OSError, http.client.HTTPException) as exc:
            print(f"bench connection via {proxy_port} to {target} failed: {exc!r}", file=sys.stderr)
        with lock:
            totals[0] += done
            totals[1] += size

    threads = [threading.Thread(target=connection) for _ in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return totals[0], totals[1]


def _with_sni(conn, context: ssl.SSLContext, sni: str):  # type: ignore[no-untyped-def]
    """Wrap with `sni` as server_hostname, whatever address the connection dials."""
    original = context.wrap_socket

    def wrap(sock, server_hostname=None, **kw):  # type: ignore[no-untyped-def]
        return original(sock, server_hostname=sni, **kw)

    context.wrap_socket = wrap  # type: ignore[method-assign]
    return socket.create_connection


if __name__ == "__main__":
    main()

"""The proxy benchmark's own small world: an origin namespace and two client namespaces.

Rules:
1. Only the process's own network namespace is touched. `enter_private_netns()` moves the
   calling process into a fresh one (lo up) first; it plays "the host", where the proxies under
   test run. Three named namespaces (random suffixes) hang off it by veths: the origin
   (198.51.100.0/24: nginx and a DNS server), the client (203.0.113.0/30: the load
   generators) and a second client, "noisy" (203.0.113.4/30: the noisy neighbour of the
   fairness rows). No route leads anywhere else.
2. Every process started here is recorded and stopped by PID, every namespace, veth and nft
   table deleted by name, in `close()`, also when the benchmark fails half way.
3. The client reaches the origin two ways: `DIRECT` (routed by the host, no proxy) and
   `REDIRECTED` (the same nginx, but the host's nftables redirects the client's TCP to the
   transparent port of the proxy under test, the way sandgate's sandbox network does).
   Client programs see names through a private /etc/hosts (mount namespace of their own).

Origin content: `/1k.json` (1 KiB JSON), `/1m.bin` (1 MiB), `/100m.bin` (100 MiB), and `/check`,
whose requests nginx logs with their Authorization header (`authorization_seen()`), so the
benchmark can prove that injection happened. HTTP on 80, HTTPS (HTTP/1.1 and h2) on 443 with a
certificate from a test CA made here for *.example.com.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.internet import make_test_ca
from tests.support.netns import Netns, ip, unique

REPO = Path(__file__).resolve().parents[1]
HOST_V4 = "198.51.100.1"  # the host's end of the origin veth
DIRECT = "198.51.100.10"  # nginx, reached without a proxy
REDIRECTED = "198.51.100.11"  # the same nginx; client TCP to it goes to the proxy under test
DNS_ADDR = "198.51.100.53"
GATEWAY, CLIENT = "203.0.113.1", "203.0.113.2"  # host and client ends of the client veth
NOISY_GATEWAY, NOISY = "203.0.113.5", "203.0.113.6"  # a second client: the noisy neighbour
LOADGEN_CPU, PROXY_CPU = "0", "1"  # origin and load generators share one core, the proxy gets the other
BODIES = {"1k.json": 1024, "1m.bin": 1024 * 1024, "100m.bin": 100 * 1024 * 1024}
STOP_TIMEOUT = 10.0

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 10000000;
  keepalive_timeout 120s;
  types {{ application/json json; application/octet-stream bin; }}
  client_body_temp_path {dir}/tmp/body;
  proxy_temp_path {dir}/tmp/proxy;
  fastcgi_temp_path {dir}/tmp/fastcgi;
  uwsgi_temp_path {dir}/tmp/uwsgi;
  scgi_temp_path {dir}/tmp/scgi;
  log_format auth '$host $request_uri $http_authorization';
  server {{
    listen 80 backlog=4096;
    listen 443 ssl http2 backlog=4096;
    ssl_certificate {dir}/leaf.pem;
    ssl_certificate_key {dir}/leaf-key.pem;
    root {dir}/www;
    location = /check {{ access_log {dir}/check.log auth; return 200 "checked\\n"; }}
  }}
}}
"""


def enter_private_netns() -> None:
    """Move this process into a fresh network namespace with only lo up (needs root)."""
    os.unshare(os.CLONE_NEWNET)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")  # this namespace's own switch


class Topology:
    """Build with `Topology(workdir).start(names)`; always `close()` (or use `with`)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.origin: Netns | None = None
        self.client: Netns | None = None
        self.noisy: Netns | None = None  # a second sandbox-like client, redirected the same way
        self.links: list[str] = []
        self.nft_table = unique("sgbench")
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.hosts_file = workdir / "client-hosts"
        self.origin_hosts_file = workdir / "origin-hosts"  # the names, all at DIRECT (for proxies)
        self.ca_cert = workdir / "ca.pem"

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ building

    def start(self, client_names: dict[str, str]) -> Topology:
        """`client_names`: the client's /etc/hosts (name -> DIRECT or REDIRECTED). The proxies see
        every name at DIRECT (the origin's DNS server, or `origin_hosts_file`)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o755)  # nginx's workers (www-data) read the bodies and log here
        make_test_ca(self.workdir)  # ca.pem, ca-key.pem, leaf.pem, leaf-key.pem
        self.hosts_file.write_text("".join(f"{addr} {name}\n" for name, addr in client_names.items()))
        self.origin_hosts_file.write_text("".join(f"{DIRECT} {name}\n" for name in client_names))
        self._build_links()
        self._start_nginx()
        self._start_dns({name: DIRECT for name in client_names})
        return self

    def _build_links(self) -> None:
        self.origin, self.client, self.noisy = Netns("sgbo"), Netns("sgbc"), Netns("sgbn")
        origin_if, client_if, noisy_if = unique("sgbvo"), unique("sgbvc"), unique("sgbvn")
        links = ((origin_if, self.origin), (client_if, self.client), (noisy_if, self.noisy))
        for host_if, ns in links:
            ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
            self.links.append(host_if)
        ip("addr", "add", f"{HOST_V4}/24", "dev", origin_if)
        for addr in (DIRECT, REDIRECTED, DNS_ADDR):
            ip("addr", "add", f"{addr}/24", "dev", "eth0", netns=self.origin.name)
        for host_if, ns, gateway, address in (
            (client_if, self.client, GATEWAY, CLIENT),
            (noisy_if, self.noisy, NOISY_GATEWAY, NOISY),
        ):
            ip("addr", "add", f"{gateway}/30", "dev", host_if)
            ip("addr", "add", f"{address}/30", "dev", "eth0", netns=ns.name)
        for host_if, ns in links:
            ip("link", "set", host_if, "up")
            ip("link", "set", "eth0", "up", netns=ns.name)
        for ns, gateway in ((self.client, GATEWAY), (self.noisy, NOISY_GATEWAY)):
            ip("route", "add", "198.51.100.0/24", "via", gateway, netns=ns.name)
        ip("route", "add", "203.0.113.0/29", "via", HOST_V4, netns=self.origin.name)
        self.client_ifs = (client_if, noisy_if)
        self.redirect_to(None)

    def redirect_to(self, port: int | None) -> None:
        """Send the client's TCP for REDIRECTED to this host port (a transparent proxy under test);
        None: refuse it (so no run reaches the origin unproxied by mistake)."""
        clients = ", ".join(f'"{name}"' for name in self.client_ifs)
        match = f"iifname {{ {clients} }} ip daddr {REDIRECTED} tcp dport {{ 80, 443 }}"
        nat = f"{match} redirect to :{port}" if port else ""
        refuse = "" if port else f"{match} reject with tcp reset"
        rules = f"""
table inet {self.nft_table} {{}}
delete table inet {self.nft_table}
table inet {self.nft_table} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    {nat}
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    {refuse}
  }}
}}
"""
        done = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"nft refused the benchmark's redirect table: {done.stderr}\n{rules}")

    def _start_nginx(self) -> None:
        assert self.origin is not None
        www = self.workdir / "www"
        for sub in ("www", "tmp"):
            (self.workdir / sub).mkdir(exist_ok=True)
        (www / "1k.json").write_text(json.dumps({"data": "x" * 1011}) + "\n")
        assert (www / "1k.json").stat().st_size == BODIES["1k.json"]
        for name in ("1m.bin", "100m.bin"):
            with (www / name).open("wb") as fh:
                fh.truncate(BODIES[name])  # sparse: the origin serves it from the page cache
        conf = self.workdir / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=self.workdir))
        argv = ["taskset", "-c", LOADGEN_CPU, "nginx", "-p", str(self.workdir), "-c", str(conf)]
        argv += ["-e", str(self.workdir / "nginx-error.log")]
        self.spawn("nginx", self.origin.cmd(argv))
        self.wait_tcp(self.origin, DIRECT, 443)

    def _start_dns(self, names: dict[str, str]) -> None:
        assert self.origin is not None
        zone = self.workdir / "zone.json"
        zone.write_text(json.dumps(names))
        argv = [sys.executable, "-m", "bench.topology", "dns", DNS_ADDR, str(zone)]
        self.spawn("dns", self.origin.cmd(["taskset", "-c", LOADGEN_CPU, *argv]), cwd=REPO)

    # ------------------------------------------------------------------ processes

    def spawn(self, name: str, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start a process (its output goes to <workdir>/<name>.log); stopped by PID in close()."""
        log = (self.workdir / f"{name}.log").open("ab")
        process = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[call-overload]
        self.processes.append((name, process))
        return process  # type: ignore[no-any-return]

    def stop(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT)
        self.processes = [(n, p) for n, p in self.processes if p is not process]

    def log_of(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def client_cmd(self, argv: Sequence[str], cpu: str = LOADGEN_CPU, noisy: bool = False) -> list[str]:
        """Run `argv` in the client namespace (the noisy one if `noisy`), on `cpu`, with the
        client's /etc/hosts."""
        ns = self.noisy if noisy else self.client
        assert ns is not None
        return ns.cmd(self.with_hosts_file(["taskset", "-c", cpu, *argv], self.hosts_file))

    def with_hosts_file(self, argv: Sequence[str], hosts_file: Path) -> list[str]:
        """Run `argv` here (the host namespace) with `hosts_file` as its /etc/hosts."""
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        return ["unshare", "--mount", "sh", "-c", script, str(hosts_file), *argv]

    def run_client(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.client_cmd(argv), capture_output=True, text=True, timeout=timeout)

    def wait_tcp(self, ns: Netns | None, address: str, port: int, timeout: float = 15.0) -> None:
        """Until something accepts on address:port (seen from `ns`, or from here)."""
        probe = [sys.executable, "-c", f"import socket; socket.create_connection(('{address}', {port}), 1)"]
        deadline = time.monotonic() + timeout
        while subprocess.run(ns.cmd(probe) if ns else probe, capture_output=True).returncode != 0:
            dead = [name for name, process in self.processes if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {name}:\n{self.log_of(name)}" for name in dead)
                raise RuntimeError(f"nothing listens on {address}:{port} (exited: {dead})\n{logs}")
            time.sleep(0.1)

    def authorization_seen(self) -> list[str]:
        """Lines nginx logged for /check: `host uri authorization`."""
        path = self.workdir / "check.log"
        return path.read_text().splitlines() if path.exists() else []

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        for _name, process in reversed(self.processes):
            self.stop(process)
        subprocess.run(["nft", "delete", "table", "inet", self.nft_table], capture_output=True)
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in (self.noisy, self.client, self.origin):
            if ns is not None:
                ns.delete()


def serve_dns(address: str, zone_file: Path) -> None:
    """A tiny authoritative DNS server (A records from the zone file), until SIGTERM."""
    from dnslib import QTYPE, RR, SOA, A, DNSRecord
    from dnslib.server import DNSLogger, DNSServer

    zone: dict[str, str] = json.loads(zone_file.read_text())
    # Negative answers carry the zone's SOA, as real servers' do, so resolvers may cache them.
    soa = RR(
        "example.com.",
        QTYPE.SOA,
        rdata=SOA("ns.example.com.", "hostmaster.example.com.", (1, 3600, 600, 86400, 3600)),
        ttl=3600,
    )

    class Zone:
        def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
            name = str(request.q.qname).lower().rstrip(".")
            reply = request.reply()
            if name in zone and QTYPE[request.q.qtype] == "A":
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(zone[name]), ttl=3600))
                return reply
            if name not in zone:
                reply.header.rcode = 3  # NXDOMAIN
            reply.add_auth(soa)
            return reply

    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # before the server thread starts
    quiet = DNSLogger("-request,-reply,-truncated,-error,-recv,-send,-data")
    server = DNSServer(Zone(), address=address, port=53, logger=quiet)  # type: ignore[arg-type]
    server.start_thread()
    signal.sigwait(stop_signals)
    server.stop()


if __name__ == "__main__" and sys.argv[1:2] == ["dns"]:
    serve_dns(sys.argv[2], Path(sys.argv[3]))

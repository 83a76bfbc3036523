"""A company's proxy for tests: Debian's squid behind basic auth, in the test internet's namespace.

Rules: squid listens on its own address (`SQUID_V4`) in the test internet's namespace (no route
anywhere else), dials the origins from that address (`tcp_outgoing_address`, so the origins'
log tells a request squid made from one the gateway made directly, which comes from
`HOST_V4`), and resolves names with the test DNS. Every request must log in with basic auth
(`basic_ncsa_auth` over an htpasswd file made here with `openssl passwd -apr1`). Its access log
has one line per request: `time client user method url status header`, the last being the
identity header sandgate puts on each CONNECT. squid runs in the foreground (-N) in a session
of its own and is stopped by that session's id, helpers included, also when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.internet import DNS_ADDR, Internet
from tests.support.netns import ip

SQUID_V4 = "198.51.100.60"
SQUID_PORT = 3128
IDENTITY_HEADER = "X-Sandgate-Sandbox"
TENANT_HEADER = "X-Sandgate-Tenant"
READY_TIMEOUT = 30.0
CONFIG = """
http_port {address}:{port}
pid_filename {work}/squid.pid
cache_log {work}/cache.log
logformat sandgate %ts.%03tu %>a %un %rm %ru %>Hs %{{{header}}}>h %{{{tenant}}}>h
access_log stdio:{work}/access.log sandgate
cache deny all
coredump_dir {work}
pinger_enable off
shutdown_lifetime 0 seconds
visible_hostname squid.example.test
dns_nameservers {dns}
tcp_outgoing_address {address}
auth_param basic program /usr/lib/squid/basic_ncsa_auth {work}/htpasswd
auth_param basic realm sandgate-test
acl authed proxy_auth REQUIRED
acl SSL_ports port 443
acl Safe_ports port 80 443
acl CONNECT method CONNECT
http_access deny !Safe_ports
http_access deny CONNECT !SSL_ports !Safe_ports
http_access allow authed
http_access deny all
"""
CONFIG_FIELDS = {
    "address": SQUID_V4,
    "port": SQUID_PORT,
    "dns": DNS_ADDR,
    "header": IDENTITY_HEADER,
    "tenant": TENANT_HEADER,
}


@dataclass
class Squid:
    work: Path
    username: str
    password: str
    process: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str:
        return f"http://{SQUID_V4}:{SQUID_PORT}"

    def access_log(self) -> list[list[str]]:
        """One list of fields per request: time, client, user, method, url, status, identity header,
        tenant header ('-': none)."""
        path = self.work / "access.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None


@contextlib.contextmanager
def start_squid(internet: Internet, username: str, password: str) -> Iterator[Squid]:
    work = Path(tempfile.mkdtemp(prefix="sandgate-squid-"))
    squid = Squid(work, username, password, None)
    proxy_user = pwd.getpwnam("proxy")
    ip("addr", "add", f"{SQUID_V4}/24", "dev", "eth0", netns=internet.netns_name)
    try:
        os.chmod(work, 0o755)
        hashed = subprocess.run(
            ["openssl", "passwd", "-apr1", "-stdin"],
            input=password,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        (work / "htpasswd").write_text(f"{username}:{hashed}\n")
        config = CONFIG.format(work=work, **CONFIG_FIELDS)
        (work / "squid.conf").write_text(config)
        for path in (work, work / "htpasswd"):
            os.chown(path, proxy_user.pw_uid, proxy_user.pw_gid)
        squid.process = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{internet.netns_name}", "--",
             "squid", "-N", "-f", str(work / "squid.conf")],
            stdout=(work / "squid.out").open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        _wait_listening(squid)
        yield squid
    finally:
        squid.stop()
        subprocess.run(["ip", "-n", internet.netns_name, "addr", "del", f"{SQUID_V4}/24", "dev", "eth0"],
                       capture_output=True)  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)


def _wait_listening(squid: Squid) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        with contextlib.suppress(OSError), socket.create_connection((SQUID_V4, SQUID_PORT), timeout=1):
            return
        assert squid.process is not None
        if squid.process.poll() is not None or time.monotonic() > deadline:
            out = (squid.work / "squid.out").read_text(errors="replace")
            cache = (
                (squid.work / "cache.log").read_text(errors="replace")
                if (squid.work / "cache.log").exists()
                else ""
            )
            raise RuntimeError(f"squid did not start (exit {squid.process.poll()}):\n{out}\n{cache}")
        time.sleep(0.1)

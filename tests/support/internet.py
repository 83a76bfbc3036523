"""The test "internet": origin servers and a DNS server in a namespace of their own.

Rules: everything here lives in a network namespace with a random name, joined to the test's
host namespace by one veth with explicit addresses (198.51.100.0/24 and 2001:db8::/64); nothing
is reachable beyond it and nothing in it can reach the machine's network. Every process is
started here and stopped by PID, the namespace is deleted on teardown, also when a test fails.

Use it as a fixture (`from tests.support.internet import internet` in a conftest) or as a
context manager (`with start_internet(workdir) as net: ...`). What it serves, on every origin
address (`ORIGIN_V4`, `ORIGIN_V4_ALT`, `ORIGIN_V6`), HTTP on port 80 and HTTPS on port 443
(certificate from a test CA made here, `net.ca_cert`, valid for *.example.com, *.example.test
and the origin addresses):

    GET  /               "hello from origin"
    ANY  /echo           JSON {"method", "path", "headers": {...}, "body"}: reflects the request;
                         ?chunk=N streams that JSON in N-byte pieces (?gap=S apart, default
                         0.005), ?reflect=NAME also returns
                         request header NAME as response header `x-reflected`
    GET  /sse?n=3&gap=0.3  text/event-stream, n events `gap` seconds apart, then the stream ends;
                         ?hold=KEY sends the events after the first only once GET /release?key=KEY
                         came (at most 30 s, then a last event "not released")
    GET  /redirect?to=URL  302 to URL
    GET  /bytes?n=N      N bytes of b"x" (?type=T: content-type T, default application/octet-stream)
    WS   /ws             echoes every message
    GET  /page           an HTML page titled "Example Domain" (what a browser test loads)
    GET  /simple/NAME/   a PEP 503 package index page linking the wheels of project NAME found in
                         `net.wheels` (WORKDIR/wheels, empty unless a test fills it), served at
    GET  /wheels/FILE    (pip install --index-url https://HOST/simple/ NAME)

A request whose Host is a name given to `net.serve_site(name, directory)` is served from that
directory instead (GET and HEAD; a directory answers with its index.html): a package index, any
static site a test builds from local files. A name given to `net.serve_git(name, directory)` is
served by `git http-backend` (CGI) from the repositories in that directory: git's smart HTTP
protocol (`git clone https://name/repo.git`; pushes are refused, as no request is authenticated).

DNS (UDP and TCP, `DNS_ADDR`:53) answers only the names the test sets with `net.set_names({...})`
(A/AAAA) and the records it sets with `net.set_records([...])` (zone-file lines, any type), and
records every query with its raw bytes; `net.dns_queries()` returns them in order. The origins
record every HTTP request and WebSocket handshake they see (`path` decoded, `target` as
received); `net.origin_requests()` returns them in order.

Running this file as a script (`python internet.py WORKDIR`) is the server side; the fixture
does that inside the namespace.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HOST_V4 = "198.51.100.1"  # the host namespace's end of the veth
HOST_V6 = "2001:db8::1"
ORIGIN_V4 = "198.51.100.10"
ORIGIN_V4_ALT = "198.51.100.11"
ORIGIN_V6 = "2001:db8::10"
DNS_ADDR = "198.51.100.53"
TLS_NAMES = ("example.com", "*.example.com", "example.test", "*.example.test")
READY_TIMEOUT = 15.0


@dataclass
class Internet:
    """A running internet namespace; see the module docstring for what it serves."""

    workdir: Path
    netns_name: str
    host_if: str
    ca_cert: Path  # the test CA the origins' certificate chains to (give it to the proxy as upstream_ca)
    ca_key: Path
    process: subprocess.Popen[bytes]

    def upstream_settings(self) -> dict[str, str]:
        """The settings that make a sandgate server's proxy resolve and trust this internet."""
        return {"SANDGATE_UPSTREAM_DNS": json.dumps([DNS_ADDR]), "SANDGATE_UPSTREAM_CA": str(self.ca_cert)}

    def set_names(self, names: dict[str, list[str]]) -> None:
        """Replace the DNS zone: name -> addresses (IPv4 answer A queries, IPv6 answer AAAA)."""
        zone = {name.lower().rstrip("."): addrs for name, addrs in names.items()}
        tmp = self.workdir / "names.json.tmp"
        tmp.write_text(json.dumps(zone))
        os.replace(tmp, self.workdir / "names.json")

    def set_records(self, lines: list[str]) -> None:
        """Replace the other records: zone-file lines (`name. TTL IN TYPE rdata`), any type."""
        tmp = self.workdir / "records.json.tmp"
        tmp.write_text(json.dumps(lines))
        os.replace(tmp, self.workdir / "records.json")

    def serve_site(self, name: str, directory: Path) -> None:
        """Serve `directory`'s files to requests for Host `name` (on every origin address and port)."""
        self._link("sites", name, directory)

    def serve_git(self, name: str, directory: Path) -> None:
        """Serve the git repositories in `directory` to Host `name` with `git http-backend`."""
        self._link("git", name, directory)

    def _link(self, kind: str, name: str, directory: Path) -> None:
        folder = self.workdir / kind
        folder.mkdir(exist_ok=True)
        link = folder / name.lower().rstrip(".")
        link.unlink(missing_ok=True)
        link.symlink_to(directory.resolve(), target_is_directory=True)

    def dns_queries(self) -> list[dict[str, str]]:
        """Every query the DNS server got so far: [{"name", "type": "A"|"AAAA"|..., "transport":
        "udp"|"tcp", "raw": the message as received, hex}]."""
        path = self.workdir / "queries.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def clear_dns_queries(self) -> None:
        (self.workdir / "queries.jsonl").unlink(missing_ok=True)

    @property
    def wheels(self) -> Path:
        """The directory the origins' package index serves (/simple/, /wheels/): put wheels here."""
        return self.workdir / "wheels"

    def origin_requests(self) -> list[dict[str, object]]:
        """Every request the origins got so far: [{"type": "http"|"websocket", "client": "ip:port",
        "server": "ip:port", "method", "path" (with query), "headers": {lower-case name: value}}]."""
        path = self.workdir / "requests.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]


def make_test_ca(
    workdir: Path, addresses: tuple[str, ...] = (ORIGIN_V4, ORIGIN_V4_ALT, ORIGIN_V6)
) -> tuple[Path, Path, Path, Path]:
    """A CA and a leaf for TLS_NAMES + `addresses` (the origins'); returns (ca_cert, ca_key,
    leaf_cert, leaf_key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from sandgate.proxy.contract.ca import new_ca

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    now = datetime.datetime.now(datetime.UTC)
    ca_key, ca = new_ca("sandgate test internet CA", validity=datetime.timedelta(days=30))
    ca_name = ca.subject
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in TLS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "origin.example.com")]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = (workdir / "ca.pem", workdir / "ca-key.pem", workdir / "leaf.pem", workdir / "leaf-key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(pem_key(ca_key))
    paths[2].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[3].write_bytes(pem_key(leaf_key))
    return paths


@contextlib.contextmanager
def start_internet(workdir: Path) -> Iterator[Internet]:
    """Build the namespace, start the servers, yield; always tear everything down."""
    from tests.support.netns import Netns, ip, unique

    workdir.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key, _leaf, _leaf_key = make_test_ca(workdir)
    (workdir / "names.json").write_text("{}")
    (workdir / "records.json").write_text("[]")
    ns = Netns("sgi")
    host_if = unique("tvi")
    process: subprocess.Popen[bytes] | None = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns.name)
        ip("addr", "add", f"{HOST_V4}/24", "dev", host_if)
        ip("addr", "add", f"{HOST_V6}/64", "dev", host_if, "nodad")
        ip("link", "set", host_if, "up")
        for addr in (ORIGIN_V4, ORIGIN_V4_ALT, DNS_ADDR):
            ip("addr", "add", f"{addr}/24", "dev", "eth0", netns=ns.name)
        ip("addr", "add", f"{ORIGIN_V6}/64", "dev", "eth0", "nodad", netns=ns.name)
        ip("link", "set", "eth0", "up", netns=ns.name)
        log = (workdir / "server.log").open("wb")
        process = ns.popen([sys.executable, __file__, str(workdir)], stdout=log, stderr=subprocess.STDOUT)
        _wait_ready(workdir, process)
        yield Internet(workdir, ns.name, host_if, ca_cert, ca_key, process)
    finally:
        if process is not None:
            stop(process)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        ns.delete()


def _wait_ready(workdir: Path, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not (workdir / "ready").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            log = (workdir / "server.log").read_text(errors="replace")
            raise RuntimeError(f"test internet did not start (exit {process.poll()}); log:\n{log}")
        time.sleep(0.02)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 5 s: a server process the tests started, by its own PID."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


try:  # the fixture, for conftests that import it
    import pytest

    @pytest.fixture
    def internet(tmp_path: Path) -> Iterator[Internet]:
        with start_internet(tmp_path / "internet") as net:
            yield net

except ImportError:  # the server side runs without pytest
    pass


# ---------------------------------------------------------------- server side (in the namespace)


def _serve(workdir: Path) -> None:
    import asyncio
    import socket
    import ssl

    import uvicorn
    from dnslib import AAAA, QTYPE, RR, A, DNSRecord
    from dnslib.server import DNSHandler, DNSServer
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import (
        FileResponse,
        HTMLResponse,
        JSONResponse,
        PlainTextResponse,
        RedirectResponse,
        Response,
        StreamingResponse,
    )
    from starlette.routing import Route, WebSocketRoute
    from starlette.staticfiles import StaticFiles
    from starlette.websockets import WebSocket, WebSocketDisconnect

    async def hello(request: Request) -> Response:
        return PlainTextResponse("hello from origin\n")

    async def echo(request: Request) -> Response:
        body = await request.body()
        reflected = {
            "method": request.method,
            "path": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            "headers": {k: v for k, v in request.headers.items()},
            "body": body.decode("utf-8", "replace"),
        }
        reflect = request.query_params.get("reflect")
        headers = {"x-reflected": request.headers[reflect]} if reflect and reflect in request.headers else {}
        chunk = int(request.query_params.get("chunk", "0"))
        gap = float(request.query_params.get("gap", "0.005"))
        if not chunk:
            return JSONResponse(reflected, headers=headers)
        data = json.dumps(reflected).encode()

        async def pieces() -> Iterator[bytes]:  # type: ignore[misc]
            for start in range(0, len(data), chunk):
                yield data[start : start + chunk]
                await asyncio.sleep(gap)

        return StreamingResponse(pieces(), media_type="application/json", headers=headers)  # type: ignore[arg-type]

    releases: dict[str, asyncio.Event] = {}

    async def sse(request: Request) -> Response:
        count = int(request.query_params.get("n", "3"))
        gap = float(request.query_params.get("gap", "0.3"))
        hold = request.query_params.get("hold")

        async def events() -> Iterator[bytes]:  # type: ignore[misc]
            for n in range(count):
                if n == 1 and hold:  # a client that got event 0 while the stream was open frees the rest
                    try:
                        await asyncio.wait_for(releases.setdefault(hold, asyncio.Event()).wait(), 30)
                    except TimeoutError:
                        yield b"data: not released\n\n"
                        return
                elif n:
                    await asyncio.sleep(gap)
                yield f"id: {n}\ndata: event {n} at {time.time():.3f}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")  # type: ignore[arg-type]

    async def release(request: Request) -> Response:
        releases.setdefault(request.query_params["key"], asyncio.Event()).set()
        return Response("released\n")

    async def redirect(request: Request) -> Response:
        return RedirectResponse(request.query_params["to"], status_code=302)

    async def many_bytes(request: Request) -> Response:
        media_type = request.query_params.get("type", "application/octet-stream")
        return Response(b"x" * int(request.query_params.get("n", "1024")), media_type=media_type)

    async def page(request: Request) -> Response:
        return HTMLResponse(
            "<!doctype html><html><head><title>Example Domain</title></head>"
            "<body><h1>Example Domain</h1><p>This page is served by the test internet.</p></body></html>"
        )

    def project(name: str) -> str:  # PEP 503 normalisation; a wheel's name uses _ for the runs
        return re.sub(r"[-_.]+", "-", name).lower()

    async def simple(request: Request) -> Response:
        wanted = project(request.path_params["name"])
        wheels = sorted((workdir / "wheels").glob("*.whl"))
        links = [
            f'<a href="/wheels/{w.name}">{w.name}</a>'
            for w in wheels
            if project(w.name.split("-")[0]) == wanted
        ]
        if not links:
            return PlainTextResponse(f"no project {wanted}\n", status_code=404)
        return HTMLResponse("<!doctype html><html><body>" + "<br>".join(links) + "</body></html>")

    async def wheel(request: Request) -> Response:
        name = request.path_params["file"]
        path = workdir / "wheels" / name
        if "/" in name or not path.is_file():
            return PlainTextResponse("not found\n", status_code=404)
        return FileResponse(path, media_type="application/octet-stream")

    async def ws_echo(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            pass

    def record_requests(inner: object) -> object:
        """ASGI middleware: one line in requests.jsonl per HTTP request or WebSocket handshake."""

        async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
            if scope["type"] in ("http", "websocket"):
                query = scope.get("query_string", b"").decode("latin-1")
                entry = {
                    "type": scope["type"],
                    "client": "{}:{}".format(*scope["client"]) if scope.get("client") else None,
                    "server": "{}:{}".format(*scope["server"]) if scope.get("server") else None,
                    "method": scope.get("method", "GET"),
                    "path": scope["path"] + (f"?{query}" if query else ""),
                    # the target as received, before any decoding: what a normalizing origin routes by
                    "target": scope.get("raw_path", b"").decode("latin-1") + (f"?{query}" if query else ""),
                    "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
                }
                with (workdir / "requests.jsonl").open("a") as fh:
                    fh.write(json.dumps(entry) + "\n")
            await inner(scope, receive, send)  # type: ignore[operator]

        return app

    async def git_http_backend(root: Path, request: Request) -> Response:
        """One CGI request to `git http-backend` for the repositories under `root`."""
        body = await request.body()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": str(root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": request.method,
            "PATH_INFO": request.url.path,
            "QUERY_STRING": request.url.query,
            "CONTENT_TYPE": request.headers.get("content-type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_ADDR": request.client.host if request.client else "",
            "HTTP_CONTENT_ENCODING": request.headers.get("content-encoding", ""),
            "GIT_PROTOCOL": request.headers.get("git-protocol", ""),
        }
        process = await asyncio.create_subprocess_exec(
            "git", "http-backend", stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(body), 60)
        except TimeoutError:
            process.kill()  # the backend this request started, by its own process
            await process.wait()
            raise
        # CGI: header lines, a blank line, the body (git ends lines with CRLF; take the first end)
        ends = [(output.find(sep), sep) for sep in (b"\r\n\r\n", b"\n\n") if sep in output]
        end, separator = min(ends, default=(len(output), b""))
        head, payload = output[:end], output[end + len(separator) :]
        headers = dict(line.split(": ", 1) for line in head.decode("latin-1").splitlines() if ": " in line)
        status = int(headers.pop("Status", "200").split()[0])
        return Response(payload, status_code=status, headers=headers)

    def served_sites(inner: object) -> object:
        """ASGI middleware: a request for a Host under workdir/sites/ is served from its files, one
        under workdir/git/ by `git http-backend`."""

        async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
            if scope["type"] == "http":
                host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
                name, _colon, port = host.rpartition(":")
                name = (name if port.isdigit() else host).lower().rstrip(".")
                if name and "/" not in name and (workdir / "sites" / name).is_dir():
                    files = StaticFiles(directory=workdir / "sites" / name, html=True)
                    await files(scope, receive, send)  # type: ignore[arg-type]
                    return
                if name and "/" not in name and (workdir / "git" / name).is_dir():
                    answer = await git_http_backend(workdir / "git" / name, Request(scope, receive))  # type: ignore[arg-type]
                    await answer(scope, receive, send)  # type: ignore[arg-type]
                    return
            await inner(scope, receive, send)  # type: ignore[operator]

        return app

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"]
    app = Starlette(
        routes=[
            Route("/", hello),
            Route("/echo", echo, methods=methods),
            Route("/echo/{rest:path}", echo, methods=methods),
            Route("/sse", sse),
            Route("/release", release),
            Route("/redirect", redirect),
            Route("/bytes", many_bytes),
            Route("/page", page),
            Route("/simple/{name}/", simple),
            Route("/wheels/{file}", wheel),
            WebSocketRoute("/ws", ws_echo),
        ]
    )

    class RecordingHandler(DNSHandler):
        """Writes every query as received (raw bytes included) before it is answered; a UDP
        answer over 512 bytes is truncated (TC), so the client asks again over TCP."""

        def get_reply(self, data: bytes) -> bytes:
            try:
                question = DNSRecord.parse(data).q
                name, qtype = str(question.qname).lower().rstrip("."), QTYPE[question.qtype]
            except Exception:
                name, qtype = "", "?"
            entry = {"name": name, "type": qtype, "transport": self.protocol, "raw": bytes(data).hex()}
            with (workdir / "queries.jsonl").open("a") as fh:
                fh.write(json.dumps(entry) + "\n")
            reply: bytes = super().get_reply(data)
            if self.protocol == "udp" and len(reply) > 512:  # as real servers do without EDNS
                reply = DNSRecord.parse(reply).truncate().pack()
            return reply

    class Zone:
        def resolve(self, request: DNSRecord, handler: object) -> DNSRecord:
            name = str(request.q.qname).lower().rstrip(".")
            qtype = QTYPE[request.q.qtype]
            zone = json.loads((workdir / "names.json").read_text())
            records = [
                rr
                for line in json.loads((workdir / "records.json").read_text())
                for rr in RR.fromZone(line)
                if str(rr.rname).lower().rstrip(".") == name
            ]
            reply = request.reply()
            if name not in zone and not records:
                reply.header.rcode = 3  # NXDOMAIN
                return reply
            for addr in zone.get(name, []):
                v6 = ":" in addr
                if qtype == "A" and not v6:
                    reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(addr), ttl=5))
                elif qtype == "AAAA" and v6:
                    reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(addr), ttl=5))
            for rr in records:
                if qtype in (QTYPE[rr.rtype], "ANY"):
                    reply.add_answer(rr)
            return reply

    def listener(host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(512)
        return sock

    async def main() -> None:
        common = {
            "log_level": "warning",
            "access_log": False,
            "lifespan": "off",
            "ws": "websockets",
            "timeout_keep_alive": 120,  # a connection a test holds is not closed by the origin
        }
        recorded = record_requests(served_sites(app))
        plain = uvicorn.Server(uvicorn.Config(recorded, **common))  # type: ignore[arg-type]
        tls = uvicorn.Server(
            uvicorn.Config(
                recorded,  # type: ignore[arg-type]
                ssl_certfile=str(workdir / "leaf.pem"),
                ssl_keyfile=str(workdir / "leaf-key.pem"),
                **common,  # type: ignore[arg-type]
            )
        )
        for server in (plain, tls):
            server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        dns = [
            DNSServer(Zone(), address=DNS_ADDR, port=53, tcp=tcp, handler=RecordingHandler)  # type: ignore[arg-type]
            for tcp in (False, True)
        ]
        for server in dns:
            server.start_thread()
        tasks = [
            asyncio.create_task(plain.serve(sockets=[listener("0.0.0.0", 80), listener("::", 80)])),
            asyncio.create_task(tls.serve(sockets=[listener("0.0.0.0", 443), listener("::", 443)])),
        ]
        while not (plain.started and tls.started):
            await asyncio.sleep(0.01)
        (workdir / "ready").write_text(str(os.getpid()))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        plain.should_exit = tls.should_exit = True
        await asyncio.gather(*tasks)
        for server in dns:
            server.stop()

    del ssl
    asyncio.run(main())


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))

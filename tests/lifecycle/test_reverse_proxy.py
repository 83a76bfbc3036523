"""The reverse proxy into sandboxes is a faithful HTTP intermediary (RFC 9110 7.6), read on the raw
wire: a real `sandgate serve`, a real sandbox running execd and a small app of its own on port
8000 (it answers with what it received, plus fields of its choosing), and a raw socket client
parsed by h11, so nothing between the test and the bytes normalises anything.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from tests.execd.test_pty import next_json
from tests.support.server import SandgateServer, sandgate_server
from tests.support.wire import Head, RawExchange

pytestmark = pytest.mark.root

# The sandbox's own app: echoes the fields and body it got as JSON; answers with repeated,
# hop-by-hop and end-to-end fields (http.server adds Server and Date of its own).
APP = r"""
import http.server, json, time
STATE = {"stream": "not started"}
class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.path == "/stream":
            return self.stream()
        length = int(self.headers.get("content-length") or 0)
        seen = {"fields": self.headers.items(), "body": self.rfile.read(length).decode(), "path": self.path,
                "peer": self.client_address[1], "state": STATE}
        body = json.dumps(seen).encode()
        self.send_response(200)
        for name, value in (("Content-Type", "application/json"), ("Set-Cookie", "a=1; Path=/"),
                            ("Set-Cookie", "b=2; Path=/"), ("Connection", "X-App-Hop"),
                            ("X-App-Hop", "named by Connection"), ("Keep-Alive", "timeout=5"),
                            ("Proxy-Thing", "hop"), ("X-End-To-End", "kept"),
                            ("Content-Length", str(len(body)))):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def stream(self):  # a line every 50 ms until the reader goes away (at most 30 s)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        STATE["stream"] = "streaming"
        try:
            for _ in range(600):
                self.wfile.write(b"data: tick\n\n")
                self.wfile.flush()
                time.sleep(0.05)
            STATE["stream"] = "ran to the end"
        except OSError:
            STATE["stream"] = "reader left"
        self.close_connection = True
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Echo).serve_forever()
"""
# Answers as HTTP/1.1 without `Connection: close`, then closes the connection anyway (as servers
# with short keep-alive timeouts do to an idle client).
CLOSING_APP = r"""
import http.server
class Once(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"once")
        self.close_connection = True
    do_POST = do_GET
http.server.ThreadingHTTPServer(("0.0.0.0", 8001), Once).serve_forever()
"""
TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandgateServer]:
    with sandgate_server(Path(tmp_path_factory.mktemp("sandgate"))) as running:
        yield running


@pytest.fixture(scope="module")
def sandbox(server: SandgateServer) -> dict[str, Any]:
    """The sandbox, its app ready on 8000, and its execd endpoint as clients get it."""
    created = server.create_sandbox(entrypoint=["python3", "-I", "-c", APP])
    base = f"/v1/sandboxes/{created['id']}/proxy/8000/"
    deadline = time.monotonic() + 30
    with server.client() as client:
        while client.get(base).status_code != 200:
            assert time.monotonic() < deadline, "the sandbox's app never answered on 8000"
            time.sleep(0.1)
        endpoint = client.get(f"/v1/sandboxes/{created['id']}/endpoints/44772").json()
    return {"id": created["id"], "app": base, "endpoint": endpoint}


def exchange(
    server: SandgateServer, method: str, target: str, fields: list[tuple[str, str]], body: bytes | None = None
) -> tuple[Head, bytes]:
    with RawExchange("127.0.0.1", server.port) as wire:
        wire.send(method, target, [("host", server.domain), *fields], body)
        head = wire.head()
        return head, wire.body()


def key(server: SandgateServer) -> list[tuple[str, str]]:
    return [("OPEN-SANDBOX-API-KEY", server.api_key)]


def test_execd_empty_200_keeps_its_content_length(server: SandgateServer, sandbox: dict[str, Any]) -> None:
    """The JS SDK's `Unexpected end of JSON input`: execd's `200 content-length: 0` arrived chunked."""
    target = f"/v1/sandboxes/{sandbox['id']}/proxy/44772/directories"
    body = json.dumps({"/tmp/made-through-the-proxy": {"mode": 755}}).encode()
    head, answer = exchange(
        server, "POST", target, [*key(server), ("content-type", "application/json")], body
    )
    assert (head.status, head.framing, head.one("content-length"), answer) == (
        200,
        "content-length",
        "0",
        b"",
    )


def test_response_fields_repeats_and_length_arrive_as_the_sandbox_sent_them(
    server: SandgateServer, sandbox: dict[str, Any]
) -> None:
    head, body = exchange(server, "GET", sandbox["app"], key(server))
    assert head.status == 200
    assert head.all("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]  # two fields, in order
    assert head.one("x-end-to-end") == "kept"
    assert head.framing == "content-length" and int(head.one("content-length")) == len(body)
    assert head.one("server").startswith("BaseHTTP")  # the app's, once: no uvicorn added
    assert head.one("date")  # the app's, once
    for hop in ("x-app-hop", "keep-alive", "proxy-thing"):
        assert head.all(hop) == [], hop
    assert head.all("connection") in ([], ["keep-alive"])  # the proxy's own hop, if any


def test_request_fields_lose_only_hops_and_control_plane_credentials(
    server: SandgateServer, sandbox: dict[str, Any]
) -> None:
    egress = httpx.get(
        f"{server.base_url}/v1/sandboxes/{sandbox['id']}/endpoints/18080",
        headers=dict(key(server)),
        trust_env=False,
    ).json()["headers"]
    fields = [
        *key(server),
        *egress.items(),
        (TOKEN_HEADER, "a client's guess"),
        ("x-twice", "1"),
        ("x-twice", "2"),
        ("connection", "x-client-hop"),
        ("x-client-hop", "named by Connection"),
        ("keep-alive", "timeout=5"),
        ("proxy-authorization", "Basic cHJveHk6cHJveHk="),
        ("te", "trailers"),
        ("authorization", "Bearer for-the-app"),
        ("x-carries", f"k={server.api_key}"),
        ("cookie", "c=1"),
    ]
    head, body = exchange(server, "GET", f"{sandbox['app']}echo/a%2Fb;c?q=%20x&r", fields)
    assert head.status == 200
    seen = json.loads(body)
    assert seen["path"] == "/echo/a%2Fb;c?q=%20x&r"  # as the client wrote it, not decoded
    got = [(name.lower(), value) for name, value in seen["fields"]]
    names = [name for name, _ in got]
    assert [v for n, v in got if n == "x-twice"] == ["1", "2"]
    assert ("authorization", "Bearer for-the-app") in got  # meant for the app: kept
    assert ("cookie", "c=1") in got and ("via", "1.1 sandgate") in got
    for gone in ("open-sandbox-api-key", "opensandbox-egress-auth", TOKEN_HEADER.lower(), "x-carries",
                 "x-client-hop", "keep-alive", "proxy-authorization", "te", "connection",
                 "content-length", "transfer-encoding", "user-agent", "accept-encoding"):  # fmt: skip
        assert gone not in names, (gone, got)
    assert not [value for _, value in got if server.api_key in value]
    assert seen["body"] == ""

    # an Authorization that holds the API key is the API's, not the app's
    fields = [("authorization", f"Bearer {server.api_key}"), *key(server)]
    _, body = exchange(server, "POST", sandbox["app"], fields, b"posted")
    seen = json.loads(body)
    assert seen["body"] == "posted" and "authorization" not in [n.lower() for n, _ in seen["fields"]]
    assert [v for n, v in seen["fields"] if n.lower() == "content-length"] == ["6"]


def test_upstream_connections_are_kept_alive_and_closed_when_the_client_leaves(
    server: SandgateServer, sandbox: dict[str, Any]
) -> None:
    peers = {json.loads(exchange(server, "GET", sandbox["app"], key(server))[1])["peer"] for _ in range(5)}
    assert len(peers) == 1  # five requests, one upstream connection

    with RawExchange("127.0.0.1", server.port) as wire:
        wire.send("GET", f"{sandbox['app'][:-1]}/stream", [("host", server.domain), *key(server)])
        assert wire.head().status == 200 and b"tick" in (wire.next_data() or b"")
    deadline = time.monotonic() + 15
    state = "streaming"
    while state == "streaming" and time.monotonic() < deadline:  # the app notices at its next write
        time.sleep(0.1)
        state = json.loads(exchange(server, "GET", sandbox["app"], key(server))[1])["state"]["stream"]
    assert state == "reader left"
    # a client that leaves is an ordinary end, not a server error (the relay was cancelled and
    # then asked for its result: InvalidStateError, logged with two tracebacks)
    assert "Exception in ASGI application" not in server.log() and "unexpected error" not in server.log()


def test_a_connection_the_sandbox_closed_is_not_reused(
    server: SandgateServer, sandbox: dict[str, Any]
) -> None:
    server.run(sandbox["id"], f"python3 -I -c '{CLOSING_APP}' >/dev/null 2>&1 &", background=True)
    target = f"/v1/sandboxes/{sandbox['id']}/proxy/8001/"
    deadline = time.monotonic() + 30
    while exchange(server, "GET", target, key(server))[0].status != 200:
        assert time.monotonic() < deadline, "the closing app never answered on 8001"
        time.sleep(0.1)
    for method, body in (("GET", None), ("POST", b"x"), ("GET", None), ("POST", b"y")):
        head, answer = exchange(server, method, target, key(server), body)
        assert (head.status, answer) == (200, b"once"), (method, head, answer)


def test_range_and_streaming_through_execd(server: SandgateServer, sandbox: dict[str, Any]) -> None:
    execd = f"/v1/sandboxes/{sandbox['id']}/proxy/44772"
    server.run(sandbox["id"], "printf 0123456789 > /tmp/ten.txt; rm -f /tmp/go")
    head, body = exchange(server, "GET", f"{execd}/files/download?path=/tmp/ten.txt",
                          [*key(server), ("range", "bytes=2-5")])  # fmt: skip
    assert (head.status, head.one("content-range"), head.one("content-length"), body) == (
        206, "bytes 2-5/10", "4", b"2345"
    )  # fmt: skip

    # SSE: the first event arrives while the command still waits for /tmp/go, which only the
    # test creates after reading it; so it was streamed, not buffered to the end.
    command = json.dumps({"command": "echo first; until [ -e /tmp/go ]; do sleep 0.02; done; echo second"})
    fields = [("host", server.domain), *key(server), ("content-type", "application/json")]
    with RawExchange("127.0.0.1", server.port) as wire:
        wire.send("POST", f"{execd}/command", fields, command.encode())
        head = wire.head()
        assert head.framing == "chunked" and head.one("content-type").startswith("text/event-stream")
        seen = b""
        while b'"first"' not in seen:
            part = wire.next_data()
            assert part is not None, seen
            seen += part
        assert b"second" not in seen
        server.run(sandbox["id"], "touch /tmp/go")
        rest = wire.body()
    assert b'"second"' in rest and b"execution_complete" in rest


def test_websocket_close_code_of_the_sandbox_reaches_the_client(
    server: SandgateServer, sandbox: dict[str, Any]
) -> None:
    """A PTY taken over by a second client closes the first with execd's 4001, through the proxy,
    reached with the execd endpoint's own header (as the SDKs do in direct mode)."""
    endpoint = sandbox["endpoint"]
    with server.client() as client:
        created = client.post(f"/v1/sandboxes/{sandbox['id']}/proxy/44772/pty", json={"cwd": "/tmp"})
    session = created.json()["session_id"]
    url = f"ws://{endpoint['endpoint']}/pty/{session}/ws"
    with connect(url, additional_headers=endpoint["headers"]) as first:
        assert next_json(first)["type"] == "connected"
        with connect(f"{url}?takeover=1", additional_headers=endpoint["headers"]) as second:
            assert next_json(second)["type"] == "connected"
            with pytest.raises(ConnectionClosed) as evicted:
                while True:
                    first.recv(timeout=15)
            assert evicted.value.rcvd is not None and evicted.value.rcvd.code == 4001
    with pytest.raises(InvalidStatus) as refused:  # a wrong token: the handshake is refused
        connect(url, additional_headers={TOKEN_HEADER: "guess"})
    assert refused.value.response.status_code == 403

"""Every route of the OpenSandbox 1.1.1 APIs is answered as the spec says, against a real
`sandgate serve` and a real sandbox's execd and egress endpoints (found as a client finds them).

A route is answered when its reply is not the server's own "no such route" (learned by asking
each API for a path nobody serves) and not 405: a served route, a resource 404 (a missing
sandbox, session or context, which names what is missing), or, for what sandgate does not offer
(`supported=False`), the spec's "not available" status (501, or execd's 503 for isolated
sessions) with `{code, message}` naming what sandgate does instead. The table itself is checked
against the routes the installed Python and JS SDKs call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.conformance import spec_routes
from tests.conformance.spec_routes import Route
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
MISSING_SANDBOX = "no-such-sandbox"
NO_ROUTE = "/sgt-no-such-route"
UNAVAILABLE = {501, 503}
READ_LIMIT = 64 * 1024


@dataclass(frozen=True)
class Reply:
    status: int
    reason: str  # the status line's reason phrase (clients print it: "404 Not Found")
    content_type: str
    body: str

    def json(self) -> object:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class Api:
    """One API at a base URL: how its replies look, and how its route-miss looks."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.client = httpx.Client(base_url=base, headers=headers, timeout=30, trust_env=False)
        self.no_route = self.signature(self.call("GET", NO_ROUTE), "GET", NO_ROUTE)
        assert self.no_route[0] == 404, f"{base}{NO_ROUTE} answered {self.no_route}"

    def call(self, method: str, path: str) -> Reply:
        body = b"{}" if method in ("POST", "PUT", "PATCH") else None
        headers = {"content-type": "application/json"} if body else {}
        with self.client.stream(method, path, content=body, headers=headers) as response:
            data = b""
            if response.status_code >= 400:  # a success may stream forever (GET /metrics/watch)
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) >= READ_LIMIT:
                        break
        text = data.decode(errors="replace")
        content_type = response.headers.get("content-type", "")
        return Reply(response.status_code, response.reason_phrase, content_type, text)

    @staticmethod
    def signature(reply: Reply, method: str, path: str) -> tuple[int, str]:
        """The reply with the request's own method and path taken out of its text."""
        return reply.status, reply.body.replace(path, "<path>").replace(method, "<method>")

    def is_route_miss(self, reply: Reply, method: str, path: str) -> bool:
        return reply.status == 405 or self.signature(reply, method, path) == self.no_route


def concrete(route: Route, sandbox_id: str) -> str:
    values = {"sandbox_id": sandbox_id, "port": "44772", "full_path": "ping", "uid": "65534", "gid": "65534"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), f"no-such-{m.group(1)}"), route.path)


def judge(api: Api, route: Route, path: str, reply: Reply) -> str | None:
    """What is wrong with this reply to this route, or None."""
    where = f"{route.method} {path} -> {reply.status} {reply.body[:200]!r}"
    if not reply.reason:
        return f"no reason phrase on the status line: {where}"
    if api.is_route_miss(reply, route.method, path):
        return f"not routed: {where}"
    error = reply.json() if reply.status >= 400 and route.api != "egress" else {"code": "", "message": ""}
    if not (isinstance(error, dict) and set(error) == {"code", "message"}):
        return f"error is not {{code, message}}: {where}"
    if not route.supported:
        if reply.status not in UNAVAILABLE or "sandgate" not in str(error["message"]):
            return f"unsupported route must answer 501/503 naming what sandgate does instead: {where}"
    elif reply.status >= 500:
        return f"server error: {where}"
    return None


@pytest.fixture(scope="module")
def sandbox_id(server: SandgateServer) -> Iterator[str]:
    sandbox_id = server.create_sandbox()["id"]
    yield sandbox_id
    with server.client() as client:
        client.delete(f"/v1/sandboxes/{sandbox_id}")


def endpoint_api(server: SandgateServer, sandbox_id: str, port: int) -> Api:
    """The API behind a sandbox's port, reached as the clients reach it (direct mode)."""
    with server.client() as client:
        endpoint = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/{port}").json()
    return Api(f"http://{endpoint['endpoint']}", endpoint.get("headers") or {})


Asked = list[tuple[Route, str, Reply]]


def ask(api: Api, routes: list[Route], sandbox_id: str, prefix: str = "") -> Asked:
    asked = []
    for route in routes:
        path = prefix + concrete(route, sandbox_id)
        asked.append((route, path, api.call(route.method, path)))
    return asked


def problems_of(api: Api, asked: Asked) -> list[str]:
    return [problem for route, path, reply in asked if (problem := judge(api, route, path, reply))]


def test_the_table_lists_every_route_the_sdks_call() -> None:
    table = {("lifecycle" if r.api == "server" else r.api, r.method, r.shape) for r in spec_routes.ALL}
    assert spec_routes.JS_SDK.is_dir(), "the JS SDK is not installed in tests/js (run `make bootstrap`)"
    for name, called in (("Python", spec_routes.python_sdk_routes()), ("JS", spec_routes.js_sdk_routes())):
        assert len(called) > 40, (
            f"read only {len(called)} routes from the {name} SDK: has its layout changed?"
        )
        assert called <= table, f"the {name} SDK calls routes the table lacks: {sorted(called - table)}"


@pytest.mark.parametrize("prefix", ["/v1", ""])
def test_lifecycle_routes_for_a_missing_sandbox(server: SandgateServer, prefix: str) -> None:
    """With a sandbox id that does not exist, every served sandbox route refuses: a 404 that
    names the id, or a validation error found before the lookup."""
    api = Api(server.base_url, {"OPEN-SANDBOX-API-KEY": server.api_key})
    asked = ask(api, spec_routes.LIFECYCLE, MISSING_SANDBOX, prefix)
    problems = problems_of(api, asked)
    for route, path, reply in asked:
        unnamed = reply.status == 404 and MISSING_SANDBOX not in reply.body
        if route.supported and "{sandbox_id}" in route.path and (reply.status < 400 or unnamed):
            problems.append(f"missing sandbox: {route.method} {path} -> {reply.status} {reply.body[:200]!r}")
    assert not problems, "\n".join(problems)


def test_lifecycle_and_server_reads_of_a_live_sandbox(server: SandgateServer, sandbox_id: str) -> None:
    """Reads only (GET): pausing or deleting the sandbox is the flows' business. A served read
    of a live sandbox succeeds."""
    api = Api(server.base_url, {"OPEN-SANDBOX-API-KEY": server.api_key})
    reads = [r for r in spec_routes.LIFECYCLE if r.method == "GET"]
    asked = ask(api, reads, sandbox_id, "/v1") + ask(api, reads + spec_routes.SERVER, sandbox_id)
    problems = problems_of(api, asked)
    for route, path, reply in asked:
        proxy_root = route.path.endswith("/proxy/{port}")  # execd serves no `/`: its own 404
        if route.supported and "{sandbox_id}" in route.path and not proxy_root and reply.status != 200:
            problems.append(f"live sandbox: GET {path} -> {reply.status} {reply.body[:200]!r}")
    assert not problems, "\n".join(problems)


def test_egress_routes(server: SandgateServer, sandbox_id: str) -> None:
    api = endpoint_api(server, sandbox_id, 18080)
    problems = problems_of(api, ask(api, spec_routes.EGRESS, sandbox_id))
    assert not problems, "\n".join(problems)


def test_execd_routes_through_the_host(server: SandgateServer, sandbox_id: str) -> None:
    """The default 44772 endpoint: the host's reverse proxy, opened by the execd token."""
    api = endpoint_api(server, sandbox_id, 44772)
    problems = problems_of(api, ask(api, spec_routes.EXECD, sandbox_id))
    assert not problems, "\n".join(problems)


def test_execd_routes_of_execd_itself(direct_execd_server: SandgateServer) -> None:
    """`execd_endpoint = "direct"`: the endpoint is the sandbox's execd, nothing in between."""
    sandbox_id = direct_execd_server.create_sandbox()["id"]
    api = endpoint_api(direct_execd_server, sandbox_id, 44772)
    assert direct_execd_server.sandbox_address(sandbox_id) in str(api.client.base_url)
    problems = problems_of(api, ask(api, spec_routes.EXECD, sandbox_id))
    assert not problems, "\n".join(problems)


def test_a_route_miss_is_told_apart_from_a_missing_sandbox(server: SandgateServer) -> None:
    """The judge itself: a path no spec lists is a route miss, a missing sandbox is not."""
    api = Api(server.base_url, {"OPEN-SANDBOX-API-KEY": server.api_key})
    invented = Route("lifecycle", "GET", "/sandboxes/{sandbox_id}/no-such-part")
    known = Route("lifecycle", "GET", "/sandboxes/{sandbox_id}")
    (_, invented_path, invented_reply), (_, known_path, known_reply) = ask(
        api, [invented, known], MISSING_SANDBOX
    )
    assert invented_reply.status == known_reply.status == 404
    assert judge(api, invented, invented_path, invented_reply) is not None
    assert judge(api, known, known_path, known_reply) is None

"""Java inside a `sandgate/host` sandbox trusts the proxy's CA: a Java HttpClient GET to an
allowed HTTPS origin whose TLS the proxy intercepts reaches the origin (its log proves it), from
`java Main.java` and from a Java code context (JJava's kernel, through execd's endpoint).

The JDK is the host's (Debian's openjdk-17, bound read-only with /usr): its `cacerts` and
`java.security` are links into /etc, which the runtime provides (docs/runtime.md).
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator

import httpx
import pytest

from tests.conformance.conftest import API_HOST, sandbox_meeting_the_proxy_ca
from tests.support.internet import Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root

MAIN_JAVA = """
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Main {
    public static void main(String[] args) throws Exception {
        HttpResponse<String> answer = HttpClient.newHttpClient().send(
            HttpRequest.newBuilder(URI.create(args[0])).build(), HttpResponse.BodyHandlers.ofString());
        System.out.println(answer.statusCode() + " " + answer.body());
    }
}
"""


@pytest.fixture(scope="module")
def sandbox_id(server: SandgateServer) -> Iterator[str]:
    with sandbox_meeting_the_proxy_ca(server) as created:
        yield created


@pytest.mark.skipif(shutil.which("java") is None, reason="no JDK on this host (bootstrap installs one)")
def test_a_java_http_client_trusts_the_proxy_ca(
    server: SandgateServer, internet: Internet, sandbox_id: str
) -> None:
    path = f"/echo?java-trust={secrets.token_hex(4)}"
    source = f"cat > /tmp/Main.java <<'EOF'\n{MAIN_JAVA}\nEOF"
    assert server.run(sandbox_id, source).exit_code == 0
    done = server.run(sandbox_id, f"cd /tmp && java Main.java https://{API_HOST}{path}", timeout=120)
    assert done.exit_code == 0 and done.stdout.startswith("200 {"), done
    seen = [r for r in internet.origin_requests() if r["path"] == path]
    assert len(seen) == 1 and seen[0]["headers"]["user-agent"].startswith("Java-http-client/")


@pytest.mark.skipif(shutil.which("java") is None, reason="no JDK on this host (bootstrap installs one)")
def test_a_java_code_context_reaches_the_origin_through_the_proxy(
    server: SandgateServer, internet: Internet, sandbox_id: str
) -> None:
    path = f"/echo?java-context={secrets.token_hex(4)}"
    with server.client() as api:
        found = api.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772").json()
    with httpx.Client(
        base_url=f"http://{found['endpoint']}", headers=found["headers"], timeout=180, trust_env=False
    ) as execd:
        created = execd.post("/code/context", json={"language": "java"})
        assert created.status_code == 200, created.text
        code = (
            "var answer = java.net.http.HttpClient.newHttpClient().send(java.net.http.HttpRequest"
            f'.newBuilder(java.net.URI.create("https://{API_HOST}{path}")).build(), '
            "java.net.http.HttpResponse.BodyHandlers.ofString());\nanswer.statusCode()"
        )
        body = {"context": {"id": created.json()["id"], "language": "java"}, "code": code}
        with execd.stream("POST", "/code", json=body) as response:
            events = [json.loads(line) for line in response.iter_lines() if line.strip()]
    results = [e["results"]["text"] for e in events if e["type"] == "result"]
    assert results == ["200"], events
    assert [r["path"] for r in internet.origin_requests() if r["path"] == path] == [path]

"""The examples under examples/ run as written against a real server and the test internet, and
the opensandbox/code-interpreter image behaves as OpenSandbox's code-interpreter SDK expects.

The image comes from sandbox-images/build.py (`make images`): its cached `docker save` archive
when there is one for the current inputs, else built once in the session's private dockerd; it
is imported into the server's local image store under the tag the guide uses. The examples run
as subprocesses with only the SDK's connection variables set (server.env()).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandgate.lifecycle.images import ImageStore
from tests.conformance.conftest import API_HOST, PATCHED_HOST, sandbox_meeting_the_proxy_ca
from tests.support.audit import audit_records
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SandgateServer

# the first test to need the image may build it (several minutes on a loaded 2-core machine)
pytestmark = [pytest.mark.root, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]
LLM_HOST = "llm.example.com"
LLM_KEY = "llm-key-3c9e51"
# the browser example: an index serving Playwright, the one site it may browse, one it may not
INDEX_HOST, SITE_HOST, BLOCKED_HOST = "pypi.example.test", "www.example.test", "blocked.example.test"
# Playwright's wheels for the host's python3, which bootstrap downloads (scripts/bootstrap.sh)
BROWSER_WHEELS = Path(
    os.environ.get("SANDGATE_BROWSER_WHEELS", Path.home() / ".cache" / "sandgate" / "browser-wheels")
)


def run_example(server: SandgateServer, *argv: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**server.env(), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run_the_guides_example(server: SandgateServer) -> None:
    """examples/code-interpreter/guide.py against `server`, and what the guide says it prints."""
    lines = run_example(server, "examples/code-interpreter/guide.py").splitlines()
    assert lines[0] == "Hello OpenSandbox!"
    assert lines[1] == "Content: Hello World"
    assert lines[2] == "4"
    assert lines[3].startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")  # the image's Python


def test_the_guides_code_interpreter_example_runs_verbatim(
    server: SandgateServer, code_interpreter: str
) -> None:
    run_the_guides_example(server)


@contextlib.contextmanager
def names_added(internet: Internet, *hosts: str) -> Iterator[None]:
    """`hosts` resolve to the origin besides the package's own names, until the block ends."""
    kept = {API_HOST: [ORIGIN_V4], PATCHED_HOST: [ORIGIN_V4]}
    internet.set_names({**kept, **{host: [ORIGIN_V4] for host in hosts}})
    try:
        yield
    finally:
        internet.set_names(kept)


@pytest.fixture
def llm_name(internet: Internet) -> Iterator[None]:
    with names_added(internet, LLM_HOST):
        yield


def test_the_llm_agent_example_calls_with_a_key_it_never_sees(
    server: SandgateServer, internet: Internet, llm_name: None
) -> None:
    server.vault_put("llm-api-key", LLM_KEY)
    # the test origin's /echo stands in for the completion endpoint: the example's policy with
    # the path it allows is what the sandbox gets, so the example's own URL would be denied here
    policy = (
        (ROOT / "examples/llm-agent/policy.yaml")
        .read_text()
        .replace("/v1/chat/completions", "/echo/v1/chat/completions")
    )
    policy_file = server.state_dir.parent / "llm-policy.yaml"
    policy_file.write_text(policy)
    agent = (ROOT / "examples/llm-agent/agent.py").read_text()
    agent_file = policy_file.with_name("agent.py")
    agent_file.write_text(agent.replace('with_name("policy.yaml")', f"with_name({policy_file.name!r})"))
    output = run_example(server, str(agent_file), LLM_API_URL=f"https://{LLM_HOST}/echo/v1/chat/completions")
    assert "status 200" in output and LLM_KEY not in output
    assert "key-like variables in my environment: []" in output
    # the origin's side: the request carried the key, which the agent never sent
    seen = [r for r in internet.origin_requests() if r["path"] == "/echo/v1/chat/completions"]
    assert seen and seen[-1]["headers"]["authorization"] == f"Bearer {LLM_KEY}"


@pytest.fixture
def browser_names(internet: Internet) -> Iterator[None]:
    internet.wheels.symlink_to(BROWSER_WHEELS, target_is_directory=True)
    try:
        with names_added(internet, INDEX_HOST, SITE_HOST, BLOCKED_HOST):
            yield
    finally:
        internet.wheels.unlink()


def test_the_browser_example_browses_one_site_and_is_refused_another(
    server: SandgateServer, internet: Internet, browser_names: None, tmp_path: Path
) -> None:
    assert list(BROWSER_WHEELS.glob("playwright-*.whl")), (
        f"no Playwright wheel in {BROWSER_WHEELS}: run bootstrap"
    )
    screenshot = tmp_path / "page.png"
    output = run_example(
        server,
        "examples/browser/browse.py",
        PIP_INDEX_URL=f"https://{INDEX_HOST}/simple/",
        SITE_URL=f"https://{SITE_HOST}/page",
        BLOCKED_URL=f"https://{BLOCKED_HOST}/page",
        SCREENSHOT=str(screenshot),
    )
    assert "title: Example Domain" in output.splitlines(), output
    assert "refused: Page.goto: net::ERR_NAME_NOT_RESOLVED" in output, output
    assert screenshot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and screenshot.stat().st_size > 2000
    # the origins' side: Playwright came from the index, the page was fetched, the denied host
    # never got a request, nor was its name asked of the internet's DNS (the allowed one was)
    seen = [(r["headers"].get("host"), r["path"]) for r in internet.origin_requests()]  # type: ignore[union-attr]
    assert (INDEX_HOST, "/simple/playwright/") in seen
    assert (SITE_HOST, "/page") in seen
    assert not [hit for hit in seen if hit[0] == BLOCKED_HOST], seen
    asked = {query["name"] for query in internet.dns_queries()}
    assert SITE_HOST in asked and BLOCKED_HOST not in asked, asked
    # TLS was terminated by the proxy (the policy inspects), so Chromium trusted the proxy's CA:
    # the proxy could read the path, which a pass-through connection never shows it
    records = audit_records(server.state_dir)
    inspected = [r["path"] for r in records if r["kind"] == "request" and r["host"] == SITE_HOST]
    assert "/page" in inspected, inspected


# -- the image on the wire, through the host's execd endpoint -----------------------------------


def events(client: httpx.Client, context_id: str, code: str, **extra: Any) -> list[dict[str, Any]]:
    body = {"context": {"id": context_id, "language": "python"}, "code": code, **extra}
    with client.stream("POST", "/code", json=body) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines() if line.strip() and '"ping"' not in line]


@pytest.fixture(scope="module")
def sandbox_id(server: SandgateServer, code_interpreter: str) -> Iterator[str]:
    """A code-interpreter sandbox (its entrypoint running) whose policy allows api.example.com
    with TLS intercepted, so its HTTP clients meet the proxy's CA."""
    image = {"uri": code_interpreter}
    entrypoint = ["/opt/code-interpreter/code-interpreter.sh"]
    with sandbox_meeting_the_proxy_ca(server, image=image, entrypoint=entrypoint) as created:
        yield created


@pytest.fixture(scope="module")
def execd(server: SandgateServer, sandbox_id: str) -> Iterator[httpx.Client]:
    with server.client() as api:
        found = api.get(f"/v1/sandboxes/{sandbox_id}/endpoints/44772").json()
    with httpx.Client(
        base_url=f"http://{found['endpoint']}", headers=found["headers"], timeout=120, trust_env=False
    ) as client:
        yield client


# one HTTPS GET per HTTP stack of the image, each printing the origin's body
TRUST_CHECKS = {
    "curl": f"curl -sS https://{API_HOST}/",
    "requests": f"python3 -c \"import requests; print(requests.get('https://{API_HOST}/').text)\"",
    "urllib": f"python3 -c \"import urllib.request as u; print(u.urlopen('https://{API_HOST}/').read().decode())\"",
    "certifi": 'python3 -c "import certifi, ssl, urllib.request as u; '
    f"c = ssl.create_default_context(cafile=certifi.where()); "
    f"print(u.urlopen('https://{API_HOST}/', context=c).read().decode())\"",
    "deno fetch": f"deno eval \"console.log(await (await fetch('https://{API_HOST}/')).text())\"",
}


def test_every_http_stack_in_the_image_trusts_the_proxy_ca(
    server: SandgateServer, internet: Internet, sandbox_id: str
) -> None:
    for name, command in TRUST_CHECKS.items():
        done = server.run(sandbox_id, command, timeout=120)
        assert (done.exit_code, done.stdout.strip()) == (0, "hello from origin"), (name, done)
    # pip: the origin has no index, but its request reaches the origin only once TLS is verified
    pip = server.run(sandbox_id, f"pip download --no-deps -d /tmp/p --index-url https://{API_HOST}/simple/ x")
    assert "No matching distribution found for x" in pip.stderr, pip
    assert "/simple/x/" in [r["path"] for r in internet.origin_requests()]


def test_plots_and_frames_keep_their_mime_types_on_the_wire(execd: httpx.Client) -> None:
    context_id = execd.post("/code/context", json={"language": "python"}).json()["id"]
    plot = events(
        execd,
        context_id,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.show()",
    )
    images = [e["results"] for e in plot if e["type"] == "result" and "image/png" in e["results"]]
    assert images and images[0]["image/png"].startswith("iVBORw0KGgo")  # base64 of a PNG header
    frame = events(execd, context_id, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    [shown] = [e["results"] for e in frame if e["type"] == "result"]
    assert "<table" in shown["text/html"] and "a  b" in shown["text"]
    version = events(execd, context_id, "import numpy, sys\nnumpy.arange(3).sum(), sys.prefix")
    assert [e["results"]["text"] for e in version if e["type"] == "result"] == ["(np.int64(3), '/usr/local')"]


def test_a_crashed_kernel_ends_its_context_and_a_new_one_works(execd: httpx.Client) -> None:
    context_id = execd.post("/code/context", json={"language": "python"}).json()["id"]
    timed = events(execd, context_id, "import time\nkept = 1\ntime.sleep(30)", timeout=500)
    assert (
        timed[-1]["error"]["ename"] == "ExecutionTimeout"
        and "keeps its state" in timed[-1]["error"]["evalue"]
    )
    crashed = events(execd, context_id, "import os\nos.kill(os.getpid(), 9)")
    assert crashed[-1]["error"]["ename"] == "ContextEnded" and "exited" in crashed[-1]["error"]["evalue"]
    assert execd.post("/code", json={"context": {"id": context_id}, "code": "kept"}).status_code == 410
    fresh = execd.post("/code/context", json={"language": "bash"}).json()["id"]
    shell = events(
        execd, fresh, "echo $((6 * 7)) && python3 -c 'import pandas' && echo ok", context={"id": fresh}
    )
    assert "".join(e.get("text", "") for e in shell if e["type"] == "stdout") == "42\nok\n"


def test_java_and_go_cells_run_in_the_image(execd: httpx.Client) -> None:
    """The image's JJava (on its jlink'ed JDK) and GoNB (on its Go, with the warm build cache):
    state kept per context, stdout, a result, a compile error as the cell's error."""

    def stdout(cell: list[dict[str, Any]]) -> str:
        return "".join(e.get("text", "") for e in cell if e["type"] == "stdout")

    java = execd.post("/code/context", json={"language": "java"}).json()["id"]
    assert not [e for e in events(execd, java, "int x = 41;", context={"id": java}) if e["type"] == "error"]
    answer = events(execd, java, 'System.out.println("java " + x);\nx + 1', context={"id": java})
    assert stdout(answer) == "java 41\n"
    assert [e["results"]["text"] for e in answer if e["type"] == "result"] == ["42"]

    go = execd.post("/code/context", json={"language": "go"}).json()["id"]
    program = 'package main\nimport "fmt"\nfunc main() {\n    fmt.Print("Hello from Go! ", 2+2)\n}'
    assert stdout(events(execd, go, program, context={"id": go})) == "Hello from Go! 4"
    events(execd, go, "func double(n int) int { return 2 * n }", context={"id": go})
    assert (
        stdout(events(execd, go, '%%\nfmt.Println("double:", double(21))', context={"id": go}))
        == "double: 42\n"
    )
    broken = events(execd, go, "%%\nundeclaredVariable++", context={"id": go})
    assert broken[-1]["type"] == "error" and "undefined: undeclaredVariable" in json.dumps(broken[-1])


def test_a_passed_through_tls_connection_is_verified_with_the_images_own_cas(
    server: SandgateServer, internet: Internet, code_interpreter: str
) -> None:
    """A host the policy allows without decrypting it (no binding, no L7 rule): the sandbox's
    curl meets the origin's own certificate and must trust it through the image's system CAs, as
    an image's public CAs on the real internet. The local runtime starts no entry script, so the
    bundle it writes must hold the base image's system trust, not the proxy CA alone."""
    rootfs = ImageStore(server.state_dir / "images").get(code_interpreter).rootfs
    assert rootfs is not None
    system_ca = rootfs / "usr/share/sandgate/system-ca.crt"
    original = system_ca.read_bytes()
    system_ca.write_bytes(original + b"\n" + internet.ca_cert.read_bytes())  # the test internet's CA
    try:
        policy = {"defaultAction": "deny", "egress": [{"action": "allow", "target": API_HOST}]}
        created = server.create_sandbox(image={"uri": code_interpreter}, networkPolicy=policy)
        done = server.run(created["id"], f"curl -sS https://{API_HOST}/", timeout=60)
        assert (done.exit_code, done.stdout.strip()) == (0, "hello from origin"), done
        deadline = time.monotonic() + 30  # the connection's record lands once it closed
        while not (closed := connection_records(server, created["id"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [r["inspect"] for r in closed] == [False]  # passed through: curl met the origin's cert
        with server.client() as client:
            client.delete(f"/v1/sandboxes/{created['id']}")
    finally:
        system_ca.write_bytes(original)


def connection_records(server: SandgateServer, sandbox_id: str) -> list[dict[str, Any]]:
    records = audit_records(server.state_dir, sandbox_id)
    return [r for r in records if r.get("sni") == API_HOST and r.get("event") == "closed"]

"""The guide's tour of OpenSandbox's other SDKs: the steps a small program in each language (Go in
tests/go, Java and Kotlin in tests/java) takes against a real `sandgate serve`, on one sandbox, in
this order. Each program prints one JSON line per step, `{"step", "ok", "error"?, ...}`, with
what it saw; this module builds and runs nothing itself, it checks each step's line and, where
the program's own word is not enough, the other side: the test internet's origin log (what left
the sandbox, with which credential), the server's answer for a deleted sandbox.

A program's environment: OPEN_SANDBOX_DOMAIN and OPEN_SANDBOX_API_KEY (the server),
SANDGATE_TEST_API_HOST (a host the sandbox may reach; /echo reflects the request),
SANDGATE_TEST_DENIED_HOST (a host that resolves to the same origin but is not allowed),
SANDGATE_TEST_SECRET (the credential's value) and SANDGATE_TEST_TAG (marks the run's requests:
`/echo?tour=TAG-allowed`, `-denied`, `-credential`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.conftest import API_HOST, PATCHED_HOST
from tests.support.internet import Internet
from tests.support.server import SandgateServer

TOUR: dict[str, str] = {
    "create": "create from an image with env and metadata; the info says Running",
    "command": "run a command; its stdout and exit code",
    "file": "write a file with a mode, read it back; its info and `stat` show the mode",
    "egress": "egress policy get, then a patch whose new rule comes first",
    "requests": "from inside, the allowed host answers and the denied one is refused",
    "credential": "a vault credential is injected on the way out and scrubbed from the answer",
    "renew": "renew moves the expiry later",
    "code": "the code interpreter runs Python and returns its result",
    "delete": "delete; the sandbox is gone",
}

# client -> {step: why the client cannot express it}: skipped for that client, with the reason.
JAVA_NOT_OFFERED = {
    "egress": "com.alibaba.opensandbox:sandbox 1.0.0 (the only version on Maven Central) has no egress API",
    "code": "Maven Central serves no com.alibaba.opensandbox:code-interpreter (1.0.0: not found)",
}
NOT_OFFERED: dict[str, dict[str, str]] = {"java": JAVA_NOT_OFFERED, "kotlin": JAVA_NOT_OFFERED}

SECRET = "tour-secret-5f1c0a9e"  # the credential's value, never to be seen inside a sandbox
Result = dict[str, Any]


@dataclass(frozen=True)
class Run:
    """One program's run: each step's line, and the server it ran against."""

    results: dict[str, Result]
    server: SandgateServer


def offered(client: str) -> list[str]:
    return [name for name in TOUR if name not in NOT_OFFERED.get(client, {})]


def tag_of(client: str, mode: str) -> str:
    return f"{client}-{mode}"


def server_of(mode: str, server: SandgateServer, direct_execd_server: SandgateServer) -> SandgateServer:
    return direct_execd_server if mode == "direct_execd" else server


def run_tour(command: Sequence[str], client: str, mode: str, server: SandgateServer, timeout: float) -> Run:
    """Run one program (`command`, given `direct` or `server_proxy` as its last argument) in one
    of SDK_MODES against `server`."""
    connection = "server_proxy" if mode == "server_proxy" else "direct"
    env = {
        **server.env(),
        "SANDGATE_TEST_API_HOST": API_HOST,
        "SANDGATE_TEST_DENIED_HOST": PATCHED_HOST,
        "SANDGATE_TEST_SECRET": SECRET,
        "SANDGATE_TEST_TAG": tag_of(client, mode),
    }
    done = subprocess.run([*command, connection], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{client} {mode}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines] == offered(client), done.stdout + done.stderr
    return Run({line["step"]: line for line in lines}, server)


def seen_at_origin(internet: Internet, tag: str, what: str) -> list[dict[str, Any]]:
    return [r for r in internet.origin_requests() if r["path"] == f"/echo?tour={tag}-{what}"]


def check_other_side(step: str, result: Result, tag: str, server: SandgateServer, internet: Internet) -> None:
    """What the origin and the server say about a step the program reported as done."""
    if step == "requests":
        allowed = seen_at_origin(internet, tag, "allowed")
        assert [r["headers"]["host"] for r in allowed] == [API_HOST], allowed
        assert not seen_at_origin(internet, tag, "denied"), "the denied request reached the origin"
    elif step == "credential":
        (request,) = seen_at_origin(internet, tag, "credential")
        assert request["headers"]["authorization"] == f"Bearer {SECRET}"
        assert SECRET not in result["authorization"], result
    elif step == "delete":
        with server.client() as api:
            assert api.get(f"/v1/sandboxes/{result['sandbox']}").status_code == 404


def check(client: str, run: Callable[[], Run], mode: str, step: str, internet: Internet) -> None:
    """One step's outcome in one mode as a test: skipped where the client does not offer it."""
    if step in NOT_OFFERED.get(client, {}):
        pytest.skip(f"{client}: {NOT_OFFERED[client][step]}")
    done = run()
    result = done.results[step]
    assert result["ok"], f"{client} ({mode}): {step}: {TOUR[step]}\n{result.get('error')}"
    check_other_side(step, result, tag_of(client, mode), done.server, internet)


def build_cache(name: str) -> Path:
    """Where a tour program's build lives between runs (kept by version: the build tools reuse it)."""
    default = Path.home() / ".cache" / "sandgate" / "sdk-builds"
    path = Path(os.environ.get("SANDGATE_SDK_BUILD_CACHE", default)) / name
    path.mkdir(parents=True, exist_ok=True)
    return path

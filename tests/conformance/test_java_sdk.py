"""OpenSandbox's Java/Kotlin SDK (com.alibaba.opensandbox:sandbox 1.0.0, the only version Maven
Central serves; scripts/bootstrap.sh resolves it and the Kotlin compiler into
~/.cache/sandgate/m2), unchanged, against a real `sandgate serve`: the guide's tour (tour.py)
from Java (tests/java/.../JavaTour.java) and from Kotlin (KotlinTour.kt, compiled by
kotlin-maven-plugin 2.4.21), built here offline, once per source digest, and run in direct mode.

1.0.0 has no networkPolicy, egress, credential-vault or server-proxy API, so its sandboxes get
the operator's default policy (`default_policy`, docs/policy.md): the allowed host, and a binding
whose vault entry (`sandgate vault put`) the proxy injects. That is how an operator serves a
client that cannot say its policy. It reads no endpoint headers either, so it cannot present
execd's token: its execd calls carry the API key as a connection header, which the default 44772
endpoint (sandgate's reverse proxy) takes; against `execd_endpoint = "direct"` (execd itself,
which takes only its token) it cannot run a command, so that mode is not run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conformance.conftest import API_HOST, upstream
from tests.conformance.tour import SECRET, TOUR, Run, build_cache, check, run_tour
from tests.support.internet import Internet
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root
SOURCE = Path(__file__).resolve().parents[1] / "java"
M2 = Path(os.environ.get("SANDGATE_MAVEN_REPO", Path.home() / ".cache" / "sandgate" / "m2"))
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 300
PROGRAMS = {"java": "tour.JavaTour", "kotlin": "tour.KotlinTourKt"}
DEFAULT_POLICY = f"""\
version: 1
defaultAction: deny
egress:
  - {{action: allow, target: {API_HOST}}}
bindings:
  - name: api
    credential: tour-token
    match: {{hosts: [{API_HOST}]}}
    auth: {{type: bearer}}
"""


def source_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([SOURCE / "pom.xml", *(SOURCE / "src").rglob("*")]):
        if path.is_file():
            digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def java_classpath() -> str:
    """tests/java compiled offline from the Maven repo bootstrap filled; the classes are kept
    under the sources' digest, so a later run with the same sources builds nothing. Built beside
    and renamed into place: another tree's run may build the same digest at the same time."""
    build = build_cache("java-tour") / source_digest()
    if not build.exists():
        mvn = shutil.which("mvn")
        assert mvn, "maven is not installed (scripts/bootstrap.sh test installs it)"
        fresh = Path(tempfile.mkdtemp(dir=build.parent, prefix=".building-"))
        done = subprocess.run(
            [mvn, "-o", "-B", "-q", f"-Dmaven.repo.local={M2}", f"-Dtour.build={fresh}", "compile"],
            cwd=SOURCE,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        assert done.returncode == 0, f"mvn compile: {done.returncode}\n{done.stdout}\n{done.stderr}"
        try:
            fresh.rename(build)
        except OSError:  # built by another run meanwhile
            shutil.rmtree(fresh)
    return f"{build / 'classes'}:{(build / 'classpath.txt').read_text().strip()}"


@pytest.fixture(scope="module")
def java_server(tmp_path_factory: pytest.TempPathFactory, internet: Internet) -> Iterator[SandgateServer]:
    """A server whose sandboxes created without a policy get DEFAULT_POLICY, its secret stored."""
    workdir = tmp_path_factory.mktemp("java-sandgate")
    policy = workdir / "default-policy.yaml"
    policy.write_text(DEFAULT_POLICY)
    with sandgate_server(workdir, {**upstream(internet), "SANDGATE_DEFAULT_POLICY": str(policy)}) as running:
        running.vault_put("tour-token", SECRET)
        yield running


@pytest.fixture(scope="module")
def jvm_runs(java_classpath: str, java_server: SandgateServer) -> Callable[[str], Run]:
    """The tour of one client (java, kotlin), run once on first use."""
    java = shutil.which("java")
    assert java, "a JDK is not installed (scripts/bootstrap.sh test installs it)"

    @functools.cache
    def run(client: str) -> Run:
        command = [java, "-cp", java_classpath, PROGRAMS[client]]
        return run_tour(command, client, "direct", java_server, RUN_TIMEOUT_S)

    return run


@pytest.mark.parametrize("step", TOUR)
@pytest.mark.parametrize("client", PROGRAMS)
def test_java_sdk(jvm_runs: Callable[[str], Run], internet: Internet, client: str, step: str) -> None:
    check(client, lambda: jvm_runs(client), "direct", step, internet)

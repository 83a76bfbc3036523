"""A policy learned from a real developer workload: inside a sandbox, pip installs a package from
a PEP 503 index (the index on one host, the wheel on a second, as public indexes split them), git
clones a private repository over HTTPS (git's smart HTTP protocol, `git http-backend`), and curl
calls an API; the proxy injects the git host's token and the API's key. All of it is real and
served by the test internet from files this module builds: a wheel made by `pip wheel`, a bare
repository made by git.

The run goes first under a report-mode policy, `sandgate policy suggest` writes a policy from the
audit log, and that policy in enforce mode lets the same workload pass again (proven by the
origins' logs: every request arrived twice, the API's with the credential), while what the
workload never did is refused: another host, the index on another port, another method and
another path on the API, a push to the repository (proven by the origins' logs, where they never
arrive, and by the audit records of the refusals).

The index and its file host are passed through (no rule needs their paths), so the sandbox checks
their certificates itself: it is given the test internet's CA, as a real sandbox trusts the
public web's roots; the git host and the API are intercepted for their bindings, under the
proxy's CA, so what the run did there is learned request by request (methods and paths).
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conformance.conftest import API_HOST, PATCHED_HOST, curl_status, set_policy
from tests.support.audit import audit_records
from tests.support.cli import sandgate
from tests.support.internet import ORIGIN_V4, Internet
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root
INDEX, FILES, GIT = "pypi.example.test", "files.example.test", "git.example.test"
API, ELSEWHERE = "api.example.test", "elsewhere.example.test"
PACKAGE, WHEEL = "sgdemo", "sgdemo-1.0-py3-none-any.whl"
API_KEY, GIT_TOKEN = "workload-api-key-8d41c2", "workload-git-token-5be7a0"
# The bound hosts are allowed from the start (a binding needs an explicit allow rule for its
# host); their methods and paths, and everything else, are learned.
REPORT: dict[str, object] = {
    "mode": "report",
    "defaultAction": "deny",
    "egress": [{"action": "allow", "target": API}, {"action": "allow", "target": GIT}],
}
WORKLOAD_REQUESTS = [  # (host, method, path): what each run sends (git's smart HTTP POSTs twice)
    (INDEX, "GET", f"/simple/{PACKAGE}/"),
    (FILES, "GET", f"/packages/{WHEEL}"),
    (GIT, "GET", "/repo.git/info/refs?service=git-upload-pack"),
    (GIT, "POST", "/repo.git/git-upload-pack"),
    (API, "GET", "/echo/v1/models"),
    (API, "POST", "/echo/v1/chat"),
]
ROOTS = "/tmp/roots.pem"  # in the sandbox: its own CA bundle plus the test internet's CA
SYSTEM_PYTHON = "/usr/bin/python3"  # the sandbox's python (the host's /usr), with Debian's pip
OUTPUT = ["installed from the test index", "cloned over HTTPS"]  # the module's greeting, the README


def build_wheel(workdir: Path) -> Path:
    """A one-module package, built into a wheel by pip from local files (no index, no network)."""
    source = workdir / "source"
    source.mkdir()
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{PACKAGE}"\nversion = "1.0"\n'
        f'[tool.setuptools]\npy-modules = ["{PACKAGE}"]\n'
    )
    (source / f"{PACKAGE}.py").write_text('GREETING = "installed from the test index"\n')
    wheels = workdir / "wheels"
    build = [SYSTEM_PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation"]
    subprocess.run([*build, "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=120)
    return wheels / WHEEL


def package_index(workdir: Path, wheel: Path) -> tuple[Path, Path]:
    """(the index's files, the file host's files): a PEP 503 simple index linking to the wheel
    on the file host, with its sha256 (pip checks it)."""
    index, files = workdir / "index", workdir / "files"
    (index / "simple" / PACKAGE).mkdir(parents=True)
    (files / "packages").mkdir(parents=True)
    (files / "packages" / WHEEL).write_bytes(wheel.read_bytes())
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    link = f"https://{FILES}/packages/{WHEEL}#sha256={digest}"
    (index / "simple" / "index.html").write_text(
        f'<html><body><a href="{PACKAGE}/">{PACKAGE}</a></body></html>\n'
    )
    (index / "simple" / PACKAGE / "index.html").write_text(
        f'<html><body><a href="{link}">{WHEEL}</a></body></html>\n'
    )
    return index, files


def git_repository(workdir: Path) -> Path:
    """A directory holding repo.git (bare, one commit), for `git http-backend`."""
    work, site = workdir / "work", workdir / "git"
    identity = ["-c", "user.name=sandgate test", "-c", "user.email=test@example.test"]

    def git(*args: str) -> None:
        subprocess.run(["git", *identity, *args], check=True, capture_output=True, timeout=60)

    git("init", "-q", "-b", "main", str(work))
    (work / "README").write_text("cloned over HTTPS\n")
    git("-C", str(work), "add", "README")
    git("-C", str(work), "commit", "-q", "-m", "first")
    git("clone", "-q", "--bare", str(work), str(site / "repo.git"))
    return site


@pytest.fixture(scope="module")
def sites(internet: Internet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    workdir = tmp_path_factory.mktemp("workload-sites")
    index, files = package_index(workdir, build_wheel(workdir))
    internet.serve_site(INDEX, index)
    internet.serve_site(FILES, files)
    internet.serve_git(GIT, git_repository(workdir))
    internet.set_names(
        {name: [ORIGIN_V4] for name in [API_HOST, PATCHED_HOST, INDEX, FILES, GIT, API, ELSEWHERE]}
    )
    yield
    internet.set_names({API_HOST: [ORIGIN_V4], PATCHED_HOST: [ORIGIN_V4]})


def workload(server: SandgateServer, sandbox_id: str, run: str) -> list[str]:
    """pip install, git clone, two API calls; fails (set -e) at the first step that fails."""
    # pip's requests prefers REQUESTS_CA_BUNDLE (set for the sandbox) to its own --cert
    env = " ".join(f"{name}={ROOTS}" for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO"))
    pip = f"{SYSTEM_PYTHON} -m pip install -q --disable-pip-version-check --no-cache-dir"
    script = " && ".join([
        f"{env} {pip} --index-url https://{INDEX}/simple/ --target /tmp/{run}/site {PACKAGE}",
        f"PYTHONPATH=/tmp/{run}/site {SYSTEM_PYTHON} -c 'import {PACKAGE}; print({PACKAGE}.GREETING)'",
        f"{env} git clone -q https://{GIT}/repo.git /tmp/{run}/repo",
        f"cat /tmp/{run}/repo/README",
        f"curl -sSf -o /dev/null https://{API}/echo/v1/models",
        f"curl -sSf -o /dev/null -X POST -d '{{}}' https://{API}/echo/v1/chat",
    ])  # fmt: skip
    done = server.run(sandbox_id, f"set -e; {script}", timeout=240)
    assert done.exit_code == 0, f"workload {run} failed: {done.stdout}\n{done.stderr}"
    return done.stdout.splitlines()


def bind_credentials(server: SandgateServer, sandbox_id: str) -> None:
    """The API's key and the git host's token, injected by the proxy, through the sandbox's
    credential-vault API."""
    with server.client() as client:
        egress = client.get(f"/v1/sandboxes/{sandbox_id}/endpoints/18080").json()
    vault = {
        "credentials": [
            {"name": "api-key", "source": {"type": "inline", "value": API_KEY}},
            {"name": "git-token", "source": {"type": "inline", "value": GIT_TOKEN}},
        ],
        "bindings": [
            {"name": "api", "match": {"hosts": [API]}, "auth": {"type": "bearer", "credential": "api-key"}},
            {"name": "git", "match": {"hosts": [GIT]}, "auth": {"type": "bearer", "credential": "git-token"}},
        ],
    }
    answer = httpx.post(
        f"http://{egress['endpoint']}/credential-vault", json=vault, headers=egress["headers"]
    )
    assert answer.status_code == 201, answer.text


def trust_the_test_internet(server: SandgateServer, sandbox_id: str, internet: Internet) -> None:
    pem = internet.ca_cert.read_text()
    done = server.run(sandbox_id, f'cat "$SSL_CERT_FILE" - > {ROOTS} <<"EOF"\n{pem}EOF\n', timeout=30)
    assert done.exit_code == 0, done.stderr


def arrived(internet: Internet, host: str, method: str, path: str) -> list[dict[str, Any]]:
    """The requests the origins got for `host` (by its Host header) with this method and path."""
    return [
        request
        for request in internet.origin_requests()
        if request["headers"].get("host") == host  # type: ignore[attr-defined]
        and request["method"] == method
        and request["path"] == path
    ]


def test_a_policy_learned_from_pip_git_and_an_api_lets_them_pass_and_nothing_else(
    server: SandgateServer, internet: Internet, sites: None, tmp_path: Path
) -> None:
    sandbox_id = server.create_sandbox()["id"]
    set_policy(server, sandbox_id, REPORT)
    bind_credentials(server, sandbox_id)
    trust_the_test_internet(server, sandbox_id, internet)
    assert workload(server, sandbox_id, "report") == OUTPUT
    requests_of_one_run = {request: len(arrived(internet, *request)) for request in WORKLOAD_REQUESTS}
    assert all(requests_of_one_run.values()), requests_of_one_run  # each reached its origin
    learned = tmp_path / "learned.yaml"
    ran = sandgate(
        "--state-dir", str(server.state_dir), "policy", "suggest", "--sandbox", sandbox_id, "-o", str(learned)
    )
    assert ran.returncode == 0, ran.stderr
    checked = sandgate("policy", "check", str(learned))
    assert checked.returncode == 0, checked.stdout + checked.stderr + learned.read_text()
    policy = yaml.safe_load(learned.read_text())
    learned_l7 = {rule["target"]: (rule.get("methods"), rule.get("paths")) for rule in policy["egress"]}
    assert learned_l7 == {  # exact names, one rule each
        API: (["GET", "POST"], ["/echo/v1/chat", "/echo/v1/models"]),
        GIT: (["GET", "POST"], ["/repo.git/git-upload-pack", "/repo.git/info/refs"]),
        INDEX: (None, None),  # passed through: the connection is all there is to allow
        FILES: (None, None),
    }, learned.read_text()
    assert all(rule["ports"] == [443] for rule in policy["egress"]), learned.read_text()

    set_policy(server, sandbox_id, {**policy, "mode": "enforce"})
    assert workload(server, sandbox_id, "enforce") == OUTPUT
    for request, count in requests_of_one_run.items():
        assert len(arrived(internet, *request)) == 2 * count, request  # the enforced run made them all again
    for request in arrived(internet, API, "GET", "/echo/v1/models"):
        assert request["headers"]["authorization"] == f"Bearer {API_KEY}"
    for request in arrived(internet, GIT, "POST", "/repo.git/git-upload-pack"):
        assert request["headers"]["authorization"] == f"Bearer {GIT_TOKEN}"

    never_seen = curl_status(server, sandbox_id, f"https://{ELSEWHERE}/echo/out")
    assert never_seen in ("000", "403")  # a host never seen
    assert (
        curl_status(server, sandbox_id, f"-X DELETE https://{API}/echo/v1/models") == "403"
    )  # a method never used
    assert curl_status(server, sandbox_id, f"https://{API}/echo/v1/keys") == "403"  # a path never used
    assert curl_status(server, sandbox_id, f"http://{INDEX}/simple/") in ("000", "403")  # a port never used
    push = f"-X POST -H 'content-type: application/x-git-receive-pack-request' https://{GIT}/repo.git/git-receive-pack"
    assert curl_status(server, sandbox_id, push) == "403"  # a push: a path the clone never used
    assert not arrived(internet, GIT, "POST", "/repo.git/git-receive-pack")
    assert not arrived(internet, ELSEWHERE, "GET", "/echo/out")
    assert not arrived(internet, INDEX, "GET", "/simple/")
    assert not arrived(internet, API, "DELETE", "/echo/v1/models")
    assert not arrived(internet, API, "GET", "/echo/v1/keys")
    refusals = {
        (record["host"], record.get("method"), record.get("path"), record["reason"])
        for record in audit_records(server.state_dir, sandbox_id)
        if record["decision"] == "deny"  # in enforce mode; report mode's would-denials say `report`
    }
    assert (API, "DELETE", "/echo/v1/models", "method_not_allowed") in refusals, refusals
    assert (API, "GET", "/echo/v1/keys", "path_not_allowed") in refusals, refusals
    assert (GIT, "POST", "/repo.git/git-receive-pack", "path_not_allowed") in refusals, refusals
    assert any(host == ELSEWHERE and reason == "default" for host, _m, _p, reason in refusals), refusals
    assert any(host == INDEX and reason == "port_not_allowed" for host, _m, _p, reason in refusals), refusals

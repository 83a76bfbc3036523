"""Nothing of the host or the control plane reaches a sandbox (issue 14's done-when), on the local
and the Docker runtime.

Unique canaries are planted everywhere a secret lives on the host: `sandgate serve`'s environment
(the API key, SANDGATE_VAULT_KEY, an OpenBao token setting, VAULT_TOKEN/BAO_TOKEN as an operator
might export them, a Docker socket path), a config file the server reads (an /etc/sandgate-like
path the test owns, named by SANDGATE_CONFIG), the state dir (a note, the vault key file, the API
key file; and the CA private key serve writes there), a file in the project checkout, the Docker
engine's socket path; and in client request headers (OPEN-SANDBOX-API-KEY, which the JS SDK sends
on every execd call, an Authorization and a custom header a client adds of its own). A sandbox
is then driven with the Python SDK and the JS SDK from npm (tests/js/drive.mjs), each in direct
and server-proxy mode, and a scanner inside the sandbox reads the whole visible filesystem, every
visible /proc/*/environ, cmdline and mountinfo, every readable /proc/*/mem, and the kernel log:
zero hits.

Every planted canary but two starts with one run-unique prefix, so the scanner searches for few
needles; the CA key (random, written by serve) and the engine's socket path are searched as
they are. The scanner gets its needles XOR-encoded (so no file, argv or other process inside the
sandbox holds them) and proves each of its channels on controls it plants itself: a file, a
child's environment, cmdline and memory. A hit is reported by place and needle number only.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync

from sandgate.proxy.contract.ca import CA_KEY_AND_CERT
from sandgate.vault.store import LOCAL_KEY_FILE
from tests.support.server import SandgateServer, sandgate_server

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
JS_DRIVER = REPO / "tests" / "js" / "drive.mjs"
SCAN_TIMEOUT = 900.0
XOR = 0x5A

# Runs inside the sandbox: `python3 scan.py <needles file>`. It holds no needle in its own text.
SCANNER = r"""
import json, os, re, stat, subprocess, sys, ctypes
XOR = int(sys.argv[2])
needles = [bytes(b ^ XOR for b in bytes.fromhex(line)) for line in open(sys.argv[1]).read().split()]
longest = max(map(len, needles))
hits, seen = [], {"files": 0, "bytes": 0, "unreadable_files": 0, "mem_read": [], "mem_denied": []}

def scan(where, data):
    for number, needle in enumerate(needles):
        if needle in data:
            hits.append([where, number])

def scan_file(path):
    try:
        with open(path, "rb") as handle:
            tail = b""
            while chunk := handle.read(1 << 22):
                scan(path, tail + chunk)
                tail = chunk[-longest:]
                seen["bytes"] += len(chunk)
        seen["files"] += 1
    except OSError:
        seen["unreadable_files"] += 1

# controls: the scanner must find each channel's planted needle (the first one reversed, so
# that it holds no needle itself)
control = needles[0][::-1] + b"-control"
with open("/tmp/control-file", "wb") as handle:
    handle.write(control)
child = subprocess.Popen(
    [sys.executable, "-c", "import sys, time; held = sys.argv[1].encode() * 2; time.sleep(600)",
     control.decode()], env={"CONTROL": control.decode()})
needles.append(control)

for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in files:
        path = os.path.join(top, name)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                scan_file(path)
        except OSError:
            seen["unreadable_files"] += 1

me = os.getpid()
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != me]:
    for part in ("environ", "cmdline", "mountinfo"):
        try:
            scan(f"/proc/{pid}/{part}", open(f"/proc/{pid}/{part}", "rb").read())
        except OSError:
            pass
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        seen["mem_denied"].append(int(pid))
        continue
    read = 0
    for line in maps:
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if "r" not in fields[1] or end - start > (1 << 29) or fields[-1] in ("[vvar]", "[vsyscall]"):
            continue
        try:
            scan(f"/proc/{pid}/mem", os.pread(mem, end - start, start))
            read += end - start
        except OSError:
            pass
    os.close(mem)
    if read:
        seen["mem_read"].append(int(pid))

libc = ctypes.CDLL(None, use_errno=True)
buffer = ctypes.create_string_buffer(1 << 20)
size = libc.klogctl(3, buffer, len(buffer))
seen["klogctl"] = "read" if size >= 0 else os.strerror(ctypes.get_errno())
if size > 0:
    scan("klogctl", buffer.raw[:size])
try:
    scan("dmesg", subprocess.run(["dmesg"], capture_output=True, timeout=30).stdout)
except OSError:
    pass
child.kill()
print(json.dumps({"hits": hits, "seen": seen, "controls": len(needles) - 1, "child": child.pid}))
"""


@dataclass
class Canaries:
    prefix: str
    others: list[str]  # secrets that cannot carry the prefix, searched as they are

    @property
    def needles(self) -> list[str]:
        return [self.prefix, *self.others]

    def encoded(self) -> str:
        return "\n".join(bytes(b ^ XOR for b in n.encode()).hex() for n in self.needles) + "\n"


def vault_key(prefix: str) -> str:
    """A valid SANDGATE_VAULT_KEY (base64 of 32 bytes) that starts with the prefix."""
    body = f"{prefix}vaultkey{secrets.token_hex(16)}"[:42] + "A"  # 43rd character: low bits 0
    return body + "="


def plant(root: Path, prefix: str, engine_socket: str) -> tuple[dict[str, str], Path]:
    """Plant the host-side canaries; returns serve's extra environment and the checkout file."""
    state_dir = root / "state"
    state_dir.mkdir(mode=0o700)
    (state_dir / "operator-notes.txt").write_text(f"{prefix}-state-dir\n")
    (state_dir / LOCAL_KEY_FILE).write_text(vault_key(prefix) + "\n")
    (state_dir / "api_key").write_text(f"{prefix}-api-key-file\n")
    config = root / "etc" / "sandgate" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'openbao_secret_id = "{prefix}-config-file"\n')
    checkout = REPO / f".canary-{prefix}"
    checkout.write_text(f"{prefix}-checkout\n")
    env = {
        "SANDGATE_CONFIG": str(config),
        "SANDGATE_VAULT_KEY": vault_key(prefix),
        "SANDGATE_OPENBAO_TOKEN": f"hvs.{prefix}-openbao-token",
        "VAULT_TOKEN": f"hvs.{prefix}-vault-token",
        "BAO_TOKEN": f"hvs.{prefix}-bao-token",
        "SANDGATE_DOCKER_HOST": engine_socket,
    }
    return env, checkout


def ca_key_line(state_dir: Path) -> str:
    """A line of the CA private key's base64, as serve wrote it."""
    pem = (state_dir / CA_KEY_AND_CERT).read_text()
    body = re.search(r"-----BEGIN PRIVATE KEY-----\n(.*?)-----END", pem, re.S)
    assert body is not None, "no private key in the CA file"
    return max(body.group(1).split(), key=len)


@pytest.fixture(params=["local", "docker", "gvisor"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SandgateServer, Canaries]]:
    prefix = f"SGCANARY{secrets.token_hex(6)}"
    if request.param == "docker":
        request.getfixturevalue("sandbox_images")
        dockerd = request.getfixturevalue("dockerd")
        engine_socket, runtime = dockerd.url, {"SANDGATE_RUNTIME": "docker"}
    else:
        engine_socket = f"unix:///run/{prefix}-engine/docker.sock"
        runtime = {"SANDGATE_ISOLATION": "gvisor"} if request.param == "gvisor" else {}
    env, checkout = plant(tmp_path, prefix, engine_socket)
    try:
        with sandgate_server(tmp_path, {**env, **runtime}, api_key=f"{prefix}-api-key") as server:
            others = [ca_key_line(server.state_dir)]
            if request.param == "docker":
                others.append(engine_socket.removeprefix("unix://"))
            yield server, Canaries(prefix, others)
    finally:
        checkout.unlink()


def client_headers(prefix: str, language: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {prefix}-{language}-auth",
        "X-Client-Secret": f"{prefix}-{language}-header",
    }


def drive_with_python(server: SandgateServer, prefix: str) -> SandboxSync:
    """Create the sandbox and use it in both modes, with a client's own headers."""
    sandboxes = []
    for proxied in (False, True):
        config = ConnectionConfigSync(
            domain=server.domain,
            api_key=server.api_key,
            protocol="http",
            headers=client_headers(prefix, "python"),
            request_timeout=timedelta(seconds=60),
            disable_metrics=True,
            use_server_proxy=proxied,
        )
        if not sandboxes:
            sandbox = SandboxSync.create(
                "sandgate/host", entrypoint=["sleep", "infinity"], connection_config=config,
                ready_timeout=timedelta(seconds=60),
            )  # fmt: skip
        else:
            sandbox = SandboxSync.connect(sandboxes[0].id, connection_config=config)
        sandboxes.append(sandbox)
        run = sandbox.commands.run(f"echo python-{proxied}")
        assert "".join(m.text for m in run.logs.stdout).strip() == f"python-{proxied}"
        sandbox.files.write_file(f"/tmp/python-{proxied}.txt", "written by the Python SDK")
        assert sandbox.files.read_file(f"/tmp/python-{proxied}.txt") == "written by the Python SDK"
    return sandboxes[0]


def drive_with_js(server: SandgateServer, sandbox_id: str, prefix: str) -> None:
    node = shutil.which("node")
    assert node, "node is not installed (scripts/bootstrap.sh test installs it)"
    done = subprocess.run(
        [node, str(JS_DRIVER), sandbox_id, json.dumps(client_headers(prefix, "js"))],
        cwd=JS_DRIVER.parent, env=server.env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert json.loads(done.stdout.splitlines()[-1])["outputs"] == ["js-false", "js-true"]


def test_no_canary_is_visible_inside_a_sandbox(world: tuple[SandgateServer, Canaries]) -> None:
    server, canaries = world
    sandbox = drive_with_python(server, canaries.prefix)
    drive_with_js(server, sandbox.id, canaries.prefix)
    sandbox.files.write_file("/tmp/.scan/needles", canaries.encoded())
    sandbox.files.write_file("/tmp/.scan/scan.py", SCANNER)

    result = server.run(sandbox.id, f"python3 -I /tmp/.scan/scan.py /tmp/.scan/needles {XOR}", SCAN_TIMEOUT)
    assert result.exit_code == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])

    control = len(canaries.needles)  # the scanner's own control needle comes last
    found = {(where, number) for where, number in report["hits"] if number != control}
    assert found == set(), f"canaries visible in the sandbox: {sorted(found)}"
    control_places = {where for where, number in report["hits"] if number == control}
    child = report["child"]
    expected = {"/tmp/control-file", f"/proc/{child}/environ", f"/proc/{child}/cmdline", f"/proc/{child}/mem"}
    assert expected <= control_places, f"the scanner missed its controls: {sorted(control_places)}"
    seen = report["seen"]
    # Under gVisor the kernel log is gVisor's own boot lines (scanned like the rest).
    gvisor = server.server_env().get("SANDGATE_ISOLATION") == "gvisor"
    assert seen["files"] > 100 and seen["klogctl"] == ("read" if gvisor else "Operation not permitted"), seen

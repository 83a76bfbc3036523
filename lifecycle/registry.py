"""Image references and the registry client: what `python:3.12` means, and how it is fetched.

Rules:
1. A reference is normalised as Docker does: no registry host (a first part without `.` or `:`
   and not `localhost`) means `docker.io`, and a one-part docker.io name lives under `library/`;
   no tag and no digest means `:latest`. `host:port/a/b@sha256:...` is taken as written.
2. Fetching is skopeo's (the distribution API v2 client of containers/image, maintained with
   podman and CRI-O): `skopeo copy docker://REF oci:DIR`, which resolves a multi-arch index for
   the requested platform, checks every blob against its digest while it downloads, and talks
   token and basic auth. sandgate checks the digests again when it unpacks (lifecycle/layers.py).
3. skopeo runs with nothing of the host's container configuration: an empty registries.conf,
   our own trust policy, a private HOME, no inherited environment. Credentials go in an authfile
   written 0600 in a private temporary directory and deleted after the copy; never argv, env,
   logs, or error messages (skopeo's own messages name the registry and the user at most).
4. `docker.io` references go to each of `registry_mirrors` in turn, then to docker.io itself,
   like dockerd's `registry-mirrors`; under `registry_mirror_only` never to docker.io (an
   air-gapped or proxied install: no lookup of a public name), and a tag the mirrors lack is a
   `not-found` naming them. A registry may be spoken to over plain HTTP only when it is loopback
   or listed in `insecure_registries`.
5. Failures are `PullError`s whose `kind` says which (`not-found`, `unauthorized`, `platform`,
   `unreachable`, `invalid`) so the API answers 4xx with the reference and the registry named.
   A pull never waits longer than its timeout.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from sandgate.lifecycle.errors import RuntimeError_

DOCKER_HUB = "docker.io"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
HOST = re.compile(r"^(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?$")
# Our trust policy: digests are what we check; image signatures are not in scope (docs/images.md).
TRUST_POLICY = '{"default": [{"type": "insecureAcceptAnything"}]}'
PullKind = Literal["not-found", "unauthorized", "platform", "unreachable", "invalid"]
# skopeo's messages -> what went wrong (first match wins).
FAILURES: tuple[tuple[re.Pattern[str], PullKind], ...] = (
    (re.compile(r"digest did not match|digest mismatch", re.I), "invalid"),
    (re.compile(r"manifest unknown|name unknown|not found|404", re.I), "not-found"),
    (re.compile(r"unauthorized|authentication required|denied|401|403", re.I), "unauthorized"),
    (re.compile(r"no image found in (?:image index|manifest list)", re.I), "platform"),
    (re.compile(r"deadline exceeded|timeout|connection refused|no route|no such host|"
                r"network is unreachable|connection reset|EOF|i/o timeout", re.I), "unreachable"),
)  # fmt: skip


class PullError(RuntimeError_):
    """A pull failed; `kind` says how (see rule 5) and the message names reference and registry."""

    def __init__(self, kind: PullKind, message: str) -> None:
        self.kind = kind
        super().__init__(message)


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        """Normalise an image reference (rule 1); raises `PullError("invalid")` naming the fault."""
        rest, digest = text, None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not DIGEST.fullmatch(digest):
                raise PullError("invalid", f"image {text!r}: the digest must be sha256: and 64 hex digits")
        first, slash, remainder = rest.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, remainder
            if not HOST.fullmatch(registry):
                raise PullError("invalid", f"image {text!r}: {registry!r} is not a registry host[:port]")
        else:
            registry, path = DOCKER_HUB, rest
        tag = None
        if ":" in path.rsplit("/", 1)[-1]:
            path, tag = path.rsplit(":", 1)
            if not TAG.fullmatch(tag):
                raise PullError("invalid", f"image {text!r}: tag {tag!r} is not a valid tag")
        if registry == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        if not REPOSITORY.fullmatch(path):
            raise PullError(
                "invalid",
                f"image {text!r}: {path!r} is not a repository name (lowercase parts joined by /)",
            )
        return cls(registry, path, tag if tag or digest else "latest", digest)

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}{f':{self.tag}' if self.tag else ''}" + (
            f"@{self.digest}" if self.digest else ""
        )

    def on(self, registry: str) -> Reference:
        return replace(self, registry=registry)


@dataclass(frozen=True)
class Credentials:
    """A registry login (from `ImageSpec.auth`); the password is never printed (repr hides it)."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=<hidden>)"


@dataclass(frozen=True)
class Platform:
    os: str = "linux"
    architecture: str = "amd64"
    variant: str | None = None

    @classmethod
    def host(cls) -> Platform:
        machine = os.uname().machine
        arch = {
            "x86_64": "amd64",
            "aarch64": "arm64",
            "armv7l": "arm",
            "ppc64le": "ppc64le",
            "s390x": "s390x",
        }
        return cls("linux", arch.get(machine, machine))

    def __str__(self) -> str:
        return f"{self.os}/{self.architecture}" + (f"/{self.variant}" if self.variant else "")


@dataclass(frozen=True)
class RegistryConfig:
    mirrors: tuple[str, ...] = ()
    insecure: tuple[str, ...] = ()
    mirror_only: bool = False
    timeout: float = 300.0
    skopeo: str = "skopeo"


def mirror_host(url: str) -> str:
    """`http://10.0.0.2:5000` or `mirror.example.com` -> the host[:port] a reference names."""
    return urlsplit(url if "//" in url else f"//{url}").netloc


def candidates(reference: Reference, config: RegistryConfig) -> list[Reference]:
    """Where to look for an image, in order (rule 4)."""
    if reference.registry != DOCKER_HUB:
        return [reference]
    mirrored = [reference.on(mirror_host(url)) for url in config.mirrors]
    return mirrored if config.mirror_only else [*mirrored, reference]


def most_telling(reference: Reference, config: RegistryConfig, errors: Sequence[PullError]) -> PullError:
    """Of the candidates' failures, the one to report: a refusal says more than a miss. Under
    `mirror_only` the message says docker.io was not asked, so nobody goes looking there."""
    order: list[PullKind] = ["unauthorized", "platform", "invalid", "not-found", "unreachable"]
    error = min(errors, key=lambda error: order.index(error.kind))
    if reference.registry != DOCKER_HUB or not config.mirror_only:
        return error
    mirrors = ", ".join(mirror_host(url) for url in config.mirrors)
    return PullError(
        error.kind,
        f"{error} (registry_mirror_only: {reference} is pulled from the mirror(s) {mirrors} only, "
        "never from docker.io; copy the image into a mirror)",
    )


class RegistryClient:
    def __init__(self, config: RegistryConfig) -> None:
        self.config = config
        plain = [mirror_host(url) for url in config.mirrors if url.startswith("http://")]
        self.insecure = frozenset([*config.insecure, *plain])

    def plain_http_allowed(self, registry: str) -> bool:
        host = urlsplit(f"//{registry}").hostname or registry
        if host == "localhost" or registry in self.insecure or host in self.insecure:
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    def copy(
        self,
        reference: Reference,
        destination: Path,
        *,
        credentials: Credentials | None = None,
        platform: Platform | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Reference:
        """Copy the image into an OCI layout at `destination` (tag `image`); returns the source
        that answered. Tries every candidate (rule 4); raises the most telling `PullError`."""
        platform = platform or Platform.host()
        errors: list[PullError] = []
        for candidate in candidates(reference, self.config):
            try:
                self._copy_one(candidate, destination, credentials, platform, progress)
                return candidate
            except PullError as exc:
                errors.append(exc)
                shutil.rmtree(destination, ignore_errors=True)
        raise most_telling(reference, self.config, errors)

    def _copy_one(
        self,
        source: Reference,
        destination: Path,
        credentials: Credentials | None,
        platform: Platform,
        progress: Callable[[str], None] | None,
    ) -> None:
        with tempfile.TemporaryDirectory(prefix="sandgate-pull-") as private:
            home = Path(private)
            os.chmod(home, 0o700)
            (home / "policy.json").write_text(TRUST_POLICY)
            (home / "registries.conf").write_text("")
            argv = [self.config.skopeo, "--policy", str(home / "policy.json")]
            argv += ["--override-os", platform.os, "--override-arch", platform.architecture]
            argv += ["--override-variant", platform.variant] if platform.variant else []
            argv += [
                "--command-timeout",
                f"{max(1, int(self.config.timeout))}s",
                "copy",
                "--retry-times",
                "0",
            ]
            argv += [f"--src-tls-verify={'false' if self.plain_http_allowed(source.registry) else 'true'}"]
            if credentials is not None:
                argv += ["--src-authfile", str(_authfile(home, source.registry, credentials))]
            else:
                argv += ["--src-no-creds"]
            argv += [f"docker://{source}", f"oci:{destination}:image"]
            env = {
                "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "HOME": str(home),
                "XDG_RUNTIME_DIR": str(home),
                "XDG_CONFIG_HOME": str(home),
                "CONTAINERS_REGISTRIES_CONF": str(home / "registries.conf"),
                "TMPDIR": str(destination.parent),
            }
            try:
                process = subprocess.Popen(
                    argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
                )
            except FileNotFoundError:
                raise PullError(
                    "unreachable",
                    f"cannot pull {source}: {self.config.skopeo} is not installed (apt install skopeo)",
                ) from None
            try:
                stdout, stderr = _communicate(process, self.config.timeout + 10, progress)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise PullError(
                    "unreachable",
                    f"pulling {source} from {source.registry} took longer than {self.config.timeout:.0f} s "
                    "(setting image_pull_timeout); is the registry reachable?",
                ) from None
            if process.returncode != 0:
                raise classify_failure(source, credentials, platform, _last_message(stderr or stdout))


def _communicate(
    process: subprocess.Popen[str], timeout: float, progress: Callable[[str], None] | None
) -> tuple[str, str]:
    if progress is None:
        return process.communicate(timeout=timeout)
    assert process.stdout is not None
    for line in process.stdout:  # skopeo prints one line per blob; the timeout is skopeo's own
        progress(line.rstrip())
    return "", process.communicate(timeout=timeout)[1]


def _authfile(home: Path, registry: str, credentials: Credentials) -> Path:
    token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
    path = home / "auth.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"auths": {registry: {"auth": token}}}, handle)
    return path


def classify_failure(
    source: Reference, credentials: Credentials | None, platform: Platform, detail: str
) -> PullError:
    """A registry client's failure message as a `PullError` naming reference and registry."""
    if credentials is not None:
        detail = detail.replace(credentials.password, "[redacted]")
    kind: PullKind = next((k for pattern, k in FAILURES if pattern.search(detail)), "unreachable")
    where = f"registry {source.registry}"
    if kind == "invalid":
        message = f"{source} from {where} was refused: a blob does not match its digest ({detail})"
    elif kind == "not-found":
        message = f"image {source} was not found at {where} (unknown repository or tag): {detail}"
    elif kind == "unauthorized" and credentials is None:
        message = f"{where} wants credentials for {source}: give image.auth (username, password)"
    elif kind == "unauthorized" and credentials is not None:
        message = f"{where} refused the credentials of user {credentials.username!r} for {source}"
    elif kind == "platform":
        message = f"image {source} has no variant for platform {platform}: {detail}"
    elif "HTTP response to HTTPS client" in detail:
        message = f"{where} speaks plain HTTP; list it in insecure_registries to pull {source} from it"
    else:
        message = f"cannot pull {source} from {where}: {detail}"
    return PullError(kind, message)


def _last_message(output: str) -> str:
    """skopeo's fatal line without its logrus framing (`time=... level=fatal msg="..."`)."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return "skopeo failed without a message"
    match = re.search(r'msg="(.*)"\s*$', lines[-1])
    return match.group(1).replace('\\"', '"') if match else lines[-1]

"""The Docker runtime's images: pulled by dockerd with the local runtime's reference rules, and
any image made to run execd.

Rules:
1. References are normalised by `lifecycle/registry.py` (`python:3.12` is
   `docker.io/library/python:3.12`); `sandgate/host` is an alias of `sandgate/base:latest`.
   `image_pull_policy` is honoured as on the local runtime.
2. dockerd pulls. docker.io references go to each of `registry_mirrors` first (pulled by the
   mirror's name, then tagged with the docker.io name, so `docker images` shows what a user
   asked for), and under `registry_mirror_only` to them only; credentials from
   `ImageSpec.auth` go as the pull's `X-Registry-Auth` header only
   (never the daemon's or the host's stored logins: an empty auth config is sent without them).
   A registry that is spoken to over plain HTTP must be in the daemon's `insecure-registries`
   (dockerd's own setting; sandgate cannot loosen it). A pull waits at most the pull timeout.
3. An image built FROM `sandgate/base` (its entrypoint is `sandgate-entry`) brings execd. Any
   other image gets the local runtime's answer (runtime/launch.py rule 3): the host's /usr bound
   read-only at /.sandgate/host/usr, execd's Python and package bound read-only at their host
   paths, and `FOREIGN_LAUNCHER` as the container's entrypoint, run by the host's dynamic loader:
   it waits for the sandbox address, appends the proxy CA to the image's CA bundle in /run,
   starts the sandbox's entrypoint and becomes execd. execd's token stays in its memory.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
from docker.types import Mount

from sandgate.lifecycle.registry import (
    Credentials,
    Platform,
    PullError,
    Reference,
    RegistryConfig,
    candidates,
    classify_failure,
    most_telling,
)
from sandgate.lifecycle.runtime.base import RuntimeError_
from sandgate.lifecycle.runtime.launch import ExecdPython, python_paths

SANDGATE_ENTRY = "/usr/local/bin/sandgate-entry"
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")
# Launcher lines (with `c`, the proxy CA's path, set): the image's CA bundle plus the proxy CA in
# /run/sandgate, named by the variables programs read.
TRUST_PROXY_CA = (
    "if os.path.exists(c):\n"
    " os.makedirs('/run/sandgate',exist_ok=True);b=b''\n"
    f" for p in {CA_BUNDLES!r}:\n"
    "  if os.path.exists(p):b=open(p,'rb').read();break\n"
    " open('/run/sandgate/ca-bundle.crt','wb').write(b+b'\\n'+open(c,'rb').read())\n"
    f" for k in {CA_ENV!r}:os.environ[k]='/run/sandgate/ca-bundle.crt'\n"
)
# argv: N, the entrypoint's N words, execd's package parent dir, its site-packages, execd's args.
FOREIGN_LAUNCHER = (
    "import os,sys,socket,time\n"
    "a=os.environ['SANDGATE_ADDRESS'];t=os.environ.pop('SANDGATE_EXECD_TOKEN','');d=time.monotonic()+30\n"
    "while True:\n"
    " s=socket.socket()\n"
    " try:\n  s.bind((a,0));s.close();break\n"
    " except OSError:\n"
    "  s.close()\n"
    "  if time.monotonic()>d:sys.exit('sandgate: address '+a+' did not appear within 30 s')\n"
    "  time.sleep(0.01)\n"
    "c='/etc/sandgate/proxy-ca.crt'\n"
    f"{TRUST_PROXY_CA}"
    "n=int(sys.argv[1]);e=sys.argv[2:2+n];p,s,*x=sys.argv[2+n:]\n"
    "if e:x+=[f'--entrypoint-pid={os.posix_spawnp(e[0],e,os.environ)}','--entrypoint='+e[0]]\n"
    "sys.path[:0]=[s];m=type(sys)('sandgate');m.__path__=[p];sys.modules['sandgate']=m\n"
    "from sandgate.execd.__main__ import main\n"
    "main(x+['--token='+t] if t else x)\n"
)


class DockerImages:
    """Resolves a requested image to a reference the engine holds, pulling it when it must."""

    def __init__(
        self,
        client: docker.DockerClient,
        aliases: Mapping[str, str],
        *,
        registry: RegistryConfig | None = None,
        pull_policy: str = "if-not-present",
        execd_python: str = sys.executable,
    ) -> None:
        self.client = client
        self.aliases = dict(aliases)
        self.registry = registry or RegistryConfig()
        self.pull_policy = pull_policy
        self.execd_python = execd_python
        self._execd: ExecdPython | None = None
        self._lock = threading.Lock()

    def get(self, name: str) -> str:
        """The engine's reference for `name`, or RuntimeError_ listing what the engine has."""
        ref = self._local(name)
        if ref is None:
            have = sorted(tag for image in self.client.images.list() for tag in image.tags)
            raise RuntimeError_(
                f"image {name!r} is not in the Docker engine; it has: {', '.join(have) or 'none'}. "
                "Pull it (image_pull_policy if-not-present), build the sandbox images with `make images`, "
                "or `docker load` one."
            )
        return ref

    def ensure(
        self, name: str, *, credentials: Credentials | None = None, platform: Platform | None = None
    ) -> str:
        """The image a create asks for, pulled as `image_pull_policy` says (rule 1)."""
        ref = self._local(name)
        if ref is not None and (self.pull_policy != "always" or name in self.aliases):
            return ref
        if self.pull_policy == "never" or name in self.aliases:
            return self.get(name)
        reference = Reference.parse(name)
        with self._lock:  # concurrent creates of one image: the second finds the first's pull
            if self.pull_policy != "always" and (ref := self._local(name)) is not None:
                return ref
            return self._pull(reference, credentials, platform or Platform.host())

    def brings_execd(self, ref: str) -> bool:
        """Built FROM sandgate/base: its entry script starts execd (rule 3)."""
        config = self.client.images.get(ref).attrs.get("Config") or {}
        return SANDGATE_ENTRY in (config.get("Entrypoint") or [])

    def foreign_args(self, entrypoint: list[str], address: str, port: int) -> dict[str, Any]:
        """Container arguments that run execd from the host in an image without it (rule 3)."""
        if self._execd is None:
            self._execd = python_paths(self.execd_python).in_image(self.execd_python)
        execd = self._execd
        binds = [(path, path) for path in execd.binds] + list(execd.moved)
        argv = [str(len(entrypoint)), *entrypoint, os.path.dirname(execd.package_dir), execd.site_packages]
        return {
            "entrypoint": [*execd.interpreter, "-I", "-S", "-c", FOREIGN_LAUNCHER],
            "command": [*argv, "--host", address, "--port", str(port)],
            "mounts": [Mount(target, source, type="bind", read_only=True) for source, target in binds],
        }

    # -- internals --------------------------------------------------------------------------

    def _local(self, name: str) -> str | None:
        candidates = [self.aliases[name]] if name in self.aliases else [name]
        with contextlib.suppress(PullError):
            candidates.append(str(Reference.parse(name)))
        for ref in candidates:
            try:
                self.client.images.get(ref)
                return ref
            except docker.errors.ImageNotFound:
                continue
            except docker.errors.APIError:
                continue
        return None

    def _pull(self, reference: Reference, credentials: Credentials | None, platform: Platform) -> str:
        errors: list[PullError] = []
        for source in candidates(reference, self.registry):
            try:
                self._pull_one(source, credentials, platform)
            except PullError as exc:
                errors.append(exc)
                continue
            wanted = str(reference)
            if source != reference:  # a mirror's copy, known by the name the user asked for
                repository, _, tag = wanted.rpartition(":") if not reference.digest else (wanted, "", "")
                if not reference.digest:
                    self.client.api.tag(str(source), repository, tag)
                    return wanted
                return str(source)
            return wanted
        raise most_telling(reference, self.registry, errors)

    def _pull_one(self, source: Reference, credentials: Credentials | None, platform: Platform) -> None:
        repository = f"{source.registry}/{source.repository}"
        tag = source.digest or source.tag or "latest"
        auth = {"username": credentials.username, "password": credentials.password} if credentials else {}
        failure: list[str] = []

        def pull() -> None:
            try:
                for event in self.client.api.pull(
                    repository, tag=tag, stream=True, decode=True, auth_config=auth, platform=str(platform)
                ):
                    if "error" in event:
                        failure.append(str(event["error"]))
            except docker.errors.APIError as exc:
                failure.append(str(exc.explanation or exc))
            except docker.errors.DockerException as exc:
                failure.append(str(exc))

        worker = threading.Thread(target=pull, name=f"pull {source}", daemon=True)
        worker.start()
        worker.join(self.registry.timeout)
        if worker.is_alive():
            raise PullError(
                "unreachable",
                f"pulling {source} from registry {source.registry} took longer than "
                f"{self.registry.timeout:.0f} s (setting image_pull_timeout); is the registry reachable?",
            )
        if failure:
            raise classify_failure(source, credentials, platform, failure[-1])

"""Files the runtime puts into a sandbox's root: resolv.conf, hosts, the proxy CA, execd's env file.

Rules:
1. Every path is resolved inside the root with openat2(RESOLVE_IN_ROOT) (`kernel.open_in_root`),
   so a symlink in an image cannot lead a read or write onto the host; a symlink where a file is
   written is replaced, never followed.
2. The proxy CA is added to every CA bundle the image has (or the first of `CA_BUNDLES` is made),
   and the usual variables point at it, so TLS clients inside trust the intercepting proxy.
3. Values in execd's env file are double-quoted as execd unquotes them; a value with a line
   separator the file cannot carry is refused, never split.
"""

from __future__ import annotations

import os
import stat

from sandgate.lifecycle.images import Image
from sandgate.lifecycle.kernel import open_in_root

CA_BUNDLES = ("etc/ssl/certs/ca-certificates.crt", "etc/pki/tls/certs/ca-bundle.crt", "etc/ssl/cert.pem")
PROXY_CA_FILE = "etc/ssl/certs/sandgate-proxy.crt"
# The system trust of images built FROM sandgate/base (sandbox-images/build.py)
BASE_SYSTEM_CA = "usr/share/sandgate/system-ca.crt"
# AWS_CA_BUNDLE: boto3 and the AWS CLI trust their own bundle unless told (vault/sigv4.py re-signs).
CA_BUNDLE_VARS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE", "AWS_CA_BUNDLE")
# The file execd reads KEY=VALUE lines from for every command (EXECD_ENVS; the SDK's set_env
# appends to it). A warm-pool sandbox gets its request's env here when it is claimed.
EXECD_ENV_FILE = "etc/sandgate-execd.env"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The sandbox's stub resolver waits longer than the proxy's own upstream timeout (2 s), so a slow
# upstream reaches the sandbox as the proxy's answer (or its SERVFAIL), not as a stub timeout
# whose retry queues behind the first query (the proxy answers one client socket in order).
RESOLVER_OPTIONS = ("timeout:3", "attempts:2")
# Every local sandbox's hostname, answered by its own /etc/hosts: a lookup of it (Python's
# getfqdn, pip, git) never becomes a DNS query, and the host's /etc/hosts (its name, its LAN's
# names) is not what a sandbox reads.
SANDBOX_HOSTNAME = "sandbox"
SANDBOX_HOSTS = (
    f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{SANDBOX_HOSTNAME}\n"
)


def env_file_value(value: str) -> str:
    """A double-quoted value as execd's env file reader unquotes it (\\ \" \n \r \t)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    quoted = '"' + "".join(escapes.get(char, char) for char in value) + '"'
    if len(quoted.splitlines()) != 1:
        raise ValueError(f"env value {value[:40]!r} has a line separator the env file cannot carry")
    return quoted


def image_env(image: Image) -> dict[str, str]:
    env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
    env.update(entry.split("=", 1) for entry in image.env if "=" in entry)  # type: ignore[misc]
    return env


def install_ca(root_fd: int, ca: bytes) -> dict[str, str]:
    """Add the proxy CA to every CA bundle the image has; returns the variables that point at it.
    An image built FROM sandgate/base has none yet: its bundle paths link to the /run file its
    entry script writes from `BASE_SYSTEM_CA` on Docker, so here that trust goes in first."""
    write_file(root_fd, PROXY_CA_FILE, ca)
    found = [path for path in CA_BUNDLES if read_file(root_fd, path) is not None]
    for path in found or [CA_BUNDLES[0]]:
        existing = read_file(root_fd, path if found else BASE_SYSTEM_CA) or b""
        write_file(root_fd, path, existing.rstrip(b"\n") + b"\n" + ca if existing else ca)
    env = dict.fromkeys(CA_BUNDLE_VARS, "/" + (found or CA_BUNDLES)[0])
    env["NODE_EXTRA_CA_CERTS"] = "/" + PROXY_CA_FILE
    return env


def ensure_dir(root_fd: int, relative: str) -> int:
    """An O_PATH fd of the directory `relative` inside the root, created (0755) when missing."""
    try:
        return open_in_root(root_fd, relative or ".", os.O_PATH | os.O_DIRECTORY)
    except FileNotFoundError:
        parent_fd = ensure_dir(root_fd, os.path.dirname(relative))
        try:
            os.mkdir(os.path.basename(relative), 0o755, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
        return open_in_root(root_fd, relative, os.O_PATH | os.O_DIRECTORY)


def write_file(root_fd: int, relative: str, data: bytes) -> None:
    """Replace a file inside the root; a symlink in its place is replaced, never followed."""
    parent_fd = ensure_dir(root_fd, os.path.dirname(relative))
    name = os.path.basename(relative)
    try:
        try:
            if stat.S_ISLNK(os.lstat(name, dir_fd=parent_fd).st_mode):
                os.unlink(name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=parent_fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    finally:
        os.close(parent_fd)


def read_file(root_fd: int, relative: str) -> bytes | None:
    try:
        fd = open_in_root(root_fd, relative, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read()

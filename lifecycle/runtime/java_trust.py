"""Java's truststore with the proxy CA in it, for the JDKs a sandbox has.

Rules:
1. Java reads neither SSL_CERT_FILE nor a PEM bundle: it trusts a keystore, `cacerts`. Where a
   sandbox root holds one at a place a JDK reads (`KEYSTORES`: Debian's
   /etc/ssl/certs/java/cacerts, which every Debian JDK's lib/security/cacerts links to, and
   `$JAVA_HOME/lib/security/cacerts` of the image's env), it is replaced by a copy that also
   holds the proxy CA (alias `sandgate-proxy`). Paths are read and written through
   sandbox_root.py (inside the root, symlinks never followed out of it).
2. The copy is made by the host's keytool (the JDK's own keystore writer), once per
   (keystore, CA) pair, and cached under `cache_dir` by their digest: a create then pays a file
   write, not a JVM start.
3. Without keytool on the host, or when keytool refuses (a keystore it cannot read, a CA that is
   not a certificate), a root's keystores are left as they are and the server logs why, once
   per pair (the refusal is cached as the unchanged keystore): Java inside then trusts only its
   own roots, and TLS the proxy intercepts fails there. The create itself goes on.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from sandgate.lifecycle.runtime.sandbox_root import read_file, write_file

log = logging.getLogger(__name__)

DEBIAN_KEYSTORE = "etc/ssl/certs/java/cacerts"
PROXY_ALIAS = "sandgate-proxy"
STORE_PASSWORD = "changeit"  # every JDK's cacerts password, public by convention (not a secret)


def keystores(env: dict[str, str]) -> list[str]:
    """Where a root's JDKs read their trust (relative to the root), rule 1."""
    java_home = env.get("JAVA_HOME", "").strip("/")
    return [DEBIAN_KEYSTORE, *([f"{java_home}/lib/security/cacerts"] if java_home else [])]


class JavaTrust:
    def __init__(self, cache_dir: Path, keytool: str | None = None) -> None:
        self.cache_dir = cache_dir
        self.keytool = keytool or shutil.which("keytool")
        self._lock = threading.Lock()
        self._warned = False

    def install(self, root_fd: int, ca: bytes, env: dict[str, str]) -> None:
        """Add the proxy CA to every keystore of the root (rule 1)."""
        for relative in keystores(env):
            keystore = read_file(root_fd, relative)
            if keystore is not None:
                write_file(root_fd, relative, self.with_ca(keystore, ca))

    def with_ca(self, keystore: bytes, ca: bytes) -> bytes:
        """`keystore` with the proxy CA added, from the cache or made by keytool (rule 2)."""
        keytool = self.keytool
        if keytool is None:
            if not self._warned:
                log.warning("no keytool on this host: Java in sandboxes will not trust the proxy CA")
                self._warned = True
            return keystore
        cached = self.cache_dir / f"cacerts-{hashlib.sha256(keystore + b'\0' + ca).hexdigest()[:24]}"
        with self._lock:
            if not cached.exists():
                self._make(keytool, keystore, ca, cached)
        return cached.read_bytes()

    def _make(self, keytool: str, keystore: bytes, ca: bytes, target: Path) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache_dir) as work:
            store, pem = Path(work, "cacerts"), Path(work, "proxy-ca.pem")
            store.write_bytes(keystore)
            pem.write_bytes(ca)
            argv = [keytool, "-importcert", "-noprompt", "-alias", PROXY_ALIAS, "-file", str(pem)]
            argv += ["-keystore", str(store), "-storepass", STORE_PASSWORD]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                log.warning(
                    "cannot add the proxy CA to a Java keystore with %s, so Java in sandboxes will not "
                    "trust it: %s",
                    keytool,
                    (done.stdout + done.stderr).strip()[-500:],
                )
                store.write_bytes(keystore)
            os.replace(store, target)

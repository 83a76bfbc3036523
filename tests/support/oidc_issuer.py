"""A real OIDC issuer for tests: discovery and JWKS over HTTP on loopback, tokens signed with
joserfc (Authlib's JOSE library), its keys rotatable.

    with oidc_issuer() as issuer:
        token = issuer.token(sub="ci", tenant="gamma", role="operator")
        issuer.rotate()                       # a new signing key (new kid); the old stays listed

Every request it serves is appended to `issuer.served` (the path), so a test sees when the
server under test fetched the key set. `oidc_issuer(tls=workdir)` serves HTTPS instead, with a
certificate for 127.0.0.1 of a test CA made there (`issuer.ca`, tests/support/internet.py's).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.jwk import RSAKey

from tests.support.internet import make_test_ca

AUDIENCE = "sandgate"


class Issuer:
    def __init__(self, server: ThreadingHTTPServer, ca: Path | None = None) -> None:
        self.server = server
        self.ca = ca
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{server.server_address[1]}"
        self.keys: list[RSAKey] = []
        self.served: list[str] = []
        self.rotate()

    def rotate(self) -> RSAKey:
        """A new signing key, listed in the JWKS beside the earlier ones."""
        key = RSAKey.generate_key(2048, parameters={"kid": f"key-{len(self.keys) + 1}"})
        self.keys.append(key)
        return key

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.as_dict(private=False) for key in self.keys]}

    def token(self, key: RSAKey | None = None, lifetime: float = 600, **claims: Any) -> str:
        """A token of this issuer for `sandgate` (claims given override the defaults)."""
        key = key or self.keys[-1]
        now = int(time.time())
        body = {"iss": self.url, "aud": AUDIENCE, "iat": now, "exp": now + int(lifetime), **claims}
        return jwt.encode({"alg": "RS256", "kid": key.kid}, body, key)


@contextlib.contextmanager
def oidc_issuer(tls: Path | None = None) -> Iterator[Issuer]:
    issuer: Issuer | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert issuer is not None
            issuer.served.append(self.path)
            if self.path == "/.well-known/openid-configuration":
                body = {
                    "issuer": issuer.url,
                    "jwks_uri": f"{issuer.url}/jwks",
                    "id_token_signing_alg_values_supported": ["RS256"],
                }
            elif self.path == "/jwks":
                body = issuer.jwks()
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ca = None
    if tls is not None:
        ca, _ca_key, leaf, leaf_key = make_test_ca(tls, addresses=("127.0.0.1",))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(leaf, leaf_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    issuer = Issuer(server, ca)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)

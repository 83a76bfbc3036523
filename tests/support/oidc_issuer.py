"""A real OIDC issuer for tests: discovery and JWKS over HTTP on loopback, tokens signed with
joserfc (Authlib's JOSE library), its keys rotatable.

    with oidc_issuer() as issuer:
        token = issuer.token(sub="ci", tenant="gamma", role="operator")
        issuer.rotate()                       # a new signing key (new kid); the old stays listed

Every request it serves is appended to `issuer.served` (the path), so a test sees when the
server under test fetched the key set.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from joserfc import jwt
from joserfc.jwk import RSAKey

AUDIENCE = "sandgate"


class Issuer:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
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
def oidc_issuer() -> Iterator[Issuer]:
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
    issuer = Issuer(server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)

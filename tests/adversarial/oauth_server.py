"""A real OAuth2 authorization server and a protected API, on Authlib's server side (Flask), run
by tests/adversarial/test_minted_tokens.py in a namespace of its own (HTTPS with the test CA).

    python oauth_server.py WORKDIR ADDRESS

WORKDIR holds config.json (clients, public keys, the expired refresh token), leaf.pem and
leaf-key.pem; the server writes `ready` when it listens and appends every token it issues and
every API call it serves to log.jsonl. `expires_in` (a file, seconds) sets new tokens' lifetime;
`revoked` (a file) makes every token issued so far invalid.

    POST /token                                    client_credentials, refresh_token, jwt-bearer
    POST /app/installations/<id>/access_tokens     GitHub App style: Bearer <app JWT> -> token
    POST /token-500, /token-garbage, /token-slow   a failing, a garbage and a slow endpoint
    ANY  /<anything>                               the protected API: 200 {"client", "scope",
                                                   "authorization"} for a valid bearer token
                                                   (the header is echoed: the scrubber's job);
                                                   .../admin-revoke revokes every token issued so
                                                   far
"""

from __future__ import annotations

import json
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

WORKDIR = Path(sys.argv[1]) if __name__ == "__main__" else Path()


def build_app(workdir: Path) -> Any:
    from authlib.integrations.flask_oauth2 import AuthorizationServer, ResourceProtector
    from authlib.oauth2 import OAuth2Error
    from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin, grants
    from authlib.oauth2.rfc6750 import BearerTokenGenerator, BearerTokenValidator
    from authlib.oauth2.rfc7523 import JWTBearerGrant
    from flask import Flask, jsonify, request
    from joserfc import jwt
    from joserfc.jwk import RSAKey

    config = json.loads((workdir / "config.json").read_text())
    tokens: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def log(entry: dict[str, Any]) -> None:
        with lock, (workdir / "log.jsonl").open("a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def lifetime() -> int:
        path = workdir / "expires_in"
        return int(path.read_text()) if path.exists() else 3600

    class Client(ClientMixin):
        def __init__(self, client_id: str, spec: dict[str, Any]) -> None:
            self.client_id, self.spec = client_id, spec

        def get_client_id(self) -> str:
            return self.client_id

        def get_default_redirect_uri(self) -> None:
            return None

        def get_allowed_scope(self, scope: str | None) -> str:
            allowed = self.spec.get("scopes", [])
            return " ".join(s for s in (scope or "").split() if s in allowed)

        def check_redirect_uri(self, redirect_uri: str) -> bool:
            return False

        def check_client_secret(self, client_secret: str) -> bool:
            return secrets.compare_digest(client_secret, self.spec.get("secret", ""))

        def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
            return method == "client_secret_basic"

        def check_response_type(self, response_type: str) -> bool:
            return False

        def check_grant_type(self, grant_type: str) -> bool:
            return grant_type in self.spec["grants"]

    class Token(TokenMixin):
        def __init__(self, record: dict[str, Any]) -> None:
            self.record = record

        def check_client(self, client: Any) -> bool:
            return bool(client.get_client_id() == self.record["client"])

        def get_scope(self) -> str:
            return str(self.record.get("scope") or "")

        def get_expires_in(self) -> int:
            return int(self.record["expires_at"] - self.record["issued_at"])

        def is_expired(self) -> bool:
            return time.time() >= self.record["expires_at"]

        def is_revoked(self) -> bool:
            revoked = workdir / "revoked"
            return revoked.exists() and self.record["issued_at"] <= revoked.stat().st_mtime

    def query_client(client_id: str) -> Client | None:
        spec = config["clients"].get(client_id)
        return Client(client_id, spec) if spec else None

    def save_token(token: dict[str, Any], req: Any) -> None:
        now = time.time()
        record = {
            "client": req.client.get_client_id(),
            "scope": token.get("scope"),
            "issued_at": now,
            "expires_at": now + token["expires_in"],
        }
        with lock:
            tokens[token["access_token"]] = record
        log(
            {
                "event": "issued",
                "grant": req.grant_type,
                "client": record["client"],
                "token": token["access_token"],
            }
        )

    class RefreshGrant(grants.RefreshTokenGrant):
        def authenticate_refresh_token(self, refresh_token: str) -> Any:
            spec = config["refresh_tokens"].get(refresh_token)
            if spec is None or spec.get("expired"):
                return None  # Authlib answers invalid_grant
            return Token(
                {"client": spec["client"], "scope": spec["scope"], "issued_at": 0, "expires_at": 1e12}
            )

        def authenticate_user(self, credential: Any) -> Any:
            return {"user": "refresh"}

        def revoke_old_credential(self, credential: Any) -> None:
            pass  # the refresh token is not rotated

    class JWTGrant(JWTBearerGrant):
        def resolve_issuer_client(self, issuer: str) -> Client | None:
            return query_client(issuer)

        def resolve_client_public_key(self, client: Client) -> Any:
            return RSAKey.import_key(client.spec["public_key"])

        def authenticate_user(self, subject: str) -> Any:
            return {"user": subject}

        def has_granted_permission(self, client: Any, user: Any) -> bool:
            return True

        def get_audiences(self) -> list[str]:
            return [config["token_url"]]

    app = Flask(__name__)
    server = AuthorizationServer(app, query_client=query_client, save_token=save_token)
    generator = BearerTokenGenerator(
        lambda *args, **kwargs: "at-" + secrets.token_urlsafe(24), expires_generator=lambda *args: lifetime()
    )
    server.register_token_generator("default", generator)
    server.register_grant(grants.ClientCredentialsGrant)
    server.register_grant(RefreshGrant)
    server.register_grant(JWTGrant)

    class Validator(BearerTokenValidator):
        def authenticate_token(self, token_string: str) -> Token | None:
            record = tokens.get(token_string)
            return Token(record) if record else None

    require_oauth = ResourceProtector()
    require_oauth.register_token_validator(Validator())

    @app.post("/token")
    def token() -> Any:
        return server.create_token_response()

    @app.post("/app/installations/<installation>/access_tokens")
    def installation_token(installation: str) -> Any:
        app_jwt = request.headers.get("Authorization", "").removeprefix("Bearer ")
        try:
            claims = jwt.decode(app_jwt, RSAKey.import_key(config["github_app"]["public_key"])).claims
        except Exception as exc:
            return jsonify({"message": f"A JSON web token could not be decoded ({type(exc).__name__})"}), 401
        if claims.get("iss") != config["github_app"]["app_id"] or claims.get("exp", 0) < time.time():
            return jsonify(
                {"message": "'Expiration time' claim ('exp') is too far in the future or past"}
            ), 401
        now = time.time()
        value = "ghs_" + secrets.token_urlsafe(24)
        with lock:
            tokens[value] = {
                "client": f"app-{installation}",
                "scope": "",
                "issued_at": now,
                "expires_at": now + lifetime(),
            }
        log({"event": "issued", "grant": "github_app", "client": f"app-{installation}", "token": value})
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + lifetime()))
        return jsonify({"token": value, "expires_at": expires}), 201

    @app.post("/token-500")
    def token_500() -> Any:
        return "upstream exploded", 500

    @app.post("/token-garbage")
    def token_garbage() -> Any:
        return "<html>this is not a token</html>", 200

    @app.post("/token-slow")
    def token_slow() -> Any:
        time.sleep(5)
        return jsonify({"access_token": "too-late", "token_type": "Bearer"})

    @app.route("/<path:anything>", methods=["GET", "POST"])
    def api(anything: str) -> Any:
        header = request.headers.get("Authorization", "")
        try:
            token = require_oauth.acquire_token()  # Authlib: present, known, not expired or revoked
        except OAuth2Error as exc:
            log(
                {
                    "event": "api",
                    "path": "/" + anything,
                    "valid": False,
                    "token": header.removeprefix("Bearer "),
                }
            )
            return jsonify({"error": exc.error}), 401
        log({"event": "api", "path": "/" + anything, "valid": True, "token": header.removeprefix("Bearer ")})
        if anything.endswith("/admin-revoke"):  # the API revokes every token issued so far
            (workdir / "revoked").touch()
        return jsonify(
            {"client": token.record["client"], "scope": token.record["scope"], "authorization": header}
        )

    return app


def main() -> None:
    from werkzeug.serving import make_server

    tls = (str(WORKDIR / "leaf.pem"), str(WORKDIR / "leaf-key.pem"))
    server = make_server(sys.argv[2], 443, build_app(WORKDIR), threaded=True, ssl_context=tls)
    (WORKDIR / "ready").touch()
    server.serve_forever()


if __name__ == "__main__":
    main()

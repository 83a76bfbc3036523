"""Minted tokens: what the proxy sends to a token endpoint, and what it accepts back.

Rules:
1. Pure: a grant's token request is built here from the binding's `oauth2` auth and the vault's
   values (`reveal`); the proxy sends it (`proxy/minting.py`) and hands the answer back to
   `parse_token`. No I/O, no clock but the `now` passed in.
2. One builder per grant (GRANTS), on Authlib's client side: `prepare_token_request` for the
   form, `ClientAuth` for client_secret_basic, `JWTBearerGrant.sign` for RFC 7523 assertions
   (Google service-account style: iss, sub, aud, scope claims), and a GitHub App JWT (iss = the
   App id, at most 10 minutes) for an installation's `access_tokens` URL.
3. Failures are `MintError`s whose message says what went wrong and what to fix, and never holds
   a value: not the client secret, the refresh token, the key, the assertion, nor a token.
   Text from the token endpoint (`error`, `error_description`) is kept short and printable;
   the proxy redacts it with every secret it knows before it is shown or written.
4. A token without a lifetime is used for DEFAULT_LIFETIME seconds, then minted again.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from authlib.oauth2.auth import ClientAuth
from authlib.oauth2.rfc6749.parameters import prepare_token_request
from authlib.oauth2.rfc7523 import JWTBearerGrant
from joserfc import jwt
from joserfc.jwk import RSAKey

from sandgate.policy import OAuth2Auth
from sandgate.vault.errors import VaultError

Reveal = Callable[[str], str]
DEFAULT_LIFETIME = 300.0
ASSERTION_LIFETIME = 3600
GITHUB_JWT_LIFETIME = 540  # GitHub allows at most 10 minutes; clocks drift
ENDPOINT_TEXT = 200  # characters of the endpoint's own error text that are kept


class MintError(VaultError):
    """A token could not be minted; the message says why (never a value)."""


@dataclass(frozen=True, repr=False)
class TokenRequest:
    """A POST to the token endpoint: url, headers and form body (holds secrets: never printed)."""

    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def __repr__(self) -> str:
        return f"TokenRequest({self.url!r}, {len(self.body)} bytes)"


@dataclass(frozen=True, repr=False)
class Minted:
    """A token and when it stops being used (a Unix time)."""

    token: str
    expires_at: float
    scopes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Minted(expires_at={self.expires_at}, scopes={list(self.scopes)})"


def minted_name(auth: OAuth2Auth) -> str:
    """The name a minted token is known under (one per binding configuration; never a vault
    entry name, which cannot contain `/`)."""
    digest = hashlib.sha256(auth.model_dump_json().encode()).hexdigest()[:24]
    return f"minted/{auth.grant}/{digest}"


def token_request(auth: OAuth2Auth, reveal: Reveal, now: float | None = None) -> TokenRequest:
    """The request that mints a token for `auth` (MintError if a secret does not fit)."""
    return GRANTS[auth.grant](auth, reveal, time.time() if now is None else now)


def parse_token(auth: OAuth2Auth, status: int, body: bytes, now: float | None = None) -> Minted:
    """The token in a token endpoint's answer, or MintError saying what was wrong with it."""
    now = time.time() if now is None else now
    answer = _json_object(status, body)
    if status not in (200, 201) or "error" in answer:
        error = _text(answer.get("error") or answer.get("message") or "no error code")
        described = _text(answer.get("error_description", ""))
        raise MintError(
            f"token endpoint refused the {auth.grant} grant (HTTP {status}): {error}"
            + (f" ({described})" if described else "")
        )
    token = answer.get("token" if auth.grant == "github_app" else "access_token")
    if not isinstance(token, str) or not token.strip() or any(c in token for c in "\r\n\0 "):
        raise MintError(f"token endpoint answered HTTP {status} without a usable access token")
    token_type = answer.get("token_type", "bearer")
    if auth.grant != "github_app" and str(token_type).lower() != "bearer":
        raise MintError(f"token endpoint issued a {_text(token_type)!r} token; only bearer tokens are sent")
    granted = _granted_scopes(answer, auth)
    return Minted(token, _expiry(answer, now), granted)


# -- one builder per grant ------------------------------------------------------------------


def _client_credentials(auth: OAuth2Auth, reveal: Reveal, now: float) -> TokenRequest:
    body = prepare_token_request("client_credentials", scope=_scope(auth))
    return _with_client_auth(auth, reveal, body)


def _refresh_token(auth: OAuth2Auth, reveal: Reveal, now: float) -> TokenRequest:
    assert auth.refreshToken is not None  # the model requires it for this grant
    body = prepare_token_request("refresh_token", refresh_token=reveal(auth.refreshToken), scope=_scope(auth))
    return _with_client_auth(auth, reveal, body)


def _jwt_bearer(auth: OAuth2Auth, reveal: Reveal, now: float) -> TokenRequest:
    claims = {"scope": _scope(auth)} if auth.scopes else {}
    assertion = JWTBearerGrant.sign(
        _private_key(auth, reveal),
        issuer=auth.issuer,
        audience=auth.audience or auth.tokenUrl,
        subject=auth.subject,
        issued_at=int(now),
        expires_at=int(now) + ASSERTION_LIFETIME,
        claims=claims,
        header={"alg": "RS256"},
    )
    assertion_text = assertion.decode() if isinstance(assertion, bytes) else assertion
    body = prepare_token_request(JWTBearerGrant.GRANT_TYPE, assertion=assertion_text)
    return _form(auth.tokenUrl, body)


def _github_app(auth: OAuth2Auth, reveal: Reveal, now: float) -> TokenRequest:
    claims = {"iat": int(now) - 60, "exp": int(now) + GITHUB_JWT_LIFETIME, "iss": auth.issuer}
    app_jwt = jwt.encode({"alg": "RS256"}, claims, _private_key(auth, reveal))
    body = b"{}"  # the installation's own permissions and repositories
    headers = (
        ("Authorization", f"Bearer {app_jwt}"),
        ("Accept", "application/vnd.github+json"),
        ("Content-Type", "application/json"),
    )
    return TokenRequest(auth.tokenUrl, headers, body)


GRANTS: Mapping[str, Callable[[OAuth2Auth, Reveal, float], TokenRequest]] = {
    "client_credentials": _client_credentials,
    "refresh_token": _refresh_token,
    "jwt_bearer": _jwt_bearer,
    "github_app": _github_app,
}


# -- helpers ----------------------------------------------------------------------------------


def _scope(auth: OAuth2Auth) -> str | None:
    return " ".join(auth.scopes) or None


def _with_client_auth(auth: OAuth2Auth, reveal: Reveal, body: str) -> TokenRequest:
    """client_secret_basic with a secret; else the public client's id in the form."""
    if auth.clientSecret is None:
        return _form(auth.tokenUrl, f"{body}&{urlencode({'client_id': auth.clientId})}")
    client = ClientAuth(auth.clientId, reveal(auth.clientSecret), "client_secret_basic")
    url, headers, signed_body = client.prepare("POST", auth.tokenUrl, _form_headers(), body)
    return TokenRequest(url, tuple(headers.items()), signed_body.encode())


def _form(url: str, body: str) -> TokenRequest:
    return TokenRequest(url, tuple(_form_headers().items()), body.encode())


def _form_headers() -> dict[str, str]:
    return {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}


def _private_key(auth: OAuth2Auth, reveal: Reveal) -> RSAKey:
    assert auth.privateKey is not None  # the model requires it for this grant
    try:
        return RSAKey.import_key(reveal(auth.privateKey))
    except (ValueError, TypeError) as exc:
        raise MintError(
            f"vault entry {auth.privateKey!r} is not an RSA private key in PEM ({type(exc).__name__}); "
            f"store the key file again (`sandgate vault put {auth.privateKey} < key.pem`)"
        ) from None


def _json_object(status: int, body: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        answer = None
    if not isinstance(answer, dict):
        raise MintError(
            f"token endpoint answered HTTP {status} with {len(body)} bytes that are not a JSON object"
        )
    return answer


def _expiry(answer: Mapping[str, Any], now: float) -> float:
    expires_in = answer.get("expires_in")
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and expires_in > 0:
        return now + float(expires_in)
    expires_at = answer.get("expires_at")  # GitHub: ISO 8601
    if isinstance(expires_at, str):
        try:
            return datetime.datetime.fromisoformat(expires_at.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise MintError(f"token endpoint's expires_at {_text(expires_at)!r} is not a time") from None
    return now + DEFAULT_LIFETIME


def _granted_scopes(answer: Mapping[str, Any], auth: OAuth2Auth) -> tuple[str, ...]:
    """The scopes granted (the requested ones when the answer names none, RFC 6749 5.1); all
    requested scopes must be among them."""
    if auth.grant == "github_app" or "scope" not in answer:
        return tuple(auth.scopes)
    granted = tuple(str(answer["scope"]).split())
    missing = [scope for scope in auth.scopes if scope not in granted]
    if missing:
        raise MintError(
            f"token endpoint granted scopes {_text(' '.join(granted)) or '(none)'!r}, "
            f"without {' '.join(missing)!r} the binding asks for"
        )
    return granted


def _text(value: Any) -> str:
    """The endpoint's own words, short and printable."""
    text = str(value)
    return "".join(c if c.isprintable() else "?" for c in text[:ENDPOINT_TEXT])


def token_host(auth: OAuth2Auth) -> tuple[str, int]:
    """The token endpoint's host name and port."""
    parts = urlsplit(auth.tokenUrl)
    return (parts.hostname or ""), (parts.port or 443)

"""OIDC bearer tokens as principals: a JWT of the configured issuer, verified with Authlib's JOSE
library (joserfc: `authlib.jose` is deprecated in its favour).

Rules:
1. A token is taken only when its signature verifies against the issuer's JWKS (found through
   its discovery document, `<issuer>/.well-known/openid-configuration`, fetched over TLS checked
   with `oidc_ca` or certifi), its `iss` is the issuer, its `aud` names `oidc_audience`, and its
   `exp` (required) has not passed (30 s leeway for clocks); asymmetric algorithms only (RS*,
   ES*, PS*, EdDSA): an HS256 token signed with a public key as its secret is refused.
2. Its claims map to the principal: `sub` is the id, `oidc_tenant_claim` the tenant,
   `oidc_role_claim` the role (one of lifecycle/principals.py's); a token without them, or with a
   role sandgate does not have, is refused. Its `exp` ends whatever it has open (api/auth.py).
3. The key set is cached; a token signed with a key id the cache lacks refetches it, at most once
   every `REFETCH_S` (an issuer's key rotation is seen within seconds, a flood of made-up key ids
   costs one fetch per interval).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jwt import JWTClaimsRegistry

from sandgate.lifecycle.keys import TENANT_FORMAT
from sandgate.lifecycle.principals import ROLES, Principal

ALGORITHMS = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
LEEWAY_S = 30
REFETCH_S = 5.0
log = logging.getLogger(__name__)


@dataclass
class OidcVerifier:
    issuer: str
    audience: str
    tenant_claim: str = "tenant"
    role_claim: str = "role"
    ca: Path | None = None
    _keys: KeySet | None = field(default=None, repr=False)
    _fetched_at: float = field(default=-REFETCH_S, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def principal(self, token: str) -> tuple[Principal, datetime] | None:
        """The principal a valid token names and when it expires; None for any other token."""
        claims = self._claims(token)
        if claims is None:
            return None
        subject, tenant, role = claims.get("sub"), claims.get(self.tenant_claim), claims.get(self.role_claim)
        if not (
            isinstance(subject, str) and subject and isinstance(tenant, str) and TENANT_FORMAT.match(tenant)
        ):
            return None
        if role not in ROLES:
            return None
        expires = datetime.fromtimestamp(int(claims["exp"]), UTC)
        return Principal(id=subject, tenant=tenant, role=role, via="oidc"), expires

    def _claims(self, token: str) -> dict[str, Any] | None:
        registry = JWTClaimsRegistry(
            leeway=LEEWAY_S,
            iss={"essential": True, "value": self.issuer},
            aud={"essential": True, "value": self.audience},
            exp={"essential": True},
            sub={"essential": True},
        )
        for refetch in (False, True):
            keys = self._key_set(refetch)
            if keys is None:
                return None
            try:
                claims: dict[str, Any] = jwt.decode(token, keys, algorithms=ALGORITHMS).claims
                registry.validate(claims)
            except InvalidKeyIdError:
                if not refetch:
                    continue  # a key id the cached set lacks: the issuer may have rotated its keys
                return None
            except (JoseError, ValueError) as exc:
                log.info("OIDC token refused: %s", exc)
                return None
            return claims
        return None

    def _key_set(self, refetch: bool) -> KeySet | None:
        with self._guard:
            stale = self._keys is None or (refetch and time.monotonic() - self._fetched_at >= REFETCH_S)
            if stale:
                try:
                    self._keys = KeySet.import_key_set(self._fetch_jwks())  # type: ignore[arg-type]
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    log.warning("OIDC issuer %s: its key set could not be fetched: %s", self.issuer, exc)
                self._fetched_at = time.monotonic()
            return self._keys

    def _fetch_jwks(self) -> dict[str, Any]:
        verify: Any = str(self.ca) if self.ca else True
        with httpx.Client(timeout=10, verify=verify, trust_env=False) as http:
            discovery = http.get(self.issuer.rstrip("/") + "/.well-known/openid-configuration")
            discovery.raise_for_status()
            jwks = http.get(discovery.json()["jwks_uri"])
            jwks.raise_for_status()
            found: dict[str, Any] = jwks.json()
            return found

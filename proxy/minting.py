"""Minting: the proxy calls token endpoints itself, for `oauth2` bindings, and caches what it gets.

Rules:
1. Control-plane egress: the token endpoint is called by the proxy, never through a sandbox's
   policy or connection. The name is resolved by the proxy's own resolver, an always-denied
   address (loopback, metadata, private ranges) is never dialled, TLS is verified against the
   upstream trust bundle, and the endpoint gets `timeout` seconds. The caller audits each mint.
2. One token per binding configuration (`vault.oauth2.minted_name`), shared by the sandboxes
   that bind it alike; minted once at a time (a lock per name), used until REFRESH_MARGIN
   before it expires, dropped on a 401 from the API it was sent to (`forget`), so the next
   request mints again.
3. A minted token is handed to `SecretValues.remember` before `token` returns: the sandbox's
   scrubber and the audit redactor know it before the request that carries it is forwarded.
   The long-lived secrets (client secret, refresh token, key) never leave the proxy but in the
   token request itself.
4. Failures are `MintError`s with the reason, never a value; the injection hook turns them into
   a 502 for the sandbox and a denied request record for the operator.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from sandgate.policy import OAuth2Auth, denied_range
from sandgate.proxy.credentials import SecretValues
from sandgate.proxy.resolver import ResolveError, Resolver
from sandgate.vault import Minted, MintError, Reveal, minted_name, parse_token, token_request

MAX_ANSWER = 64 * 1024  # a token answer is small; more is not read
REFRESH_MARGIN = 60.0  # seconds before expiry a token is minted again (a tenth of short lifetimes)


@dataclass(frozen=True)
class Mint:
    """A usable token's bookkeeping (the value itself lives in SecretValues)."""

    minted: Minted
    generation: int
    refresh_at: float


@dataclass(frozen=True)
class MintResult:
    name: str  # the SecretValues name the token is under
    generation: int
    fresh: bool  # minted for this request
    endpoint: str  # host:port it came from


class TokenMinter:
    def __init__(self, values: SecretValues, resolver: Resolver, trust_bundle: Path | None) -> None:
        self.values = values
        self.resolver = resolver
        self.trust_bundle = trust_bundle
        self._mints: dict[str, Mint] = {}
        self._generations: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tls: ssl.SSLContext | None = None

    async def token(self, auth: OAuth2Auth, reveal: Reveal) -> MintResult:
        """A usable token for `auth`, minted now if there is none (MintError if that fails)."""
        name = minted_name(auth)
        endpoint = _endpoint(auth.tokenUrl)
        if (usable := self._usable(name)) is not None:
            return MintResult(name, usable.generation, False, endpoint)
        async with self._locks.setdefault(name, asyncio.Lock()):
            if (usable := self._usable(name)) is not None:
                return MintResult(name, usable.generation, False, endpoint)
            now = time.time()
            request = token_request(auth, reveal, now)
            status, body = await self._post(request.url, request.headers, request.body, auth.timeout)
            minted = parse_token(auth, status, body, now)
            self.values.remember(name, minted.token)  # the redactors know it from here on
            generation = self._generations.get(name, 0) + 1
            self._generations[name] = generation
            lifetime = max(minted.expires_at - now, 0.0)
            refresh_at = minted.expires_at - min(REFRESH_MARGIN, lifetime / 10)
            self._mints[name] = Mint(minted, generation, refresh_at)
            return MintResult(name, generation, True, endpoint)

    def forget(self, auth: OAuth2Auth) -> None:
        """The API refused the token (401): mint a new one for the next request."""
        self._mints.pop(minted_name(auth), None)

    def _usable(self, name: str) -> Mint | None:
        mint = self._mints.get(name)
        return mint if mint is not None and time.time() < mint.refresh_at else None

    async def _post(
        self, url: str, headers: tuple[tuple[str, str], ...], body: bytes, timeout: float
    ) -> tuple[int, bytes]:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or 443
        address = await self._address(host)
        literal = f"[{address}]" if ":" in address else address
        target = f"https://{literal}:{port}{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")
        try:
            async with (
                httpx.AsyncClient(verify=self._trust(), timeout=timeout, trust_env=False) as client,
                client.stream(
                    "POST",
                    target,
                    headers=[*headers, ("Host", parts.netloc)],
                    content=body,
                    extensions={"sni_hostname": host},
                ) as answer,
            ):
                received = b""
                async for chunk in answer.aiter_bytes():
                    received += chunk
                    if len(received) > MAX_ANSWER:
                        raise MintError(f"token endpoint {host} answered more than {MAX_ANSWER} bytes")
                return answer.status_code, received
        except httpx.TimeoutException:
            raise MintError(f"token endpoint {host}:{port} did not answer within {timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise MintError(f"token endpoint {host}:{port} unreachable ({type(exc).__name__})") from None

    async def _address(self, host: str) -> str:
        try:
            candidates = await self.resolver.addresses(host)
        except ResolveError as exc:
            raise MintError(f"token endpoint {host} does not resolve ({exc})") from None
        for candidate in candidates:
            if denied_range(ipaddress.ip_address(candidate)) is None:
                return candidate
        raise MintError(f"token endpoint {host} resolves only to always-denied addresses; not dialled")

    def _trust(self) -> ssl.SSLContext:
        if self._tls is None:
            bundle = str(self.trust_bundle) if self.trust_bundle and self.trust_bundle.exists() else None
            self._tls = ssl.create_default_context(cafile=bundle)
        return self._tls


def _endpoint(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 443}"

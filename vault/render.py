"""Rendering a binding's auth into what the proxy writes into a request.

Rules:
1. One small renderer per auth style, chosen by `auth.type` from RENDERERS (like fly.io
   tokenizer's processors): adding a style touches this table and one function.
2. Pure: a renderer gets the binding's auth (a sandgate.policy model) and a
   `reveal(credential name) -> value` function; it does no I/O of its own and knows nothing of
   mitmproxy.
3. Headers are *set*: the proxy removes any header of the same name first (OpenSandbox does the
   same). A value with CR, LF or NUL is refused: it could split the header block.
4. Placeholders (`passthrough`) are replaced in one pass per surface (longest placeholder first,
   so `PH_1` never eats `PH_10`, and a value is never searched again): header values as is,
   path and query URL-encoded, body only when the substitution lists `body`, JSON-escaped for
   JSON, form-encoded for forms, and never in multipart or compressed bodies (the skip is
   returned with its reason so the proxy can audit it).
5. Nothing here is printable with a value in it: `repr()` shows header names and placeholders.
6. A style that depends on the request itself (AWS SigV4 re-signing, `sigv4.py`) renders a
   `signer` the proxy applies to the request as it will be sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote, quote_plus

from sandgate.policy import (
    ApiKeyAuth,
    AwsSigV4Auth,
    BasicAuth,
    BearerAuth,
    Binding,
    CustomHeadersAuth,
    OAuth2Auth,
    PassthroughAuth,
)
from sandgate.vault.errors import VaultError
from sandgate.vault.oauth2 import minted_name
from sandgate.vault.sigv4 import SigV4Signer

Reveal = Callable[[str], str]
"""Credential name -> current value (the store's `reveal`, or `reveal_via`)."""
AnyAuth = (
    BearerAuth | BasicAuth | ApiKeyAuth | CustomHeadersAuth | PassthroughAuth | AwsSigV4Auth | OAuth2Auth
)

SURFACES = ("header", "query", "path", "body")
DEFAULT_SURFACES = ("header", "query")
_UNSAFE_IN_HEADER = re.compile(r"[\r\n\0]")


# -- what a renderer produces ---------------------------------------------------------------


@dataclass(frozen=True)
class BodyResult:
    """A request body after substitution; `skipped` says why it was left alone, if it was."""

    body: bytes
    replaced: int = 0
    skipped: str | None = None

    def __repr__(self) -> str:
        return f"BodyResult({len(self.body)} bytes, replaced={self.replaced}, skipped={self.skipped!r})"


@dataclass(frozen=True, repr=False)
class _Resolved:
    placeholder: str
    value: str
    surfaces: frozenset[str]


class Placeholders:
    """Resolved placeholder substitutions, applied per surface in one pass each."""

    def __init__(self, resolved: Sequence[_Resolved] = ()) -> None:
        self._resolved = tuple(resolved)
        self._patterns = {surface: _pattern(self._resolved, surface) for surface in SURFACES}

    def __bool__(self) -> bool:
        return bool(self._resolved)

    def __repr__(self) -> str:
        shown = ", ".join(f"{r.placeholder!r} in {sorted(r.surfaces)}" for r in self._resolved)
        return f"Placeholders({shown})"

    def header(self, value: str) -> str:
        return self._replace("header", value, lambda v: v)[0]

    def path(self, path: str) -> str:
        return self._replace("path", path, _url_component)[0]

    def query(self, query: str) -> str:
        return self._replace("query", query, _url_component)[0]

    def target(self, target: str) -> str:
        """A request target `path?query`: path and query substituted by their own rules."""
        path, mark, query = target.partition("?")
        return self.path(path) + mark + self.query(query)

    def body(self, body: bytes, content_type: str | None, content_encoding: str | None = None) -> BodyResult:
        if self._patterns["body"] is None or not body:
            return BodyResult(body)
        encoding = (content_encoding or "").strip().lower()
        if encoding not in ("", "identity"):
            return BodyResult(
                body, skipped=f"compressed body (Content-Encoding: {encoding}) is not substituted"
            )
        media_type = (content_type or "").split(";", 1)[0].strip().lower()
        if media_type.startswith("multipart/"):
            return BodyResult(body, skipped=f"multipart body ({media_type}) is not substituted")
        text = body.decode("utf-8", errors="surrogateescape")
        substituted, count = self._replace("body", text, _body_encoder(media_type))
        return BodyResult(substituted.encode("utf-8", errors="surrogateescape"), replaced=count)

    def _replace(self, surface: str, text: str, encode: Callable[[str], str]) -> tuple[str, int]:
        pattern = self._patterns[surface]
        if pattern is None:
            return text, 0
        values = {r.placeholder: encode(r.value) for r in self._resolved if surface in r.surfaces}
        return pattern.subn(lambda match: values[match.group(0)], text)


@dataclass(frozen=True, repr=False)
class Injection:
    """What one binding adds to a request: headers to set, placeholders to replace, or a signer
    that signs the request as it will be sent."""

    binding: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    placeholders: Placeholders = field(default_factory=Placeholders)
    signer: SigV4Signer | None = None

    def __repr__(self) -> str:
        names = [name for name, _ in self.headers]
        return (
            f"Injection(binding={self.binding!r}, headers={names}, placeholders={self.placeholders!r}, "
            f"signer={self.signer!r})"
        )


# -- one renderer per auth style --------------------------------------------------------------


def _bearer(auth: BearerAuth, reveal: Reveal) -> Injection:
    return Injection(headers=(("Authorization", "Bearer " + _header_safe(auth.credential, reveal)),))


def _basic(auth: BasicAuth, reveal: Reveal) -> Injection:
    # OpenSandbox semantics: the stored value is already base64(user:pass).
    return Injection(headers=(("Authorization", "Basic " + _header_safe(auth.credential, reveal)),))


def _api_key(auth: ApiKeyAuth, reveal: Reveal) -> Injection:
    return Injection(headers=((auth.name, _header_safe(auth.credential, reveal)),))


def _custom_headers(auth: CustomHeadersAuth, reveal: Reveal) -> Injection:
    return Injection(headers=tuple((h.name, _header_safe(h.credential, reveal)) for h in auth.headers))


def _passthrough(auth: PassthroughAuth, reveal: Reveal) -> Injection:
    resolved = []
    for substitution in auth.substitutions:
        surfaces = frozenset(substitution.in_ or DEFAULT_SURFACES)
        value = (
            _header_safe(substitution.credential, reveal)
            if "header" in surfaces
            else reveal(substitution.credential)
        )
        resolved.append(_Resolved(substitution.placeholder, value, surfaces))
    return Injection(placeholders=Placeholders(resolved))


def _aws_sigv4(auth: AwsSigV4Auth, reveal: Reveal) -> Injection:
    signer = SigV4Signer(
        binding="",
        placeholder=auth.placeholderAccessKeyId,
        services=frozenset(auth.services),
        regions=frozenset(auth.regions),
        access_key_id=_header_safe(auth.accessKeyId, reveal),
        secret_access_key=reveal(auth.secretAccessKey),
        session_token=_header_safe(auth.sessionToken, reveal) if auth.sessionToken else None,
    )
    return Injection(signer=signer)


def _oauth2(auth: OAuth2Auth, reveal: Reveal) -> Injection:
    # The proxy mints the token first (proxy/minting.py) and keeps it under minted_name(auth).
    return Injection(headers=(("Authorization", "Bearer " + _header_safe(minted_name(auth), reveal)),))


RENDERERS: Mapping[str, Callable[[Any, Reveal], Injection]] = {
    "bearer": _bearer,
    "basic": _basic,
    "apiKey": _api_key,
    "customHeaders": _custom_headers,
    "passthrough": _passthrough,
    "awsSigV4": _aws_sigv4,
    "oauth2": _oauth2,
}


def render_auth(auth: AnyAuth, reveal: Reveal) -> Injection:
    """The injection for one of sandgate.policy's auth models."""
    renderer = RENDERERS.get(auth.type)
    if renderer is None:
        raise VaultError(f"no renderer for auth type {auth.type!r}; known: {', '.join(RENDERERS)}")
    return renderer(auth, reveal)


def render(binding: Binding, reveal: Reveal) -> Injection:
    """The injection for a binding, tagged with the binding's name for the audit record."""
    injection = render_auth(binding.auth, reveal)
    signer = replace(injection.signer, binding=binding.name) if injection.signer else None
    return Injection(binding.name, injection.headers, injection.placeholders, signer)


def render_headers(auth: AnyAuth, reveal: Reveal) -> list[tuple[str, str]]:
    """Just the headers to set for `auth` (empty for passthrough)."""
    return list(render_auth(auth, reveal).headers)


def reveal_via(store_reveal: Reveal, names: Mapping[str, str]) -> Reveal:
    """A Reveal that maps binding credential names to vault entry names (SandboxEntry.credentials);
    names missing from `names` are looked up as they are."""
    return lambda credential: store_reveal(names.get(credential, credential))


# -- helpers ----------------------------------------------------------------------------------


def _header_safe(credential: str, reveal: Reveal) -> str:
    value = reveal(credential)
    if _UNSAFE_IN_HEADER.search(value):
        raise VaultError(
            f"credential {credential!r} contains a line break or NUL and cannot go into a header; "
            f"store it again without one (`sandgate vault put {credential}`)"
        )
    return value


def _pattern(resolved: Sequence[_Resolved], surface: str) -> re.Pattern[str] | None:
    placeholders = sorted({r.placeholder for r in resolved if surface in r.surfaces}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, placeholders))) if placeholders else None


def _url_component(value: str) -> str:
    return quote(value, safe="")


def _body_encoder(media_type: str) -> Callable[[str], str]:
    if media_type == "application/json" or media_type.endswith("+json"):
        return lambda value: json.dumps(value)[1:-1]
    if media_type == "application/x-www-form-urlencoded":
        return quote_plus
    return lambda value: value

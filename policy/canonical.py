"""The canonical request identity: the one (scheme, host, port, method, path) a request is judged,
injected and recorded by, and the request targets that are refused because origins read them two ways.

Rules of this module:
1. Pure: strings in, a `RequestIdentity` or an `AmbiguousTarget` out. No sockets, no mitmproxy.
2. It is computed once per request, from the target the client sent, before anything (credential
   injection) changes it; the policy, the injection and the audit record all read that one value.
3. The canonical path is the path as an origin serves it: percent-escapes are decoded (UTF-8), so
   `/v1/%61dmin` is `/v1/admin`; only the characters that would change the path's structure when
   decoded ('%', '/', '?', '#') stay escaped, in upper-case hex, and so do bytes that are not
   UTF-8. One path, one spelling. Rule path patterns are put in the same form.
4. Two kinds of ambiguity (see docs/policy.md, "How paths are normalized"):
   - always refused, whatever the policy: `.` and `..` segments (raw, %2E-encoded, hidden behind
     `;params` as in `..;`, or produced by decoding %2F/%5C as in `..%2F`), double encoding (an
     escape still there after one round of decoding: %252F, %%32%65), control characters
     (%00-%1F, %7F), a fragment, a target that is not origin-form. No client that resolved its
     URL sends them, and normalizing origins (nginx, Tomcat) would serve another path than the
     one judged.
   - refused only where a rule or binding checks the path (`RequestIdentity.ambiguity`): encoded
     '/' or '\\' (%2F, %5C), a raw '\\', `;` path parameters, empty segments (`//`), escapes that
     are not UTF-8. Origins disagree on them (is %2F a separator? is `/admin;x` `/admin`?), but
     APIs use some (%2F in identifiers): where no rule looks at the path they pass untouched.
"""

from __future__ import annotations

import codecs
import re
from typing import NamedTuple
from urllib.parse import unquote_to_bytes

from sandgate.policy.names import IPAddress, request_host

DEFAULT_PORTS = {"http": 80, "https": 443}

# Characters that send a path off the fast path: escapes, separators origins may add, parameters,
# fragments, control and non-ASCII characters (mitmproxy hands undecodable bytes over as
# surrogates); so do empty and dot segments (`//`, `/.`, found by `in`, faster than the regex).
_SUSPECT = re.compile(r"[%\\;#\x00-\x1f\x7f-\U0010ffff]")
_LEFT_ESCAPE = re.compile(rb"%[0-9A-Fa-f]{2}")
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_ORIGIN_SEPARATORS = re.compile(rb"[/\\]")
_KEPT_ESCAPED = ((b"%", b"%25"), (b"/", b"%2F"), (b"?", b"%3F"), (b"#", b"%23"))
_ESCAPE_INVALID_UTF8 = "sandgate-percent"


def _escape_undecodable(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeDecodeError)
    return "".join(f"%{byte:02X}" for byte in error.object[error.start : error.end]), error.end


codecs.register_error(_ESCAPE_INVALID_UTF8, _escape_undecodable)


class AmbiguousTarget(ValueError):
    """A request target that is refused (400) before any decision; the message says why and how
    to send it instead."""


class RequestIdentity(NamedTuple):
    """What a request is for, in canonical form; see the module rules. (A NamedTuple: it is built
    on every request, and builds three times faster than a frozen dataclass.)

    `ambiguity` names a form (e.g. "encoded '/' (%2F)") that is refused only where a rule or a
    binding checks the path; None for the ordinary path."""

    scheme: str
    host: str
    port: int
    method: str
    path: str
    query: str | None = None
    ambiguity: str | None = None

    @property
    def target(self) -> str:
        """The canonical path with the raw query (what the audit log shows, query redacted)."""
        return self.path if self.query is None else f"{self.path}?{self.query}"


def request_identity(
    scheme: str, host: str, port: int, method: str, target: str, absolute_authority: str | None = None
) -> RequestIdentity:
    """The identity of a request for `host:port` (the connection's agreed name and port) with this
    method and raw target (path and query, as received). `absolute_authority` is the authority of an
    HTTP/1 absolute-form target (`GET https://AUTHORITY/x`): it must name this same host and port.
    Raises AmbiguousTarget for the targets refused whatever the policy."""
    scheme = scheme.lower()
    method = method.upper()
    if absolute_authority is not None:
        check_absolute_authority(absolute_authority, scheme, host, port)
    path, query, ambiguity = canonical_target(target, method)
    return RequestIdentity(scheme, host, port, method, path, query, ambiguity)


def check_absolute_authority(authority: str, scheme: str, host: str, port: int) -> None:
    """An absolute-form target's authority must be the connection's host and port (the origin
    would route by the target, the policy judged the connection's name)."""
    named_host, named_port = _split_authority(authority)
    claimed = named_port if named_port is not None else DEFAULT_PORTS.get(scheme)
    if claimed != port or _host_key(named_host) != _host_key(host):
        raise AmbiguousTarget(
            f"absolute-form target names {authority!r}, but this connection is for {host}:{port}; "
            "send the request in origin-form (GET /path) to the host it is for"
        )


def canonical_target(target: str, method: str = "GET") -> tuple[str, str | None, str | None]:
    """(canonical path, raw query or None, ambiguity or None) of an origin-form target."""
    path, has_query, query = target.partition("?")
    if "#" in query:
        raise _fragment(target)
    if not path.startswith("/"):
        if path == "*" and method == "OPTIONS" and not has_query:
            return "*", None, None
        raise AmbiguousTarget(f"request target {_shown(target)} is not a path; it must start with '/'")
    if _SUSPECT.search(path) is None and "//" not in path and "/." not in path:
        return path, (query if has_query else None), None
    canonical, ambiguity = canonical_path(path)
    return canonical, (query if has_query else None), ambiguity


def canonical_path(path: str, partial_last: bool = False) -> tuple[str, str | None]:
    """(canonical form, ambiguity or None) of a path without query; raises AmbiguousTarget.
    `partial_last`: the last segment is the start of a longer one (a prefix pattern's `x` in `x*`)."""
    segments = path.encode("utf-8", "surrogateescape").split(b"/")[1:]
    ambiguity: str | None = None
    rendered: list[str] = []
    last = len(segments) - 1
    for index, raw in enumerate(segments):
        decoded = unquote_to_bytes(raw) if b"%" in raw else raw
        found = _segment_ambiguity(path, raw, decoded, index == last, partial_last and index == last)
        ambiguity = ambiguity or found
        for plain, escaped in _KEPT_ESCAPED:
            decoded = decoded.replace(plain, escaped)
        rendered.append(decoded.decode("utf-8", _ESCAPE_INVALID_UTF8))
    return "/" + "/".join(rendered), ambiguity


def _segment_ambiguity(path: str, raw: bytes, decoded: bytes, last: bool, partial: bool) -> str | None:
    """Raise for a segment refused always; else the form refused where the path is checked, if any."""
    if raw == b"" and not last:
        return "an empty segment ('//')"
    if b"#" in raw:
        raise _fragment(path)
    if b"%" in raw and _LEFT_ESCAPE.search(decoded):
        raise AmbiguousTarget(
            f"path {_shown(path)} is double-encoded (an escape is left after decoding once, as in %252F); "
            "encode each character once"
        )
    if _CONTROL.search(decoded):
        raise AmbiguousTarget(f"path {_shown(path)} contains a control character (%00-%1F, %7F)")
    if b"." in decoded:
        pieces = _ORIGIN_SEPARATORS.split(decoded)
        for number, piece in enumerate(pieces):
            if partial and number == len(pieces) - 1:
                break
            if piece.split(b";", 1)[0] in (b".", b".."):
                raise AmbiguousTarget(
                    f"path {_shown(path)} has a '.' or '..' segment (after decoding, or before ';'); "
                    "send the resolved path"
                )
    if b"/" in decoded:
        return "an encoded '/' (%2F)"
    if b"\\" in decoded:
        return "a '\\' (raw or %5C)"
    if b";" in decoded:
        return "a ';' path parameter"
    if not decoded.isascii() and not _is_utf8(decoded):
        return "an escape that is not UTF-8"
    return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def canonical_pattern(pattern: str) -> str:
    """A rule's path pattern in canonical form (`x*`: prefix, else exact); raises AmbiguousTarget
    if no request it could match would be let through to be matched (see the module rules)."""
    prefix = pattern.endswith("*")
    body = pattern[:-1] if prefix else pattern
    canonical, ambiguity = canonical_path(body, partial_last=prefix)
    if ambiguity is not None:
        raise AmbiguousTarget(f"path pattern {pattern!r} contains {ambiguity}: requests with it are refused")
    return canonical + ("*" if prefix else "")


def _split_authority(authority: str) -> tuple[str, int | None]:
    host, port = authority, ""
    if authority.startswith("["):
        end = authority.find("]")
        host, port = authority[: end + 1], (authority[end + 2 :] if end >= 0 else "")
    elif authority.count(":") == 1:
        host, port = authority.split(":")
    return host, (int(port) if port.isdigit() else None if not port else -1)


def _host_key(host: str) -> str | IPAddress | None:
    return request_host(host.strip())


def _fragment(target: str) -> AmbiguousTarget:
    return AmbiguousTarget(
        f"request target {_shown(target)} carries a fragment ('#'); fragments stay in the client"
    )


def _shown(text: str) -> str:
    return repr(text if len(text) <= 200 else text[:200] + "...")

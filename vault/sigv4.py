"""AWS Signature Version 4 re-signing: the sandbox signs with a placeholder key, the proxy with the real one.

Rules:
1. The sandbox holds a placeholder access key id (the binding's `placeholderAccessKeyId`, not
   a secret) and any secret access key; its SDK signs as usual. The proxy checks that the
   request is a well-formed SigV4 request under that placeholder (one `AWS4-HMAC-SHA256`
   Authorization header, credential scope `<placeholder>/<date>/<region>/<service>/aws4_request`
   with a bound region and service, the signed headers present, `host` and `x-amz-date` among
   them) and signs it again with the real key, over the same signed headers, with botocore's
   signer (`S3SigV4Auth` for s3, `SigV4Auth` otherwise). The placeholder's own signature is not
   checked: the placeholder secret protects nothing.
2. The payload hash is the client's `X-Amz-Content-SHA256` as sent (a hex digest,
   `UNSIGNED-PAYLOAD`, or `STREAMING-UNSIGNED-PAYLOAD-TRAILER` for aws-chunked uploads whose
   chunks carry no signature), so the body streams through untouched. Without that header
   (services other than S3 do not send it) the hash is taken over the body, which the proxy then
   holds whole (`needs_body`).
3. Refused, with the reason (`SigV4Refused`, a 400 from the proxy): presigned URLs
   (`X-Amz-Signature`/`X-Amz-Credential`, or SigV2's `AWSAccessKeyId`, in the query: a URL
   that carries a real signature would outlive the request and could be handed on), signed-chunk
   streaming uploads (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`, `STREAMING-AWS4-ECDSA-...`:
   every chunk's signature chains from the seed signature, so each would have to be re-signed;
   SDKs send unsigned-chunk uploads over HTTPS), SigV4a and SigV2, another key id, region or service.
4. Pure: no I/O, no clock but the signing time passed in, nothing printable with a value.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sandgate.vault.errors import VaultError

ALGORITHM = "AWS4-HMAC-SHA256"
CONTENT_SHA256 = "x-amz-content-sha256"
PRESIGNED_QUERY_KEYS = frozenset({"x-amz-signature", "x-amz-credential", "awsaccesskeyid"})  # v4, v2
SIGNED_CHUNKS = re.compile(r"^STREAMING-AWS4-(HMAC-SHA256|ECDSA-P256-SHA256)-PAYLOAD", re.IGNORECASE)
_AUTHORIZATION = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)/"
    r"(?P<service>[a-z0-9-]+)/aws4_request,\s*SignedHeaders=(?P<signed>[a-z0-9;._-]+),\s*"
    r"Signature=[0-9a-f]{64}$"
)
_AMZ_DATE = re.compile(r"^\d{8}T\d{6}Z$")
# The headers a re-signed request gets from the signer (set, replacing the client's).
RESIGNED_HEADERS = ("Authorization", "X-Amz-Date", "X-Amz-Security-Token")


class SigV4Refused(VaultError):
    """A request that cannot be re-signed; the message says why and how to fix it (no value in it)."""


@dataclass(frozen=True)
class Scope:
    """What the placeholder signature claimed: the request's region, service and signed headers."""

    region: str
    service: str
    signed_headers: tuple[str, ...]


@dataclass(frozen=True, repr=False)
class SigV4Signer:
    """Re-signs one binding's requests with the real key (see the module's rules)."""

    binding: str
    placeholder: str
    services: frozenset[str]
    regions: frozenset[str]
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        scope = f"services={sorted(self.services)}, regions={sorted(self.regions)}"
        return f"SigV4Signer(binding={self.binding!r}, {scope})"

    def needs_body(self, headers: Sequence[tuple[str, str]]) -> bool:
        """Whether the payload hash must be taken over the body (no X-Amz-Content-SHA256 sent)."""
        return not any(name.lower() == CONTENT_SHA256 for name, _ in headers)

    def check(self, url: str, headers: Sequence[tuple[str, str]]) -> Scope:
        """The placeholder signature's scope, or SigV4Refused saying what is wrong with the request."""
        query_keys = {key.lower() for key, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
        if query_keys & PRESIGNED_QUERY_KEYS:
            raise SigV4Refused(
                f"binding {self.binding!r}: presigned URLs are refused (a URL carrying a real signature "
                "would outlive the request); send the request itself, signed with the placeholder key"
            )
        found = {name.lower(): value for name, value in headers}
        authorization = found.get("authorization", "")
        match = _AUTHORIZATION.match(authorization.strip())
        if match is None:
            raise SigV4Refused(
                f"binding {self.binding!r}: the request is not signed with AWS SigV4 "
                f"({ALGORITHM} with Credential=, SignedHeaders= and Signature=); SigV2 and SigV4a are refused"
            )
        self._check_scope(match)
        signed = tuple(match["signed"].split(";"))
        missing = sorted({"host", "x-amz-date"} - set(signed)) + [h for h in signed if h not in found]
        if missing:
            raise SigV4Refused(
                f"binding {self.binding!r}: signed headers missing or unsigned: {', '.join(missing)}"
            )
        if not _AMZ_DATE.match(found["x-amz-date"]) or not found["x-amz-date"].startswith(match["date"]):
            raise SigV4Refused(
                f"binding {self.binding!r}: X-Amz-Date does not match the credential scope's date"
            )
        if SIGNED_CHUNKS.match(found.get(CONTENT_SHA256, "")):
            raise SigV4Refused(
                f"binding {self.binding!r}: signed-chunk uploads ({found[CONTENT_SHA256]}) "
                "cannot be re-signed; "
                "use HTTPS (SDKs then send unsigned chunks) or disable payload signing"
            )
        return Scope(match["region"], match["service"], signed)

    def sign(
        self,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        body: bytes | None = None,
        now: datetime.datetime | None = None,
    ) -> list[tuple[str, str]]:
        """The headers to set (RESIGNED_HEADERS; the token one only with a session token), for
        `url` as it goes upstream and the client's signed headers as they will be sent."""
        scope = self.check(url, headers)
        found = {name.lower(): value for name, value in headers}
        stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
        signed = {name: found[name] for name in scope.signed_headers if name not in ("x-amz-security-token",)}
        signed["x-amz-date"] = stamp
        if self.session_token:
            signed["x-amz-security-token"] = self.session_token
        request = AWSRequest(method=method, url=url, data=body or b"", headers=signed)
        request.context["timestamp"] = stamp
        auth_class = S3SigV4Auth if scope.service == "s3" else SigV4Auth
        auth = auth_class(
            Credentials(self.access_key_id, self.secret_access_key, self.session_token),
            scope.service,
            scope.region,
        )
        canonical = auth.canonical_request(request)
        signature = auth.signature(auth.string_to_sign(request, canonical), request)
        signed_names = auth.signed_headers(auth.headers_to_sign(request))
        scope_part = f"Credential={auth.scope(request)}"
        authorization = f"{ALGORITHM} {scope_part}, SignedHeaders={signed_names}, Signature={signature}"
        out = [("Authorization", authorization), ("X-Amz-Date", stamp)]
        if self.session_token:
            out.append(("X-Amz-Security-Token", self.session_token))
        return out

    def _check_scope(self, match: re.Match[str]) -> None:
        if match["key"] != self.placeholder:
            raise SigV4Refused(
                f"binding {self.binding!r}: signed with access key id {match['key']!r}, not the placeholder "
                f"{self.placeholder!r} (give the sandbox the placeholder, never a real key)"
            )
        if match["region"] not in self.regions:
            raise SigV4Refused(
                f"binding {self.binding!r}: region {match['region']!r} is not bound "
                f"(regions: {', '.join(sorted(self.regions))})"
            )
        if match["service"] not in self.services:
            raise SigV4Refused(
                f"binding {self.binding!r}: service {match['service']!r} is not bound "
                f"(services: {', '.join(sorted(self.services))})"
            )

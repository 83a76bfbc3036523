"""vault.sigv4 and vault.oauth2 without a network: a re-signed request verifies under the real
key with botocore's own signer (the check a SigV4 server makes), refusals name their reason,
token requests carry what each grant needs (the JWT assertion verifies with the public key),
and a token endpoint's answers are read or refused without a value in any message."""

from __future__ import annotations

import base64
import datetime
import json
from urllib.parse import parse_qs

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from joserfc import jwt
from joserfc.jwk import RSAKey

from sandgate.policy import AwsSigV4Auth, Binding, OAuth2Auth
from sandgate.vault import MintError, SigV4Refused, SigV4Signer, parse_token, render, token_request

PLACEHOLDER = "AKIASANDGATEPLACEHOLDER"
REAL_KEY, REAL_SECRET = "AKIAREALKEY000000001", "real/secret+value=="
VAULT = {"aws-key": REAL_KEY, "aws-secret": REAL_SECRET, "cc-secret": "cc-Secret-1", "rt": "rt-Value-1"}
NOW = datetime.datetime(2026, 12, 4, 10, 0, tzinfo=datetime.UTC)


def signer() -> SigV4Signer:
    binding = Binding.model_validate(
        {
            "name": "s3",
            "match": {"hosts": ["s3.example.com"]},
            "auth": {
                "type": "awsSigV4",
                "accessKeyId": "aws-key",
                "secretAccessKey": "aws-secret",
                "placeholderAccessKeyId": PLACEHOLDER,
                "services": ["s3", "sts"],
                "regions": ["us-east-1"],
            },
        }
    )
    assert isinstance(binding.auth, AwsSigV4Auth)
    injection = render(binding, VAULT.__getitem__)
    assert injection.signer is not None and "real" not in repr(injection)
    return injection.signer


def signed_by_sandbox(service: str, url: str, body: bytes, headers: dict[str, str]) -> list[tuple[str, str]]:
    """What an SDK in the sandbox sends: signed with the placeholder by botocore itself."""
    request = AWSRequest("PUT", url, data=body, headers=headers)
    auth_class = S3SigV4Auth if service == "s3" else SigV4Auth
    auth_class(Credentials(PLACEHOLDER, "placeholder"), service, "us-east-1").add_auth(request)
    return [("host", "s3.example.com"), *request.headers.items()]


def verifies(service: str, url: str, body: bytes, headers: list[tuple[str, str]]) -> bool:
    """The server's check: recompute the signature over the signed headers with the real key."""
    found = {name.lower(): value for name, value in headers}
    authorization = found["authorization"]
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    request = AWSRequest("PUT", url, data=body, headers={name: found[name] for name in signed})
    request.context["timestamp"] = found["x-amz-date"]
    auth_class = S3SigV4Auth if service == "s3" else SigV4Auth
    auth = auth_class(Credentials(REAL_KEY, REAL_SECRET), service, "us-east-1")
    expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
    return authorization.endswith(f"Signature={expected}") and f"Credential={REAL_KEY}/" in authorization


@pytest.mark.parametrize("payload", ["UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER", None])
def test_a_resigned_s3_request_verifies_under_the_real_key(payload: str | None) -> None:
    url, body = "https://s3.example.com/bucket/key%20with%20space?partNumber=1&uploadId=a", b"data"
    headers = {"X-Amz-Content-SHA256": payload} if payload else {}
    sent = signed_by_sandbox("s3", url, body, headers)
    out = dict(signer().sign("PUT", url, sent, now=NOW))
    final = [(n, v) for n, v in sent if n.lower() not in ("authorization", "x-amz-date")] + list(out.items())
    assert verifies("s3", url, body, final)
    assert out["X-Amz-Date"] == "20261204T100000Z"
    assert not verifies("s3", url, body, sent)  # the placeholder's own signature does not


def test_another_service_is_signed_over_the_body_hash() -> None:
    url, body = "https://s3.example.com/", b"Action=GetCallerIdentity&Version=2011-06-15"
    sent = signed_by_sandbox("sts", url, body, {"Content-Type": "application/x-www-form-urlencoded"})
    sts = signer()
    assert sts.needs_body(sent)
    out = sts.sign("PUT", url, sent, body, now=NOW)
    final = [(n, v) for n, v in sent if n.lower() not in ("authorization", "x-amz-date")] + out
    assert verifies("sts", url, body, final)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h, u: (h, u + "&X-Amz-Signature=00"), "presigned URLs"),
        (lambda h, u: (h, u + "&AWSAccessKeyId=AKIAX&Signature=x"), "presigned URLs"),
        (
            lambda h, u: ([*h, ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")], u),
            "signed-chunk",
        ),
        (
            lambda h, u: ([(n, v.replace(PLACEHOLDER, "AKIAOTHERKEY00000000")) for n, v in h], u),
            "not the placeholder",
        ),
        (lambda h, u: ([(n, v.replace("us-east-1", "eu-west-1")) for n, v in h], u), "region 'eu-west-1'"),
        (lambda h, u: ([(n, v.replace("/s3/", "/ec2/")) for n, v in h], u), "service 'ec2'"),
        (
            lambda h, u: ([(n, "AWS AKIAX:c2ln") if n == "Authorization" else (n, v) for n, v in h], u),
            "SigV2",
        ),
        (lambda h, u: ([(n, v) for n, v in h if n.lower() != "x-amz-date"], u), "x-amz-date"),
    ],
)
def test_what_cannot_be_resigned_says_why(change: object, reason: str) -> None:
    url = "https://s3.example.com/bucket/key?x=1"
    sent = signed_by_sandbox("s3", url, b"", {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    headers, target = change(sent, url)  # type: ignore[operator]
    with pytest.raises(SigV4Refused, match=reason) as refused:
        signer().sign("GET", target, headers, now=NOW)
    assert REAL_SECRET not in str(refused.value) and REAL_KEY not in str(refused.value)


# ---------------------------------------------------------------------------------- oauth2


def oauth2(**auth: object) -> OAuth2Auth:
    return OAuth2Auth.model_validate({"type": "oauth2", "tokenUrl": "https://auth.example.com/token", **auth})


def form(body: bytes) -> dict[str, list[str]]:
    return parse_qs(body.decode())


def test_client_credentials_and_refresh_token_requests() -> None:
    cc = oauth2(grant="client_credentials", clientId="agent", clientSecret="cc-secret", scopes=["a", "b"])
    request = token_request(cc, VAULT.__getitem__)
    assert form(request.body) == {"grant_type": ["client_credentials"], "scope": ["a b"]}
    basic = dict(request.headers)["Authorization"].removeprefix("Basic ")
    assert base64.b64decode(basic).decode() == "agent:cc-Secret-1"
    assert "cc-Secret" not in repr(request)
    rt = oauth2(grant="refresh_token", clientId="agent", refreshToken="rt")
    assert form(token_request(rt, VAULT.__getitem__).body) == {
        "grant_type": ["refresh_token"],
        "refresh_token": ["rt-Value-1"],
        "client_id": ["agent"],
    }


@pytest.mark.parametrize("grant", ["jwt_bearer", "github_app"])
def test_jwt_assertions_verify_with_the_public_key(grant: str) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    auth = oauth2(
        grant=grant, issuer="sa@example.com", subject="me@example.com", privateKey="key", scopes=["s"]
    )
    request = token_request(auth, {"key": pem}.__getitem__, now=1_800_000_000)
    if grant == "jwt_bearer":
        assertion = form(request.body)["assertion"][0]
    else:
        assertion = dict(request.headers)["Authorization"].removeprefix("Bearer ")
    public = RSAKey.import_key(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    claims = jwt.decode(assertion, public).claims
    assert claims["iss"] == "sa@example.com"
    if grant == "jwt_bearer":
        assert claims["aud"] == "https://auth.example.com/token" and claims["sub"] == "me@example.com"
        assert claims["scope"] == "s" and claims["exp"] - claims["iat"] == 3600
    else:
        assert claims["exp"] - claims["iat"] <= 600


def test_a_key_that_is_not_pem_is_named_not_shown() -> None:
    auth = oauth2(grant="jwt_bearer", issuer="sa@example.com", privateKey="key")
    with pytest.raises(MintError, match="'key' is not an RSA private key") as refused:
        token_request(auth, {"key": "not-a-key-SECRETISH"}.__getitem__)
    assert "SECRETISH" not in str(refused.value)


CC = oauth2(grant="client_credentials", clientId="agent", clientSecret="cc-secret", scopes=["read"])


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (500, b"upstream exploded", "HTTP 500 with 17 bytes that are not a JSON object"),
        (200, b"<html>", "not a JSON object"),
        (
            400,
            json.dumps({"error": "invalid_grant", "error_description": "expired"}).encode(),
            "invalid_grant",
        ),
        (200, json.dumps({"token_type": "bearer"}).encode(), "without a usable access token"),
        (200, json.dumps({"access_token": "t", "token_type": "mac"}).encode(), "only bearer"),
        (200, json.dumps({"access_token": "t", "token_type": "Bearer", "scope": "other"}).encode(), "'read'"),
    ],
)
def test_bad_answers_are_refused_with_the_reason(status: int, body: bytes, reason: str) -> None:
    with pytest.raises(MintError, match=reason):
        parse_token(CC, status, body, now=1000.0)


def test_good_answers_give_the_token_and_its_expiry() -> None:
    minted = parse_token(
        CC, 200, b'{"access_token": "tok", "token_type": "Bearer", "expires_in": 60}', now=1000.0
    )
    assert (minted.token, minted.expires_at) == ("tok", 1060.0) and "tok" not in repr(minted)
    github = oauth2(grant="github_app", issuer="1", privateKey="key")
    minted = parse_token(github, 201, b'{"token": "ghs_x", "expires_at": "2026-12-04T11:00:00Z"}', now=0)
    assert minted.token == "ghs_x" and minted.expires_at == NOW.timestamp() + 3600

"""AWS SigV4 re-signing, proven by an S3 server that checks signatures (moto in server mode with
authentication on, in the test internet, TLS from the test CA): boto3 inside a real sandbox holds
only the placeholder key id; the proxy re-signs with the real key from the vault.

What the other side says: moto accepts the requests (list, put, get, a multipart upload: it
verifies every signature against the real key it issued), and refuses the placeholder when it
reaches it unsigned-for-real (the positive control: moto does check). Refusals are the proxy's
400/403 with the reason, and the origin's log shows that a placeholder-signed request to an
unbound host never arrived."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts

from tests.adversarial.conftest import (
    LONG_LIVED_AND_MINTED,
    SANDBOX_PYTHON,
    ZONE,
    reach_from_the_node,
    sandbox_with_policy,
    vault_put,
)
from tests.support.audit import audit_records, wait_records
from tests.support.internet import Internet, stop
from tests.support.netns import netns, veth_to_host
from tests.support.server import SandgateServer

pytestmark = pytest.mark.root

S3_HOST = "s3.example.com"
UNBOUND_HOST = "api.example.com"  # intercepted (inspect: always), no AWS binding
MOTO_HOST_V4 = "198.18.7.1"  # the test's host namespace's end of moto's veth (RFC 2544 range)
MOTO_V4 = "198.18.7.20"
PLACEHOLDER_KEY = "AKIASANDGATEPLACEHOLDER"
BUCKET = "sandgate-bucket"
ALLOW_ALL = {"Effect": "Allow", "Action": "*", "Resource": "*"}  # the IAM user's policy
CLIENT = Path(__file__).with_name("aws_client.py")
IN_SANDBOX_CLIENT = "/workspace/aws_client.py"


@dataclass
class Moto:
    url: str
    access_key_id: str
    secret_access_key: str


def _unverified() -> ssl.SSLContext:
    """The host side talks to moto by address, which the test certificate does not name (the
    proxy, which matters here, reaches it as s3.example.com and verifies it)."""
    return ssl._create_unverified_context()


def _wait_up(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    context = _unverified()
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/data.json", context=context, timeout=2).read()
            return
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)


@pytest.fixture(scope="module")
def moto(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, internet: Internet
) -> Iterator[Moto]:
    """moto's S3 + IAM on MOTO_V4:443, in a namespace of its own joined to the test's host
    namespace by one veth; an IAM user with an access key (the real key), a bucket, then
    authentication switched on (`/moto-api/reset-auth` 0): every later request is checked."""
    workdir = tmp_path_factory.mktemp("moto")
    log = workdir / "moto.log"
    process = None
    with netns("sgm") as ns:
        try:
            veth_to_host(ns, MOTO_HOST_V4, MOTO_V4, 24)
            reach_from_the_node(request, ns.name, MOTO_HOST_V4, MOTO_V4)
            internet.set_names({**ZONE, S3_HOST: [MOTO_V4]})
            argv = [sys.executable, "-m", "moto.server", "-H", MOTO_V4, "-p", "443"]
            argv += ["-c", str(internet.workdir / "leaf.pem"), "-k", str(internet.workdir / "leaf-key.pem")]
            env = {**os.environ, "S3_IGNORE_SUBDOMAIN_BUCKETNAME": "true"}
            process = ns.popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
            url = f"https://{MOTO_V4}"
            _wait_up(url, process, log)
            admin = {"region_name": "us-east-1", "endpoint_url": url, "verify": False}
            keys = {"aws_access_key_id": "AKIAADMINNOTCHECKED0", "aws_secret_access_key": "unchecked"}
            iam = boto3.client("iam", **admin, **keys)
            iam.create_user(UserName="agent")
            iam.put_user_policy(
                UserName="agent",
                PolicyName="all",
                PolicyDocument=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
                    }
                ),
            )
            key = iam.create_access_key(UserName="agent")["AccessKey"]
            boto3.client("s3", **admin, **keys).create_bucket(Bucket=BUCKET)
            request = urllib.request.Request(
                f"{url}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
            )
            urllib.request.urlopen(request, context=_unverified(), timeout=5).read()
            LONG_LIVED_AND_MINTED.extend([key["AccessKeyId"], key["SecretAccessKey"]])
            yield Moto(url, key["AccessKeyId"], key["SecretAccessKey"])
        finally:
            if process is not None:
                stop(process)
            internet.set_names(ZONE)


POLICY = {
    "version": 1,
    "defaultAction": "deny",
    "egress": [
        {"action": "allow", "target": S3_HOST},
        {"action": "allow", "target": UNBOUND_HOST, "inspect": "always"},
    ],
    "bindings": [
        {
            "name": "s3",
            "match": {"hosts": [S3_HOST], "methods": ["GET", "HEAD", "PUT", "POST", "DELETE"]},
            "auth": {
                "type": "awsSigV4",
                "accessKeyId": "aws-access-key-id",
                "secretAccessKey": "aws-secret-access-key",
                "placeholderAccessKeyId": PLACEHOLDER_KEY,
                "services": ["s3", "sts"],
                "regions": ["us-east-1"],
            },
        }
    ],
}


@dataclass
class AwsSandbox:
    sandbox: SandboxSync
    server: SandgateServer
    moto: Moto

    def sh(self, command: str) -> tuple[int | None, str, str]:
        execution = self.sandbox.commands.run(command, opts=RunCommandOpts(timeout=timedelta(seconds=120)))
        out = "".join(m.text for m in execution.logs.stdout)
        err = "".join(m.text for m in execution.logs.stderr)
        for secret in (self.moto.secret_access_key, self.moto.access_key_id):
            assert secret not in out + err, f"a real AWS credential reached the sandbox: {command}"
        return execution.exit_code, out, err

    def audit(self) -> list[dict[str, Any]]:
        return audit_records(self.server.state_dir, self.sandbox.id)


@pytest.fixture(scope="module")
def aws(server: SandgateServer, moto: Moto) -> Iterator[AwsSandbox]:
    vault_put(server, "aws-access-key-id", moto.access_key_id)
    vault_put(server, "aws-secret-access-key", moto.secret_access_key)
    env = {
        "AWS_ACCESS_KEY_ID": PLACEHOLDER_KEY,
        "AWS_SECRET_ACCESS_KEY": "placeholder-not-a-secret",
        "AWS_ENDPOINT_URL": f"https://{S3_HOST}",
    }
    with sandbox_with_policy(server, POLICY, env) as sandbox:
        sandbox.files.write_file(IN_SANDBOX_CLIENT, CLIENT.read_text())
        yield AwsSandbox(sandbox, server, moto)


def test_moto_checks_signatures(moto: Moto) -> None:
    """Positive control: the placeholder reaching moto as it is gets refused."""
    s3 = boto3.client(
        "s3", region_name="us-east-1", endpoint_url=moto.url, verify=False,
        aws_access_key_id=PLACEHOLDER_KEY, aws_secret_access_key="placeholder-not-a-secret",
    )  # fmt: skip
    with pytest.raises(Exception, match=r"InvalidAccessKeyId|SignatureDoesNotMatch"):
        s3.list_buckets()
    wrong = boto3.client(
        "s3", region_name="us-east-1", endpoint_url=moto.url, verify=False,
        aws_access_key_id=moto.access_key_id, aws_secret_access_key="not-the-secret",
    )  # fmt: skip
    with pytest.raises(Exception, match="SignatureDoesNotMatch"):
        wrong.list_buckets()


def test_boto3_in_a_sandbox_lists_uploads_and_multiparts_with_the_placeholder(aws: AwsSandbox) -> None:
    code, out, err = aws.sh(f"{SANDBOX_PYTHON} {IN_SANDBOX_CLIENT} {BUCKET}")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert BUCKET in result["buckets"]
    assert result["small"] == "hello from the sandbox"
    assert result["big_size"] == 5 * 1024 * 1024 + 4
    assert result["unsigned"] == "unsigned payload"
    assert result["caller"].endswith(":user/agent")  # sts, signed over the body's hash by the proxy
    assert result["keys"] == ["big.bin", "small.txt", "unsigned.txt"]
    sent = {(s["content-sha256"], s["content-encoding"]) for s in result["sent"]}
    # The payload modes boto3 used (all re-signed and accepted): aws-chunked uploads with an
    # unsigned checksum trailer (put_object, upload_part), UNSIGNED-PAYLOAD, a body's hex digest.
    assert ("STREAMING-UNSIGNED-PAYLOAD-TRAILER", "aws-chunked") in sent, sent
    assert ("UNSIGNED-PAYLOAD", "") in sent, sent
    assert any(len(mode) == 64 for mode, _ in sent), sent
    records = wait_records(  # a node's records come through its shipper a poll later
        aws.server.state_dir,
        aws.sandbox.id,
        lambda r: r["kind"] == "request" and r["host"] == S3_HOST and r.get("event") != "incomplete",
        at_least=len(result["sent"]),
    )
    assert len(records) >= len(result["sent"]), records
    assert all(r["binding"] == "s3" and r["status"] in (200, 204) for r in records), records


def placeholder_authorization(date: str = "20250101") -> str:
    return (
        f"'Authorization: AWS4-HMAC-SHA256 Credential={PLACEHOLDER_KEY}/{date}/us-east-1/s3/aws4_request, "
        f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={'0' * 64}' "
        f"-H 'x-amz-date: {date}T000000Z'"
    )


@pytest.mark.parametrize(
    ("extra", "query", "expected"),
    [
        ("-H 'x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD'", "", "signed-chunk uploads"),
        ("-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD'", "?X-Amz-Signature=00", "presigned URLs"),
    ],
)
def test_what_cannot_be_resigned_is_refused_with_the_reason(
    aws: AwsSandbox, extra: str, query: str, expected: str
) -> None:
    _, out, _ = aws.sh(
        f"curl -sS -w '\\n%{{http_code}}' -H {placeholder_authorization()} {extra} "
        f"'https://{S3_HOST}/{BUCKET}{query}'"
    )
    body, status = out.rsplit("\n", 1)
    assert status == "400", out
    answer = json.loads(body)
    assert answer["reason"] == "request-not-resignable" and expected in answer["detail"], answer


@pytest.mark.parametrize("version", ["s3v4", "s3"])
def test_a_presigned_url_from_the_sdk_is_refused(aws: AwsSandbox, version: str) -> None:
    presign = (
        "import boto3, botocore.config as c; print(boto3.client('s3', region_name='us-east-1', "
        f"config=c.Config(signature_version='{version}'))"
        f".generate_presigned_url('get_object', Params={{'Bucket': '{BUCKET}', 'Key': 'small.txt'}}))"
    )
    code, url, err = aws.sh(f'{SANDBOX_PYTHON} -c "{presign}"')
    assert code == 0 and PLACEHOLDER_KEY in url, err
    code, out, _ = aws.sh(f"curl -sS -w '\\n%{{http_code}}' '{url.strip()}'")
    assert out.rsplit("\n", 1)[1] == "400" and "presigned URLs" in out, out


def test_a_placeholder_signed_request_to_an_unbound_host_is_refused(
    aws: AwsSandbox, internet: Internet
) -> None:
    mark = len(internet.origin_requests())
    _, out, _ = aws.sh(
        f"curl -sS -w '\\n%{{http_code}}' -H {placeholder_authorization()} "
        f"-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' https://{UNBOUND_HOST}/echo"
    )
    body, status = out.rsplit("\n", 1)
    assert status == "403" and json.loads(body)["reason"] == "placeholder-outside-binding", out
    assert internet.origin_requests()[mark:] == []  # it never left

"""Runs INSIDE a sandbox: boto3 with the placeholder credentials from the environment
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_CA_BUNDLE set by sandgate to the
sandbox CA), against S3 through sandgate. Prints one JSON line: what each step returned, and the
payload-hash headers boto3 sent (so the test knows which signing modes were exercised)."""

from __future__ import annotations

import json
import sys
from typing import Any

import boto3
from botocore.config import Config


def main(bucket: str) -> dict[str, Any]:
    sent: list[dict[str, str]] = []

    def header(request: Any, name: str) -> str:
        value = request.headers.get(name, "")
        return value.decode() if isinstance(value, bytes) else str(value)

    def record(request: Any, **_: Any) -> None:
        sent.append(
            {
                "method": request.method,
                "content-sha256": header(request, "X-Amz-Content-SHA256"),
                "content-encoding": header(request, "Content-Encoding"),
            }
        )

    s3 = boto3.client("s3", region_name="us-east-1", config=Config(s3={"addressing_style": "path"}))
    s3.meta.events.register("before-send.s3", record)
    out: dict[str, Any] = {}
    out["buckets"] = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.put_object(Bucket=bucket, Key="small.txt", Body=b"hello from the sandbox")
    out["small"] = s3.get_object(Bucket=bucket, Key="small.txt")["Body"].read().decode()
    part = b"p" * (5 * 1024 * 1024)  # S3's minimum part size (but for the last part)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big.bin")
    parts = []
    for number, body in enumerate((part, b"tail"), start=1):
        answer = s3.upload_part(
            Bucket=bucket, Key="big.bin", UploadId=upload["UploadId"], PartNumber=number, Body=body
        )
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
    s3.complete_multipart_upload(
        Bucket=bucket, Key="big.bin", UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
    )
    # Without flexible checksums and payload signing: a plain PUT with UNSIGNED-PAYLOAD.
    plain = boto3.client(
        "s3",
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path", "payload_signing_enabled": False},
            request_checksum_calculation="when_required",
        ),
    )
    plain.meta.events.register("before-send.s3", record)
    plain.put_object(Bucket=bucket, Key="unsigned.txt", Body=b"unsigned payload")
    out["unsigned"] = s3.get_object(Bucket=bucket, Key="unsigned.txt")["Body"].read().decode()
    # Another service: no X-Amz-Content-SHA256, so the proxy hashes the (form) body itself.
    out["caller"] = boto3.client("sts", region_name="us-east-1").get_caller_identity()["Arn"]
    out["big_size"] = s3.head_object(Bucket=bucket, Key="big.bin")["ContentLength"]
    out["keys"] = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    out["sent"] = sent
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))

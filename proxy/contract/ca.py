"""The deployment CA and the upstream trust bundle.

Rules: the CA is made once per deployment (first start) with `cryptography` and kept in the
state dir: `CA_KEY_AND_CERT` (key + certificate, mode 0600, never leaves the host) and
`CA_CERT` (certificate only: the file sandboxes trust; names in contract/names.py). mitmproxy reads the pair
from its confdir, which is the state dir. Upstream trust is certifi plus an optional extra bundle,
merged into one file because mitmproxy's `ssl_verify_upstream_trusted_ca` replaces certifi.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sandgate.proxy.contract.names import CA_CERT, CA_KEY_AND_CERT, CA_LOCK, UPSTREAM_BUNDLE

CA_VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class CaFiles:
    key_and_cert: Path  # secret: stays in the state dir
    cert: Path  # public: copied into sandboxes


def ensure_ca(state_dir: Path) -> CaFiles:
    """Return the deployment CA's files, generating them on first use.

    Proxy workers start together: the check-and-create runs under a lock on the state dir, or
    two of them would each make a CA and leave one's key beside the other's certificate."""
    state_dir.mkdir(parents=True, exist_ok=True)
    files = CaFiles(state_dir / CA_KEY_AND_CERT, state_dir / CA_CERT)
    with _locked(state_dir / CA_LOCK):
        _create_missing(files)
    return files


def _create_missing(files: CaFiles) -> None:
    if not files.key_and_cert.exists():
        key, cert = new_ca("sandgate egress CA", organization="sandgate")
        secret = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ) + cert.public_bytes(serialization.Encoding.PEM)
        _write(files.key_and_cert, secret, 0o600)
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    elif not files.cert.exists():
        cert = x509.load_pem_x509_certificates(files.key_and_cert.read_bytes())[0]
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def upstream_trust_bundle(state_dir: Path, extra: Path | None) -> Path:
    """certifi's roots plus `extra` in one file (rewritten each start so certifi updates apply)."""
    bundle = Path(certifi.where()).read_bytes()
    if extra is not None:
        if not extra.is_file():
            raise FileNotFoundError(f"upstream_ca {extra} does not exist; give a PEM bundle of extra roots")
        bundle += b"\n" + extra.read_bytes()
    path = state_dir / UPSTREAM_BUNDLE
    _write(path, bundle, 0o644)
    return path


def new_ca(
    common_name: str, organization: str | None = None, validity: datetime.timedelta = CA_VALIDITY
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA that signs leaves directly (path length 0). Python 3.13 clients verify
    strictly (VERIFY_X509_STRICT), so it carries key usage and a subject key identifier."""
    # mitmproxy signs leaves with the CA key and reuses it as the leaf key; P-256 keeps that fast.
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    name = x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write via a temp file of this writer's own (workers rewrite the trust bundle at the same
    time), created 0600 so a secret is never world-readable, then given its final mode."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

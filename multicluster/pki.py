"""Keys and certificates, made with ``cryptography``: one module for every certificate the
project makes.

The agent's webhook CA and serving certificates, the key and certificate request of its kubelet
API, and the test bed's cluster identities (a CA, serving and client certificates for every
component, service-account signing keys) are all made here. ECDSA P-256 keys (instant to
generate), SHA-256 signatures, and the X.509 extensions Kubernetes components check: basic
constraints and key usage on CAs; extended key usage, subject alternative names and the
authority key identifier on what they issue. Certificates start five minutes in the past, so a
peer whose clock is a little behind accepts them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey
CLOCK_SKEW = dt.timedelta(minutes=5)
CA_VALIDITY = dt.timedelta(days=3650)
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate (or chain, leaf first) and the PEM private key of its leaf."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Replace both files at once; the key readable by its owner only."""
        write_file(key_path, self.key_pem, 0o600)
        write_file(cert_path, self.cert_pem, 0o644)

    def write_to(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """``<stem>.crt`` and ``<stem>.key`` in ``directory``; their paths."""
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        self.write(cert, key)
        return cert, key


class ServingFiles:
    """Where a server reads its certificate (``tls.crt``, ``tls.key`` in one folder), and who
    to tell when a new one is written there."""

    def __init__(self, cert_dir: Path) -> None:
        self.cert_dir = cert_dir
        self._reload_callbacks: list[Callable[[Path, Path], object]] = []

    @property
    def cert_file(self) -> Path:
        return self.cert_dir / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.cert_dir / "tls.key"

    def on_reload(self, callback: Callable[[Path, Path], object]) -> None:
        """Call ``callback(cert_file, key_file)`` after each new certificate is written."""
        self._reload_callbacks.append(callback)

    def install(self, pair: KeyPair) -> None:
        """Write ``pair`` (both files replaced at once), then tell every callback."""
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        pair.write(self.cert_file, self.key_file)
        for callback in self._reload_callbacks:
            callback(self.cert_file, self.key_file)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` at once (a reader never sees half a file), with ``mode`` whatever the
    umask."""
    temporary = path.with_name(f".{path.name}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def new_key() -> PrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_der(key: PublicKeyTypes) -> bytes:
    """The public key as DER SubjectPublicKeyInfo: compare these to tell keys apart."""
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    """A subject: organizations (Kubernetes groups) first, then the common name (the user)."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def subject_alternative_names(hosts: Iterable[str]) -> x509.SubjectAlternativeName:
    """IP addresses as IP SANs, anything else as DNS SANs."""
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(sans)


def certificate_request(key: PrivateKey, subject: x509.Name, hosts: Iterable[str]) -> bytes:
    """A PEM certificate signing request for ``subject`` at ``hosts``."""
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .add_extension(subject_alternative_names(hosts), critical=False)
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM)


def needs_renewal(pair: KeyPair, now: dt.datetime | None = None) -> bool:
    """True once less than a third of the certificate's validity is left."""
    now = now or dt.datetime.now(dt.UTC)
    cert = pair.certificate
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now < lifetime / 3


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=True,
    crl_sign=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)


class CertificateAuthority:
    """A CA's certificate and key, issuing serving and client certificates."""

    def __init__(self, pair: KeyPair) -> None:
        key = serialization.load_pem_private_key(pair.key_pem, password=None)
        if not isinstance(key, PrivateKey):
            raise ValueError("the CA's key is not an ECDSA key")
        self.pair = pair
        self.certificate = pair.certificate
        self._key = key

    @classmethod
    def new(
        cls,
        common_name: str,
        validity: dt.timedelta = CA_VALIDITY,
        *,
        path_length: int | None = 0,
        now: dt.datetime | None = None,
    ) -> CertificateAuthority:
        """A self-signed CA; ``path_length`` 0 lets it sign leaves only."""
        now = now or dt.datetime.now(dt.UTC)
        key = new_key()
        subject = name(common_name)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem(key)))

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        return cls(KeyPair(cert_path.read_bytes(), key_path.read_bytes()))

    @property
    def cert_pem(self) -> bytes:
        return self.pair.cert_pem

    def issue(
        self,
        subject: str | x509.Name,
        validity: dt.timedelta = VALIDITY,
        *,
        hosts: Iterable[str] = (),
        organizations: Iterable[str] = (),
        server: bool = False,
        client: bool = False,
        now: dt.datetime | None = None,
    ) -> KeyPair:
        """A new key and its certificate for ``subject`` (a common name, with
        ``organizations``, or a whole name) at ``hosts`` (DNS names or IP addresses), for
        serving, client authentication or both."""
        if not (server or client):
            raise ValueError("a certificate for neither serving nor clients")
        now = now or dt.datetime.now(dt.UTC)
        if isinstance(subject, str):
            subject = name(subject, organizations)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        key = new_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
        )
        hosts = list(hosts)
        if hosts:
            builder = builder.add_extension(subject_alternative_names(hosts), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem(key))


def signing_key_pair() -> KeyPair:
    """A key for signing tokens (service accounts): its public key PEM in place of a
    certificate, and its private key PEM."""
    key = new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, key_pem(key))

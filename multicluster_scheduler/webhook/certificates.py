"""Self-managed webhook certificates: no cert-manager needed.

The replicas share one CA, kept in a Secret the chart creates empty (so uninstalling removes
it): the first agent to find it empty fills it, a concurrent one loses the update race and
reads the winner's. Each replica then signs its own serving certificate (the Service's DNS
names, plus any extra host such as 127.0.0.1 for an agent outside the cluster), renews it when a
third of its life is left, and reloads it without a restart. The leader keeps the webhook
configuration's caBundle equal to the CA, also after ``helm upgrade`` resets it.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from multicluster import Client, Conflict, Request, Resource, Unreachable
from multicluster.errors import ServerError, TooManyRequests
from multicluster.resources import SECRETS

log = logging.getLogger(__name__)

MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=90)
CA_CERT_KEY, CA_KEY_KEY = "ca.crt", "ca.key"


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(common_name: str, now: dt.datetime | None = None) -> KeyPair:
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def service_hosts(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def subject_alternative_names(hosts: list[str]) -> x509.SubjectAlternativeName:
    """IP addresses as IP SANs, anything else as DNS SANs."""
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(sans)


def new_serving_certificate(
    ca: KeyPair,
    hosts: list[str],
    now: dt.datetime | None = None,
    *,
    subject: x509.Name | None = None,
) -> KeyPair:
    """A serving certificate for ``hosts`` (DNS names or IP addresses) signed by ``ca``; its
    subject is ``subject``, or the first host as common name."""
    now = now or dt.datetime.now(dt.UTC)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    ca_cert = ca.certificate
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + SERVING_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(subject_alternative_names(hosts), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def needs_renewal(pair: KeyPair, now: dt.datetime | None = None) -> bool:
    """True once less than a third of the certificate's validity is left."""
    now = now or dt.datetime.now(dt.UTC)
    cert = pair.certificate
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now < lifetime / 3


def ca_bundle_patch(configuration: dict, ca_pem: bytes) -> dict | None:
    """The configuration with every webhook's caBundle set to ``ca_pem``; None if already so."""
    bundle = base64.b64encode(ca_pem).decode()
    webhooks = configuration.get("webhooks") or []
    if all(w.get("clientConfig", {}).get("caBundle") == bundle for w in webhooks):
        return None
    updated = dict(configuration)
    updated["webhooks"] = [
        {**w, "clientConfig": {**w.get("clientConfig", {}), "caBundle": bundle}} for w in webhooks
    ]
    return updated


class CertificateManager:
    """Loads (or makes) the shared CA, serves a renewed certificate, keeps the caBundle."""

    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        ca_secret: str,
        webhook_configuration: str,
        hosts: list[str],
        cert_dir: Path,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.ca_secret = ca_secret
        self.webhook_configuration = webhook_configuration
        self.hosts = hosts
        self.cert_dir = cert_dir
        self.ca: KeyPair | None = None
        self.serving: KeyPair | None = None
        self._reload_callbacks: list = []

    @property
    def cert_file(self) -> Path:
        return self.cert_dir / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.cert_dir / "tls.key"

    def on_reload(self, callback) -> None:
        self._reload_callbacks.append(callback)

    async def load_ca(self) -> KeyPair:
        """The shared CA from the Secret, filling the Secret first if it is empty."""
        while True:
            try:
                secret = await self.client.get(SECRETS, self.ca_secret, self.namespace)
            except (Unreachable, ServerError, TooManyRequests) as e:
                log.warning("cannot read the webhook CA secret yet, retrying: %s", e)
                await asyncio.sleep(1.0)
                continue
            data = secret.get("data") or {}
            if CA_CERT_KEY in data and CA_KEY_KEY in data:
                self.ca = KeyPair(
                    base64.b64decode(data[CA_CERT_KEY]), base64.b64decode(data[CA_KEY_KEY])
                )
                return self.ca
            ca = new_ca(f"{self.webhook_configuration}-webhook-ca")
            secret["data"] = {
                **data,
                CA_CERT_KEY: base64.b64encode(ca.cert_pem).decode(),
                CA_KEY_KEY: base64.b64encode(ca.key_pem).decode(),
            }
            try:
                await self.client.update(SECRETS, secret)
            except Conflict:
                continue  # another replica filled it first: use theirs
            log.info("created webhook CA secret=%s/%s", self.namespace, self.ca_secret)
            self.ca = ca
            return ca

    def issue(self) -> None:
        """Sign a new serving certificate and write it where the server reads it."""
        assert self.ca is not None
        self.serving = new_serving_certificate(self.ca, self.hosts)
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        self.key_file.touch(mode=0o600)
        self.key_file.write_bytes(self.serving.key_pem)
        self.cert_file.write_bytes(self.serving.cert_pem)
        for callback in self._reload_callbacks:
            callback(self.cert_file, self.key_file)

    async def renew_forever(self, check_every: float = 3600.0) -> None:
        while True:
            await asyncio.sleep(check_every)
            if self.serving is None or needs_renewal(self.serving):
                self.issue()
                log.info("renewed webhook serving certificate")

    async def reconcile_ca_bundle(self, request: Request) -> None:
        """Controller: keep every webhook's caBundle equal to the CA."""
        if request.name != self.webhook_configuration or self.ca is None:
            return
        configuration = await self.client.get(MUTATING_WEBHOOKS, request.name)
        updated = ca_bundle_patch(configuration, self.ca.cert_pem)
        if updated is not None:
            await self.client.update(MUTATING_WEBHOOKS, updated)
            log.info("patched caBundle webhookconfiguration=%s", request.name)

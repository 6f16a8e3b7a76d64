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
import logging
from pathlib import Path

from cryptography import x509

from multicluster import Client, Conflict, Request, Resource, Unreachable
from multicluster.errors import ServerError, TooManyRequests
from multicluster.pki import CertificateAuthority, KeyPair, ServingFiles, needs_renewal
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


def new_ca(common_name: str, now: dt.datetime | None = None) -> KeyPair:
    """The webhook's CA: signs serving certificates only, for ten years."""
    return CertificateAuthority.new(common_name, CA_VALIDITY, path_length=0, now=now).pair


def service_hosts(service: str, namespace: str) -> list[str]:
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def new_serving_certificate(
    ca: KeyPair,
    hosts: list[str],
    now: dt.datetime | None = None,
    *,
    subject: x509.Name | None = None,
) -> KeyPair:
    """A serving certificate for ``hosts`` (DNS names or IP addresses) signed by ``ca``, valid
    90 days; its subject is ``subject``, or the first host as common name."""
    return CertificateAuthority(ca).issue(
        subject or hosts[0], SERVING_VALIDITY, hosts=hosts, server=True, now=now
    )


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


class CertificateManager(ServingFiles):
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
        super().__init__(cert_dir)
        self.ca: KeyPair | None = None
        self.serving: KeyPair | None = None

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
        self.install(self.serving)

    async def renew_forever(self, check_every: float = 3600.0) -> None:
        while True:
            await asyncio.sleep(check_every)
            if self.serving is None or needs_renewal(self.serving):
                self.issue()
                log.info("renewed webhook serving certificate")

    async def reconcile(self, request: Request) -> None:
        """The reconciler of the ``webhook-ca-bundle`` controller: keep every webhook's caBundle
        equal to the CA."""
        if request.name != self.webhook_configuration or self.ca is None:
            return
        configuration = await self.client.get(MUTATING_WEBHOOKS, request.name)
        updated = ca_bundle_patch(configuration, self.ca.cert_pem)
        if updated is not None:
            await self.client.update(MUTATING_WEBHOOKS, updated)
            log.info("patched caBundle webhookconfiguration=%s", request.name)

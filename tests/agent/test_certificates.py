"""Self-managed certificates: chains, names, renewal, the caBundle patch, reload without
restart (against the webhook's real TLS server on loopback)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import socket
import ssl

from cryptography import x509

from multicluster.pki import needs_renewal
from multicluster_scheduler.webhook.certificates import (
    ca_bundle_patch,
    new_ca,
    new_serving_certificate,
    service_hosts,
)


def test_serving_certificate_chains_to_the_ca_with_service_names_and_ips():
    ca = new_ca("test-ca")
    hosts = [*service_hosts("multicluster-scheduler", "admiralty"), "127.0.0.1"]
    serving = new_serving_certificate(ca, hosts)
    cert = serving.certificate
    cert.verify_directly_issued_by(ca.certificate)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "multicluster-scheduler.admiralty.svc" in sans.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_renewal_once_a_third_of_the_validity_is_left():
    ca = new_ca("test-ca")
    issued = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    serving = new_serving_certificate(ca, ["x"], now=issued)
    assert not needs_renewal(serving, now=issued + dt.timedelta(days=50))
    assert needs_renewal(serving, now=issued + dt.timedelta(days=61))


def test_ca_bundle_patch_sets_every_webhook_and_is_idempotent():
    ca = new_ca("test-ca")
    configuration = {
        "metadata": {"name": "m", "resourceVersion": "7"},
        "webhooks": [
            {"name": "a", "clientConfig": {"url": "https://127.0.0.1:1/mutate"}},
            {"name": "b", "clientConfig": {"service": {"name": "s"}, "caBundle": "stale"}},
        ],
    }
    patched = ca_bundle_patch(configuration, ca.cert_pem)
    assert patched is not None
    bundles = {w["clientConfig"]["caBundle"] for w in patched["webhooks"]}
    assert bundles == {base64.b64encode(ca.cert_pem).decode()}
    assert patched["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:1/mutate"
    assert patched["metadata"]["resourceVersion"] == "7"
    assert ca_bundle_patch(patched, ca.cert_pem) is None


def _served_serial(port: int, ca_pem: bytes) -> int:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", port)) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


async def test_a_renewed_certificate_is_served_without_restart(served):
    ca, port, cert_dir = served.ca, served.port, served.cert_dir
    second = new_serving_certificate(ca, ["127.0.0.1"])
    serial = await asyncio.to_thread(_served_serial, port, ca.cert_pem)
    assert serial == served.first.certificate.serial_number
    (cert_dir / "tls.crt").write_bytes(second.cert_pem)
    (cert_dir / "tls.key").write_bytes(second.key_pem)
    served.server.reload_certificate(cert_dir / "tls.crt", cert_dir / "tls.key")
    serial = await asyncio.to_thread(_served_serial, port, ca.cert_pem)
    assert serial == second.certificate.serial_number

"""The virtual kubelet's serving certificate without a cluster: what the CSR asks for, how the
answer is read (certificate, chain, refusal), and the agent CA's certificate when the signer is
off; files, modes and reload callbacks."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from multicluster.pki import KeyPair, needs_renewal
from multicluster_scheduler.virtual_kubelet.serving import (
    APPROVAL_REASON,
    ISSUER_AGENT_CA,
    KUBELET_SERVING_SIGNER,
    KubeletCertificateError,
    KubeletCertificates,
    approved,
    certificate_request,
    csr_name,
    csr_object,
    issued_certificate,
    kubelet_subject,
    refusal,
    serving_pair,
)
from multicluster_scheduler.webhook.certificates import new_ca

ADDRESSES = ["127.0.0.1", "fd00::1", "agent.example.com"]


def names(cert_or_request, oid) -> list[str]:
    return [a.value for a in cert_or_request.subject.get_attributes_for_oid(oid)]


def sans(cert_or_request) -> tuple[list, list]:
    extension = cert_or_request.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return (
        extension.value.get_values_for_type(x509.IPAddress),
        extension.value.get_values_for_type(x509.DNSName),
    )


def sign(ca_cert: x509.Certificate, ca_key, public_key, days: int = 30) -> x509.Certificate:
    """What a signer does with a request: a certificate for its public key."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "system:node:vk")]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .sign(ca_key, hashes.SHA256())
    )


def load_key(pair: KeyPair):
    return serialization.load_pem_private_key(pair.key_pem, password=None)


# -- the request --------------------------------------------------------------------------------


def test_request_has_the_subject_and_addresses_kubelet_serving_requires():
    key = ec.generate_private_key(ec.SECP256R1())
    request = x509.load_pem_x509_csr(certificate_request(key, "vk-target1", ADDRESSES))
    assert request.is_signature_valid
    assert names(request, NameOID.COMMON_NAME) == ["system:node:vk-target1"]
    assert names(request, NameOID.ORGANIZATION_NAME) == ["system:nodes"]
    ips, dns = sans(request)
    assert ips == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("fd00::1")]
    assert dns == ["agent.example.com"]
    assert isinstance(request.public_key(), ec.EllipticCurvePublicKey)
    assert request.public_key().curve.name == "secp256r1"


def test_object_asks_the_signer_for_serving_usages_only():
    key = ec.generate_private_key(ec.SECP256R1())
    pem = certificate_request(key, "vk", ["127.0.0.1"])
    name = csr_name("multicluster-scheduler-kubelet", key)
    body = csr_object(name, KUBELET_SERVING_SIGNER, pem)
    assert body["apiVersion"] == "certificates.k8s.io/v1"
    assert body["kind"] == "CertificateSigningRequest"
    assert body["metadata"] == {"name": name}
    assert body["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
    assert body["spec"]["usages"] == ["digital signature", "server auth"]
    assert base64.b64decode(body["spec"]["request"]) == pem
    assert "expirationSeconds" not in body["spec"]
    assert csr_object(name, "example.com/x", pem, 3600)["spec"]["expirationSeconds"] == 3600


def test_names_differ_per_key_and_are_dns_subdomains():
    first, second = (ec.generate_private_key(ec.SECP256R1()) for _ in range(2))
    name = csr_name("multicluster-scheduler-kubelet", first)
    assert name != csr_name("multicluster-scheduler-kubelet", second)
    assert name == csr_name("multicluster-scheduler-kubelet", first)
    prefix, _, digest = name.rpartition("-")
    assert prefix == "multicluster-scheduler-kubelet"
    assert len(digest) == 12
    assert int(digest, 16) >= 0


def test_approval_appends_an_approved_condition_and_keeps_the_rest():
    csr = {
        "metadata": {"name": "c", "resourceVersion": "7"},
        "spec": {"signerName": KUBELET_SERVING_SIGNER},
        "status": {"conditions": [{"type": "Other", "status": "True"}]},
    }
    now = dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.UTC)
    body = approved(csr, "vk", now)
    assert body["metadata"] == csr["metadata"]
    assert body["spec"] == csr["spec"]
    other, approval = body["status"]["conditions"]
    assert other == {"type": "Other", "status": "True"}
    assert approval["type"] == "Approved"
    assert approval["status"] == "True"
    assert approval["reason"] == APPROVAL_REASON
    assert "multicluster-scheduler" in approval["message"]
    assert "vk" in approval["message"]
    assert approval["lastUpdateTime"] == "2024-05-01T10:00:00Z"
    assert csr["status"]["conditions"] == [{"type": "Other", "status": "True"}]
    assert approved({"metadata": {"name": "c"}}, "vk")["status"]["conditions"][0]["type"] == (
        "Approved"
    )


# -- the answer ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["Denied", "Failed"])
def test_denied_or_failed_is_a_refusal_with_its_message(kind):
    csr = {
        "status": {
            "conditions": [
                {"type": "Approved", "status": "True"},
                {"type": kind, "status": "True", "reason": "Because", "message": "no way"},
            ]
        }
    }
    assert refusal(csr) == f"{kind.lower()} (Because): no way"


def test_pending_or_approved_is_no_refusal():
    assert refusal({}) is None
    assert refusal({"status": {"conditions": [{"type": "Approved", "status": "True"}]}}) is None
    assert refusal({"status": {"conditions": [{"type": "Denied", "status": "False"}]}}) is None


def test_issued_certificate_is_the_decoded_status_certificate():
    assert issued_certificate({"status": {}}) is None
    assert issued_certificate({"status": {"certificate": ""}}) is None
    pem = b"-----BEGIN CERTIFICATE-----\n...\n"
    assert issued_certificate({"status": {"certificate": base64.b64encode(pem).decode()}}) == pem


def test_a_chain_is_kept_whole_with_the_leaf_first():
    root = new_ca("root")
    intermediate_key = ec.generate_private_key(ec.SECP256R1())
    intermediate = sign(root.certificate, load_key(root), intermediate_key.public_key(), 365)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = sign(intermediate, intermediate_key, key.public_key())
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (leaf, intermediate))
    pair = serving_pair(chain, key)
    assert x509.load_pem_x509_certificates(pair.cert_pem) == [leaf, intermediate]
    assert pair.certificate == leaf
    assert load_key(pair).private_numbers() == key.private_numbers()
    assert not needs_renewal(pair)


def test_a_certificate_for_another_key_or_not_pem_is_refused():
    ca = new_ca("ca")
    key = ec.generate_private_key(ec.SECP256R1())
    other = ec.generate_private_key(ec.SECP256R1())
    cert = sign(ca.certificate, load_key(ca), other.public_key())
    with pytest.raises(ValueError, match="another key"):
        serving_pair(cert.public_bytes(serialization.Encoding.PEM), key)
    with pytest.raises(ValueError, match="not PEM"):
        serving_pair(b"garbage", key)


# -- the agent CA's certificate, files and callbacks ---------------------------------------------


def certificates(tmp_path, *, ca, signer="none", addresses=ADDRESSES) -> KubeletCertificates:
    return KubeletCertificates(
        client=None,  # never used: the signer is off
        node_name="vk-target1",
        addresses=addresses,
        signer=signer,
        cert_dir=tmp_path / "certs",
        ca=ca,
    )


@pytest.mark.parametrize("signer", ["none", "None", "", None])
async def test_signer_off_goes_straight_to_the_agent_ca(tmp_path, signer):
    ca = new_ca("agent-ca")
    manager = certificates(tmp_path, ca=ca, signer=signer)
    reloaded = []
    manager.on_reload(lambda cert, key: reloaded.append((cert, key)))
    await manager.obtain()

    assert manager.issuer == ISSUER_AGENT_CA
    assert manager.fallback_reason == "no signer is configured"
    assert reloaded == [(manager.cert_file, manager.key_file)]
    cert = x509.load_pem_x509_certificate(manager.cert_file.read_bytes())
    assert cert.issuer == ca.certificate.subject
    ca.certificate.public_key().verify(
        cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
    )
    assert names(cert, NameOID.COMMON_NAME) == ["system:node:vk-target1"]
    assert names(cert, NameOID.ORGANIZATION_NAME) == ["system:nodes"]
    ips, dns = sans(cert)
    assert ips == [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("fd00::1")]
    assert dns == ["agent.example.com"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    key = serialization.load_pem_private_key(manager.key_file.read_bytes(), password=None)
    assert key.public_key() == cert.public_key()
    assert stat.S_IMODE(manager.key_file.stat().st_mode) == 0o600
    assert manager.serving is not None
    assert manager.serving.cert_pem == manager.cert_file.read_bytes()


async def test_the_ca_may_be_loaded_only_when_needed(tmp_path):
    ca = new_ca("agent-ca")
    calls = []

    async def load_ca() -> KeyPair:
        calls.append(1)
        return ca

    manager = certificates(tmp_path, ca=load_ca)
    await manager.obtain()
    assert calls == [1]
    assert manager.serving.certificate.issuer == ca.certificate.subject


async def test_a_new_certificate_replaces_the_files_and_keeps_the_key_private(tmp_path):
    manager = certificates(tmp_path, ca=new_ca("agent-ca"))
    await manager.obtain()
    first = manager.cert_file.read_bytes()
    manager.key_file.chmod(0o644)
    await manager.obtain()
    assert manager.cert_file.read_bytes() != first
    assert stat.S_IMODE(manager.key_file.stat().st_mode) == 0o600
    assert sorted(p.name for p in manager.cert_dir.iterdir()) == ["tls.crt", "tls.key"]


async def test_without_a_ca_to_fall_back_on_it_says_why(tmp_path):
    manager = certificates(tmp_path, ca=None)
    with pytest.raises(KubeletCertificateError, match="no signer is configured"):
        await manager.obtain()
    assert not manager.cert_dir.exists()


def test_at_least_one_address_is_needed(tmp_path):
    with pytest.raises(ValueError, match="address"):
        certificates(tmp_path, ca=None, addresses=[])


def test_a_chart_shaped_name_fits_a_common_name():
    subject_of, Oid = kubelet_subject, NameOID
    # The chart's release full name and a Deployment's pod name, as the agent joins them.
    name = "multicluster-scheduler-multicluster-scheduler-7d9f8c6b5d-x2x9q"
    common_name = subject_of(name).get_attributes_for_oid(Oid.COMMON_NAME)[0].value
    assert len(common_name) <= 64
    assert common_name.startswith("system:node:multicluster-scheduler-")
    assert subject_of(name) == subject_of(name)
    other = subject_of(name.replace("x2x9q", "z7k4p")).get_attributes_for_oid(Oid.COMMON_NAME)
    assert other[0].value != common_name
    short = subject_of("mcs-agent-0").get_attributes_for_oid(Oid.COMMON_NAME)[0].value
    assert short == "system:node:mcs-agent-0"
    request = x509.load_pem_x509_csr(
        certificate_request(ec.generate_private_key(ec.SECP256R1()), name, ["10.0.0.1"])
    )
    assert request.subject.get_attributes_for_oid(Oid.COMMON_NAME)[0].value == common_name

"""The virtual kubelet's serving certificate from a real API server and controller manager:
the kubelet-serving signer signs what the agent approves itself, with the RBAC the chart grants
and nothing more; a signer nobody signs for, an approval RBAC refuses, or no signer at all
fall back to the agent's CA and say why; no CertificateSigningRequest is left behind."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import uuid

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from multicluster import Cluster, Resource
from multicluster.resources import CERTIFICATE_SIGNING_REQUESTS, CLUSTER_ROLE_BINDINGS
from multicluster_scheduler.virtual_kubelet.serving import (
    ISSUER_AGENT_CA,
    ISSUER_SIGNER,
    KUBELET_SERVING_SIGNER,
    KubeletCertificates,
)
from multicluster_scheduler.webhook.certificates import new_ca
from testbed import TestBed
from testbed.bed import kubeconfig

CLUSTER = "cluster1"
NODE = "mcs-e2e-virtual-node"
RBAC = "rbac.authorization.k8s.io"
CLUSTER_ROLES = Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False)
ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False
)


def rules(approve_for: str) -> list[dict]:
    """What the agent needs to get its serving certificate from ``approve_for`` (the chart's
    rules): no list, no update of the CSR itself, approval for that signer only."""
    group = ["certificates.k8s.io"]
    return [
        {
            "apiGroups": group,
            "resources": ["certificatesigningrequests"],
            "verbs": ["create", "get", "watch", "delete"],
        },
        {
            "apiGroups": group,
            "resources": ["certificatesigningrequests/approval"],
            "verbs": ["update"],
        },
        {
            "apiGroups": group,
            "resources": ["signers"],
            "resourceNames": [approve_for],
            "verbs": ["approve"],
        },
    ]


@pytest.fixture
async def admin(connect):
    return connect(CLUSTER).client


@pytest.fixture
def prefix() -> str:
    """A CSR name prefix of this test only, to find what it leaves behind."""
    return f"mcs-e2e-{uuid.uuid4().hex[:6]}"


async def leftovers(client, prefix: str) -> list[str]:
    csrs, _ = await client.list(CERTIFICATE_SIGNING_REQUESTS)
    return [c["metadata"]["name"] for c in csrs if c["metadata"]["name"].startswith(prefix)]


def issued_by(cert: x509.Certificate, issuer_pem: bytes) -> bool:
    try:
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(issuer_pem))
    except (ValueError, TypeError, x509.InvalidSignature):
        return False
    return True


def check_serving_certificate(manager: KubeletCertificates, issuer_pem: bytes) -> None:
    cert = x509.load_pem_x509_certificate(manager.cert_file.read_bytes())
    assert issued_by(cert, issuer_pem)
    subject = cert.subject
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [
        f"system:node:{NODE}"
    ]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def kubelet_certificates(client, tmp_path, prefix: str, **options) -> KubeletCertificates:
    return KubeletCertificates(
        client=client,
        node_name=NODE,
        addresses=["127.0.0.1"],
        cert_dir=tmp_path / "certs",
        csr_prefix=prefix,
        **options,
    )


@pytest.fixture
async def least_privileged(testbed: TestBed, admin):
    """``make(approve_for)``: a client as a user with only :func:`rules` (approval for the
    signer ``approve_for``), once RBAC says so; the user's RBAC removed afterwards."""
    made: list[tuple[str, Cluster]] = []

    async def make(approve_for: str) -> Cluster:
        name = f"mcs-e2e-kubelet-serving-{uuid.uuid4().hex[:6]}"
        cluster = testbed[CLUSTER]
        identity = cluster.ca.issue(name, client=True)
        config = kubeconfig(
            [
                {
                    "name": CLUSTER,
                    "server": cluster.server,
                    "ca": cluster.ca.cert_pem,
                    "cert": identity.cert_pem,
                    "key": identity.key_pem,
                }
            ]
        )
        user = Cluster.from_kubeconfig_data(name, json.dumps(config))
        made.append((name, user))
        await admin.create(
            CLUSTER_ROLES,
            {"metadata": {"name": name}, "rules": rules(approve_for)},
        )
        await admin.create(
            CLUSTER_ROLE_BINDINGS,
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": RBAC, "kind": "User", "name": name}],
            },
        )
        review = {
            "spec": {
                "resourceAttributes": {
                    "group": "certificates.k8s.io",
                    "resource": "certificatesigningrequests",
                    "verb": "watch",
                }
            }
        }
        for _ in range(50):
            answer = await user.client.create(ACCESS_REVIEWS, review)
            if answer["status"].get("allowed"):
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail(f"RBAC never allowed {name} to watch certificatesigningrequests")
        return user

    yield make
    for name, user in made:
        await user.stop()
        await admin.delete(CLUSTER_ROLE_BINDINGS, name, missing_ok=True)
        await admin.delete(CLUSTER_ROLES, name, missing_ok=True)


# -- tests --------------------------------------------------------------------------------------


async def test_the_kubelet_serving_signer_signs_what_the_agent_approves(
    testbed: TestBed, admin, tmp_path, prefix
):
    manager = kubelet_certificates(admin, tmp_path, prefix, signer=KUBELET_SERVING_SIGNER, ca=None)
    reloaded = []
    manager.on_reload(lambda cert, key: reloaded.append(cert))
    await manager.obtain()

    assert manager.issuer == ISSUER_SIGNER
    assert manager.fallback_reason is None
    check_serving_certificate(manager, testbed[CLUSTER].ca.cert_pem)
    assert reloaded == [manager.cert_file]
    assert await leftovers(admin, prefix) == []


async def test_with_the_least_rbac_the_signer_signs(
    testbed: TestBed, admin, least_privileged, tmp_path, prefix
):
    user = await least_privileged(KUBELET_SERVING_SIGNER)
    manager = kubelet_certificates(user.client, tmp_path, prefix, ca=None)
    await manager.obtain()

    assert manager.issuer == ISSUER_SIGNER, manager.fallback_reason
    check_serving_certificate(manager, testbed[CLUSTER].ca.cert_pem)
    assert await leftovers(admin, prefix) == []


async def test_approval_refused_by_rbac_falls_back_to_the_agent_ca(
    admin, least_privileged, tmp_path, prefix, caplog
):
    user = await least_privileged("example.com/some-other-signer")
    ca = new_ca("agent-ca")
    manager = kubelet_certificates(user.client, tmp_path, prefix, ca=ca)
    with caplog.at_level(logging.WARNING):
        await manager.obtain()

    assert manager.issuer == ISSUER_AGENT_CA
    assert "approving it was refused: 403" in manager.fallback_reason
    assert KUBELET_SERVING_SIGNER in manager.fallback_reason
    check_serving_certificate(manager, ca.cert_pem)
    assert any(f"signer={KUBELET_SERVING_SIGNER}" in r.getMessage() for r in caplog.records)
    assert await leftovers(admin, prefix) == []


async def test_a_signer_nobody_signs_for_falls_back_after_the_timeout(
    admin, tmp_path, prefix, caplog
):
    ca = new_ca("agent-ca")
    signer = "example.com/never-signed"
    manager = kubelet_certificates(admin, tmp_path, prefix, signer=signer, ca=ca, timeout=2.0)
    started = asyncio.get_running_loop().time()
    with caplog.at_level(logging.WARNING):
        await manager.obtain()

    assert 2.0 <= asyncio.get_running_loop().time() - started < 10.0
    assert manager.issuer == ISSUER_AGENT_CA
    assert "not signed within 2s" in manager.fallback_reason
    assert signer in manager.fallback_reason
    assert prefix in manager.fallback_reason
    check_serving_certificate(manager, ca.cert_pem)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"csr={prefix}" in w and f"signer={signer}" in w for w in warnings)
    assert await leftovers(admin, prefix) == []


async def test_no_signer_goes_straight_to_the_agent_ca(admin, tmp_path, prefix):
    ca = new_ca("agent-ca")
    manager = kubelet_certificates(admin, tmp_path, prefix, signer="none", ca=ca)
    started = asyncio.get_running_loop().time()
    await manager.obtain()

    assert asyncio.get_running_loop().time() - started < 1.0
    assert manager.issuer == ISSUER_AGENT_CA
    assert manager.fallback_reason == "no signer is configured"
    check_serving_certificate(manager, ca.cert_pem)

"""Test-bed pieces that need no cluster: option parsing, kubeconfigs, certificates, ports."""

from __future__ import annotations

import argparse
import base64

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from multicluster.pki import CertificateAuthority
from testbed.__main__ import parse_specs
from testbed.bed import free_ports, kubeconfig


def _args(**overrides) -> argparse.Namespace:
    values = dict(
        clusters="cluster1,cluster2",
        nodes=2,
        node_cpu="4",
        node_memory="8Gi",
        node_pods="50",
        node_label=[],
        real_nodes=False,
        argo=False,
    )
    return argparse.Namespace(**(values | overrides))


def test_real_nodes_are_asked_for_every_cluster():
    assert [s.real_node for s in parse_specs(_args())] == [False, False]
    assert [s.real_node for s in parse_specs(_args(real_nodes=True))] == [True, True]


def test_argo_runs_in_the_first_cluster_only():
    assert [s.argo for s in parse_specs(_args())] == [False, False]
    assert [s.argo for s in parse_specs(_args(argo=True))] == [True, False]


def test_node_labels_apply_to_one_cluster_or_all():
    specs = parse_specs(
        _args(node_label=["cluster2:topology.kubernetes.io/region=eu", "tier=gold"])
    )
    assert [s.name for s in specs] == ["cluster1", "cluster2"]
    assert specs[0].node_labels == {"tier": "gold"}
    assert specs[1].node_labels == {"topology.kubernetes.io/region": "eu", "tier": "gold"}
    assert specs[1].allocatable == {"cpu": "4", "memory": "8Gi", "pods": "50"}
    assert specs[0].allocatable is not specs[1].allocatable


@pytest.mark.parametrize("clusters", ["a,a", "", "UPPER", "under_score", "x" * 40])
def test_bad_cluster_names_are_refused(clusters):
    with pytest.raises(SystemExit, match="--clusters"):
        parse_specs(_args(clusters=clusters))


@pytest.mark.parametrize("label", ["nokey", "cluster3:a=b", "cluster1:=x"])
def test_bad_node_labels_are_refused_with_the_reason(label):
    with pytest.raises(SystemExit, match="--node-label"):
        parse_specs(_args(node_label=[label]))


def test_kubeconfig_has_one_context_per_cluster():
    entries = [
        {"name": n, "server": f"https://127.0.0.1:{p}", "ca": b"CA", "cert": b"C", "key": b"K"}
        for n, p in (("cluster1", 1), ("cluster2", 2))
    ]
    config = kubeconfig(entries)
    assert [c["name"] for c in config["contexts"]] == ["cluster1", "cluster2"]
    assert config["contexts"][1]["context"] == {"cluster": "cluster2", "user": "cluster2"}
    assert config["clusters"][1]["cluster"]["server"] == "https://127.0.0.1:2"
    user = config["users"][0]["user"]
    assert base64.b64decode(user["client-key-data"]) == b"K"


def test_issued_certificates_chain_to_the_ca_with_the_right_usages():
    ca = CertificateAuthority.new("test-ca", path_length=None)
    pair = ca.issue("system:kube-scheduler", organizations=("system:masters",), client=True)
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        "system:kube-scheduler"
    )
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == (
        "system:masters"
    )
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]

    server = x509.load_pem_x509_certificate(
        ca.issue("apiserver", hosts=("localhost", "127.0.0.1"), server=True).cert_pem
    )
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_free_ports_are_distinct():
    ports = free_ports(12)
    assert len(set(ports)) == 12


def test_the_chart_values_for_real_nodes_match_their_label_and_taint():
    """The file users copy (`-f testbed/realnode/chart-values.yaml`) and what the in-cluster tests
    install are one, and name the label and taint that real nodes register with."""
    from testbed.incluster import chart_values, install_command
    from testbed.realnode import REAL_NODE_KEY

    values = chart_values("localhost/multicluster-scheduler:0.1.0-abc")
    assert values["image"] == {"repository": "localhost/multicluster-scheduler", "tag": "0.1.0-abc"}
    assert values["agent"]["nodeSelector"] == {REAL_NODE_KEY: "true"}
    assert values["agent"]["tolerations"] == [
        {"key": REAL_NODE_KEY, "operator": "Exists", "effect": "NoSchedule"}
    ]
    command = install_command("localhost/multicluster-scheduler:0.1.0-abc", ["c1", "c2"])
    assert "-f testbed/realnode/chart-values.yaml" in command
    assert command.endswith("--set image.tag=0.1.0-abc\ndone")

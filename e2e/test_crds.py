"""The CRDs on a real API server: the guide's manifests apply unchanged, invalid ones are
refused with a message that says what is wrong, and kubectl shows useful columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import TestBed, guide, wait_for
from testbed.kubectl import Kubectl

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = "cluster2"


@pytest.fixture(scope="module")
def crds(testbed: TestBed, kubectl: Kubectl) -> Kubectl:
    kubectl(CONTEXT, "apply", "--server-side", "-f", str(ROOT / "crds"))
    kubectl(
        CONTEXT, "wait", "--for=condition=Established", "--timeout=60s", "-f", str(ROOT / "crds")
    )
    wait_for(
        lambda: kubectl.run(CONTEXT, "get", "targets", "-A", check=False).returncode == 0,
        timeout=30,
        what="targets served",
    )
    return kubectl


def test_the_guide_manifests_apply_unchanged(crds: Kubectl, namespace: str):
    for manifest in (
        guide.source(namespace),
        guide.targets(namespace),
        guide.CLUSTER_SOURCE,
        guide.CLUSTER_TARGETS,
    ):
        crds.apply(CONTEXT, manifest)
    try:
        target = crds.json(CONTEXT, "get", "target", "c2", "-n", namespace)
        assert target["spec"]["kubeconfigSecret"] == {"name": "c2", "key": "config"}
        table = crds(CONTEXT, "get", "tg", "-n", namespace)
        assert table.split("\n")[0].split() == ["NAME", "SELF", "SECRET", "READY", "REASON", "AGE"]
        assert crds(CONTEXT, "get", "ctg", "c1", "-o", "jsonpath={.spec.self}") == "true"
        assert crds(CONTEXT, "get", "csrc", "c1", "-o", "jsonpath={.spec.serviceAccount.name}") == (
            "c1"
        )
        assert crds(CONTEXT, "get", "src", "c1", "-n", namespace, "-o", "name") == (
            "source.multicluster.admiralty.io/c1\n"
        )
        explained = crds(CONTEXT, "explain", "target.spec.kubeconfigSecret.key")
        assert "Key of the kubeconfig in the Secret." in explained
    finally:
        crds(CONTEXT, "delete", "clustertarget", "c1", "c2", "--ignore-not-found")
        crds(CONTEXT, "delete", "clustersource", "c1", "--ignore-not-found")


def invalid_target(namespace: str, spec: str, kind: str = "Target") -> str:
    meta = f"  namespace: {namespace}\n" if kind == "Target" else ""
    return (
        f"apiVersion: multicluster.admiralty.io/v1alpha1\nkind: {kind}\nmetadata:\n"
        f"  name: bad\n{meta}spec:\n{spec}"
    )


@pytest.mark.parametrize(
    ("kind", "spec", "message"),
    [
        ("Target", "  self: true\n  kubeconfigSecret:\n    name: c2\n", "exactly one of spec.self"),
        ("Target", "  self: false\n", "exactly one of spec.self"),
        ("Target", "  {}\n", "exactly one of spec.self"),
        (
            "ClusterTarget",
            "  self: true\n  kubeconfigSecret:\n    name: c2\n    namespace: a\n",
            "exactly one of spec.self",
        ),
        (
            "Target",
            '  self: "yes"\n',
            'spec.self: Invalid value: "string": spec.self in body must be of type boolean',
        ),
        (
            "Target",
            "  kubeconfigSecret:\n    key: config\n",
            "spec.kubeconfigSecret.name: Required",
        ),
        (
            "ClusterTarget",
            "  kubeconfigSecret:\n    name: c2\n",
            "spec.kubeconfigSecret.namespace: Required",
        ),
        ("Target", "  kubeconfigSecret: c2\n", "spec.kubeconfigSecret: Invalid value"),
    ],
)
def test_invalid_targets_are_refused_with_the_reason(
    crds: Kubectl, namespace: str, kind: str, spec: str, message: str
):
    proc = crds.run(
        CONTEXT, "apply", "-f", "-", stdin=invalid_target(namespace, spec, kind), check=False
    )
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_invalid_source_and_summary_fields_are_refused(crds: Kubectl, namespace: str):
    source = (
        "apiVersion: multicluster.admiralty.io/v1alpha1\nkind: ClusterSource\nmetadata:\n"
        "  name: bad\nspec:\n  serviceAccount:\n    name: c1\n"
    )
    proc = crds.run(CONTEXT, "apply", "-f", "-", stdin=source, check=False)
    assert "spec.serviceAccount.namespace: Required value" in proc.stderr, proc.stderr
    summary = (
        "apiVersion: multicluster.admiralty.io/v1alpha1\nkind: ClusterSummary\nmetadata:\n"
        "  name: bad\nallocatable:\n  cpu: lots\n"
    )
    proc = crds.run(CONTEXT, "apply", "-f", "-", stdin=summary, check=False)
    assert "allocatable.cpu" in proc.stderr, proc.stderr

"""The user guide's topology on the test bed: cluster1 is a source and its own target (``c1``),
cluster2 a target (``c2``), connected as the guide does it, with RBAC made by hand where the
Source controller would make it."""

from __future__ import annotations

import base64
import json

from testbed import TestBed, guide, wait_for
from testbed.kubectl import Kubectl

SOURCE, TARGET = "cluster1", "cluster2"


def grant_source(kubectl: Kubectl, namespace: str) -> None:
    """The guide's alternative to the Source controller: a service account and bindings."""
    kubectl.apply(
        TARGET,
        f"""apiVersion: v1
kind: ServiceAccount
metadata:
  name: c1
  namespace: {namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: admiralty-source-c1
  namespace: {namespace}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: multicluster-scheduler-source
subjects:
  - kind: ServiceAccount
    name: c1
    namespace: {namespace}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: admiralty-source-{namespace}-c1-cluster-summary-viewer
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: multicluster-scheduler-cluster-summary-viewer
subjects:
  - kind: ServiceAccount
    name: c1
    namespace: {namespace}
""",
    )


def kubeconfig_for(testbed: TestBed, token: str, server: str | None = None) -> str:
    cluster = testbed[TARGET]
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "c2",
                    "cluster": {
                        "server": server or cluster.server,
                        "certificate-authority-data": base64.b64encode(
                            cluster.ca.cert_pem
                        ).decode(),
                    },
                }
            ],
            "users": [{"name": "c1", "user": {"token": token}}],
            "contexts": [{"name": "c2", "context": {"cluster": "c2", "user": "c1"}}],
            "current-context": "c2",
        }
    )


def secret(name: str, namespace: str, data: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "stringData": data,
    }


def node_ready(kubectl: Kubectl, name: str) -> str | None:
    proc = kubectl.run(SOURCE, "get", "node", name, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    for condition in json.loads(proc.stdout).get("status", {}).get("conditions") or ():
        if condition["type"] == "Ready":
            return condition["status"]
    return None


def connect(kubectl: Kubectl, testbed: TestBed, namespace: str, timeout: float = 30) -> list[str]:
    """Targets c1 (self) and c2 in ``namespace`` of cluster1, Ready; returns their nodes."""
    grant_source(kubectl, namespace)
    token = kubectl(TARGET, "create", "token", "c1", "-n", namespace, "--duration=2h").strip()
    kubectl.apply(SOURCE, secret("c2", namespace, {"config": kubeconfig_for(testbed, token)}))
    kubectl.apply(SOURCE, guide.targets(namespace))
    nodes = [f"admiralty-namespace-{namespace}-c1", f"admiralty-namespace-{namespace}-c2"]
    for node in nodes:
        wait_for(lambda n=node: node_ready(kubectl, n) == "True", timeout, what=f"{node} Ready")
    return nodes


def disconnect(kubectl: Kubectl, namespace: str) -> None:
    kubectl(SOURCE, "delete", "targets", "--all", "-n", namespace, "--wait=false")
    kubectl(
        TARGET,
        "delete",
        "clusterrolebinding",
        f"admiralty-source-{namespace}-c1-cluster-summary-viewer",
        "--ignore-not-found",
    )

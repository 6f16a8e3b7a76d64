"""The objects export and join write, and the names they are given by default.

Sources and Targets are built from the API models, so what join creates is exactly what the
user guide's manifests say. A Secret printed by export has no namespace: ``kubectl -n NS
apply -f -`` puts it wherever the Target is.
"""

from __future__ import annotations

import base64
import re

import yaml

from ..api.v1alpha1 import (
    ClusterKubeconfigSecretReference,
    ClusterSource,
    ClusterSourceSpec,
    ClusterTarget,
    ClusterTargetSpec,
    KubeconfigSecretReference,
    ServiceAccountReference,
    Source,
    SourceSpec,
    Target,
    TargetSpec,
)
from .problems import ConnectError

DNS_LABEL_LENGTH = 63
# On what export and join write outside the API's own kinds (token and kubeconfig Secrets).
MANAGED_BY = "app.kubernetes.io/managed-by"
CREATED_BY = {MANAGED_BY: "multicluster-scheduler"}
_NOT_DNS = re.compile(r"[^a-z0-9-]+")


def name_from_context(context: str) -> str:
    """A DNS-1123 label naming a cluster after its kubeconfig context.

    ``cluster1`` stays, ``gke_project_zone_prod`` becomes ``gke-project-zone-prod``, an EKS
    ARN ``arn:aws:eks:…:cluster/prod`` becomes ``prod``, ``kind-c1`` stays ``kind-c1``.
    """
    tail = context.rsplit("/", 1)[-1]
    name = _NOT_DNS.sub("-", tail.lower()).strip("-")
    name = re.sub("-{2,}", "-", name)[:DNS_LABEL_LENGTH].rstrip("-")
    if not name:
        raise ConnectError(f"cannot derive a name from context {context!r}: give one with --name")
    return name


def check_dns_label(name: str, option: str) -> str:
    if len(name) > DNS_LABEL_LENGTH or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
        raise ConnectError(
            f"{option} {name!r} is not a DNS-1123 label (lower-case letters, digits and '-', "
            f"starting and ending with a letter or digit, at most {DNS_LABEL_LENGTH} characters)"
        )
    return name


def kubeconfig_secret(
    name: str, kubeconfig: dict, *, key: str = "config", namespace: str | None = None
) -> dict:
    """A Secret holding ``kubeconfig`` (as YAML) under ``key``, labelled as ours (so that join
    knows it may overwrite it)."""
    text = yaml.safe_dump(kubeconfig, sort_keys=False)
    metadata: dict = {"name": name, "labels": dict(CREATED_BY)}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {key: base64.b64encode(text.encode()).decode()},
    }


def source(name: str, namespace: str, service_account: str) -> dict:
    """A Source: the service account, in its namespace, that a source cluster uses."""
    model = Source(
        metadata={"name": name, "namespace": namespace},
        spec=SourceSpec(serviceAccountName=service_account),
    )
    return _dump(model)


def cluster_source(name: str, service_account: str, service_account_namespace: str) -> dict:
    model = ClusterSource(
        metadata={"name": name},
        spec=ClusterSourceSpec(
            serviceAccount=ServiceAccountReference(
                name=service_account, namespace=service_account_namespace
            )
        ),
    )
    return _dump(model)


def target(name: str, namespace: str, *, secret: str | None, key: str = "config") -> dict:
    """A Target reaching a cluster with the kubeconfig Secret ``secret``, or itself (None)."""
    spec = (
        TargetSpec(kubeconfigSecret=KubeconfigSecretReference(name=secret, key=key))
        if secret
        else TargetSpec(self=True)
    )
    return _dump(Target(metadata={"name": name, "namespace": namespace}, spec=spec))


def cluster_target(
    name: str, *, secret: str | None, secret_namespace: str, key: str = "config"
) -> dict:
    spec = (
        ClusterTargetSpec(
            kubeconfigSecret=ClusterKubeconfigSecretReference(
                name=secret, namespace=secret_namespace, key=key
            )
        )
        if secret
        else ClusterTargetSpec(self=True)
    )
    return _dump(ClusterTarget(metadata={"name": name}, spec=spec))


def _dump(model: Source | ClusterSource | Target | ClusterTarget) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True)


def to_yaml(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=False)

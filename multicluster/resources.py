"""Resource descriptors: how to address a kind over REST (group, version, plural, scope)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
SERVICES = Resource("", "v1", "services", "Service")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
EVENTS = Resource("", "v1", "events", "Event")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
JOBS = Resource("batch", "v1", "jobs", "Job")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
INGRESSES = Resource("networking.k8s.io", "v1", "ingresses", "Ingress")
CERTIFICATE_SIGNING_REQUESTS = Resource(
    "certificates.k8s.io", "v1", "certificatesigningrequests", "CertificateSigningRequest", False
)
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTER_ROLE_BINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False
)
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
CRDS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)

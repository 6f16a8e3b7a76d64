"""The user guide's manifests, verbatim: its nginx Deployment, Source, ClusterSource, Target and
ClusterTarget; and how to tell that a pod runs. The tests, the benchmarks and the demo use these,
so that what they run is what the guide shows."""

from __future__ import annotations

import yaml

from multicluster_scheduler.api.keys import ELECT

# The node label of the guide's "Advanced Scheduling": cluster1's nodes in us, cluster2's in eu.
REGION = "topology.kubernetes.io/region"


def nginx(replicas: int = 10, name: str = "nginx", elect: bool = True, cpu: str = "100m") -> str:
    """The guide's Deployment (its exact manifest with the defaults); ``cpu`` smaller to fit
    thousands of replicas, ``elect=False`` for the same Deployment scheduled natively."""
    annotations = f'\n      annotations:\n        {ELECT}: ""' if elect else ""
    return f"""apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}{annotations}
    spec:
      containers:
      - name: nginx
        image: nginx
        resources:
          requests:
            cpu: {cpu}
            memory: 32Mi
        ports:
        - containerPort: 80
"""


def nginx_object(
    replicas: int = 10, name: str = "nginx", elect: bool = True, cpu: str = "100m"
) -> dict:
    """:func:`nginx` as an object, for API clients."""
    return yaml.safe_load(nginx(replicas, name, elect, cpu))


def condition(pod: dict, kind: str) -> dict:
    """The pod's condition of type ``kind`` ({} when it has none)."""
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return c
    return {}


def running_and_ready(pod: dict) -> bool:
    """Running, and Ready: what a Deployment counts as available."""
    return (pod.get("status") or {}).get("phase") == "Running" and condition(pod, "Ready").get(
        "status"
    ) == "True"


def source(namespace: str) -> str:
    return f"""apiVersion: multicluster.admiralty.io/v1alpha1
kind: Source
metadata:
  name: c1
  namespace: {namespace}
spec:
  serviceAccountName: c1
"""


CLUSTER_SOURCE = """apiVersion: multicluster.admiralty.io/v1alpha1
kind: ClusterSource
metadata:
  name: c1
spec:
  serviceAccount:
    name: c1
    namespace: admiralty
"""


def targets(namespace: str) -> str:
    return f"""apiVersion: multicluster.admiralty.io/v1alpha1
kind: Target
metadata:
  name: c2
  namespace: {namespace}
spec:
  kubeconfigSecret:
    name: c2
---
apiVersion: multicluster.admiralty.io/v1alpha1
kind: Target
metadata:
  name: c1
  namespace: {namespace}
spec:
  self: true
"""


CLUSTER_TARGETS = """apiVersion: multicluster.admiralty.io/v1alpha1
kind: ClusterTarget
metadata:
  name: c2
spec:
  kubeconfigSecret:
    name: c2
    namespace: admiralty
---
apiVersion: multicluster.admiralty.io/v1alpha1
kind: ClusterTarget
metadata:
  name: c1
spec:
  self: true
"""

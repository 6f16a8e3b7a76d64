"""The user guide's Source, ClusterSource, Target and ClusterTarget manifests, verbatim."""

from __future__ import annotations


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

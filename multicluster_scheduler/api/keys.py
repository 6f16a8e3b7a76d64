"""Well-known names, labels, annotations and finalizers: what users' manifests and scripts
rely on (the original project's keys, unchanged)."""

from __future__ import annotations

GROUP = "multicluster.admiralty.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PREFIX = f"{GROUP}/"


def _owner_labels(kind: str) -> tuple[str, str, str]:
    """The labels that say which object of ``kind`` an object stands for or was made for: its
    namespace and name, or the name of its cluster-scoped twin (for ``target``:
    ``target-namespace``, ``target-name`` and ``cluster-target-name``, prefixed)."""
    return PREFIX + f"{kind}-namespace", PREFIX + f"{kind}-name", PREFIX + f"cluster-{kind}-name"


# Opting in.
ELECT = PREFIX + "elect"
NAMESPACE_ENABLED_LABEL = "multicluster-scheduler"
NAMESPACE_ENABLED_VALUE = "enabled"

# Proxy pods.
SOURCEPOD_MANIFEST = PREFIX + "sourcepod-manifest"
# Next to it: the proof that the webhook saved that manifest, for that namespace (api.manifest_mac).
SOURCEPOD_MANIFEST_MAC = PREFIX + "sourcepod-manifest-mac"
# On a proxy pod: the keys of the annotations it got from its delegate (comma-separated), the
# only ones a target may change later; the pod's own are never changed from a target.
MIRRORED_ANNOTATIONS = PREFIX + "mirrored-annotations"
PROXY_SCHEDULER_NAME = "admiralty-proxy"
# What a proxy pod asks of virtual nodes: a PodSpec fragment, or the pod's own constraints (then
# taken off its delegate); no-reservation is what this scheduler always does (upstream v0.13).
PROXY_POD_SCHEDULING_CONSTRAINTS = PREFIX + "proxy-pod-scheduling-constraints"
USE_CONSTRAINTS_FROM_SPEC = PREFIX + "use-constraints-from-spec-for-proxy-pod-scheduling"
NO_RESERVATION = PREFIX + "no-reservation"
# Labels (of a pod, or entries of a Service's selector) whose key=value this regexp matches are
# copied to delegates as they are, not prefixed (upstream v0.17).
NO_PREFIX_LABEL_REGEXP = PREFIX + "no-prefix-label-regexp"

# Virtual nodes.
PROVIDER_KEY = "virtual-kubelet.io/provider"
PROVIDER = "admiralty"
TARGET_NAMESPACE_LABEL, TARGET_NAME_LABEL, CLUSTER_TARGET_NAME_LABEL = _owner_labels("target")

# Cross-cluster references and garbage collection: those of the runtime's ParentReferences
# (multicluster.gc), written out here because the webhook's process loads this module without
# the runtime (tests/api/test_keys.py checks they are the same).
PARENT_UID = PREFIX + "parent-uid"
PARENT_NAME = PREFIX + "parent-name"
PARENT_NAMESPACE = PREFIX + "parent-namespace"
PARENT_CLUSTER_NAME = PREFIX + "parent-cluster-name"
FINALIZER = PREFIX + "multiclusterForegroundDeletion"
HAS_FINALIZER = PREFIX + "has-finalizer"

# Services.
IS_DELEGATE = PREFIX + "is-delegate"
CILIUM_GLOBAL_SERVICE = "io.cilium/global-service"
GLOBAL = PREFIX + "global"
ORIGINAL_SELECTOR = PREFIX + "original-selector"

# RBAC that sources are bound to in targets (names the user guide uses).
SOURCE_CLUSTER_ROLE = "multicluster-scheduler-source"
CLUSTER_SUMMARY_VIEWER_CLUSTER_ROLE = "multicluster-scheduler-cluster-summary-viewer"
# Labels on the service accounts and bindings the source controller makes: whose they are.
SOURCE_NAMESPACE_LABEL, SOURCE_NAME_LABEL, CLUSTER_SOURCE_NAME_LABEL = _owner_labels("source")

CLUSTER_SUMMARY_NAME = "singleton"

"""The virtual node of a target: what it looks like (pure functions, no I/O).

Proxy pods are bound to these nodes. The provider label and NoSchedule taint keep other pods
away; the target's labels and the labels common to all its real nodes (its region, say) let
users and schedulers tell targets apart; capacity and allocatable come from its summary.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .. import __version__
from ..api import keys

ROLE_LABEL = "kubernetes.io/role"
EXCLUDE_FROM_LB = "node.kubernetes.io/exclude-from-external-load-balancers"
PER_NODE_LABELS = ("kubernetes.io/hostname",)
# The API server (1.36+) passes kubectl's exec/attach WebSockets through to kubelets that
# declare this, instead of translating them to SPDY: our kubelet API speaks WebSocket only.
DECLARED_FEATURES = ["ExtendWebSocketsToKubelet"]


def common_labels(summary: dict | None) -> dict[str, str]:
    """Labels that every real node of the target carries, with the same value."""
    groups = (summary or {}).get("nodeGroups") or []
    if not groups:
        return {}
    shared = dict(groups[0].get("labels") or {})
    for group in groups[1:]:
        labels = group.get("labels") or {}
        shared = {k: v for k, v in shared.items() if labels.get(k) == v}
    return {k: v for k, v in shared.items() if k not in PER_NODE_LABELS}


def node_labels(name: str, target_labels: dict[str, str], summary: dict | None) -> dict[str, str]:
    return {
        **common_labels(summary),
        "type": "virtual-kubelet",
        ROLE_LABEL: "cluster",
        EXCLUDE_FROM_LB: "",
        keys.PROVIDER_KEY: keys.PROVIDER,
        "kubernetes.io/hostname": name,
        **target_labels,
    }


def node_object(
    name: str, target_labels: dict[str, str], summary: dict | None, owner: dict | None = None
) -> dict:
    """``owner``: an owner reference to a cluster-scoped object of the release (so that
    uninstalling garbage-collects the node even if no agent is left to delete it)."""
    metadata: dict[str, Any] = {"name": name, "labels": node_labels(name, target_labels, summary)}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": {
            "taints": [{"key": keys.PROVIDER_KEY, "value": keys.PROVIDER, "effect": "NoSchedule"}]
        },
    }


def node_status(
    summary: dict | None,
    ready: bool,
    reason: str,
    message: str,
    *,
    address: str,
    port: int,
    previous: dict | None = None,
    now: dt.datetime | None = None,
    features: list[str] | None = None,
) -> dict[str, Any]:
    """The node's status; transition times carried over from ``previous`` when unchanged."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = {c["type"]: c for c in (previous or {}).get("conditions") or ()}

    def condition(kind: str, status: str, why: str, text: str) -> dict:
        before = old.get(kind)
        return {
            "type": kind,
            "status": status,
            "reason": why,
            "message": text,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": before["lastTransitionTime"]
            if before and before.get("status") == status
            else stamp,
        }

    resources = {
        "capacity": dict((summary or {}).get("capacity") or {}),
        "allocatable": dict((summary or {}).get("allocatable") or {}),
    }
    return {
        **resources,
        "conditions": [
            condition(
                "Ready",
                "True" if ready else "False",
                "TargetReady" if ready else f"Target{reason}",
                message,
            ),
            condition("MemoryPressure", "False", "TargetHasSufficientMemory", ""),
            condition("DiskPressure", "False", "TargetHasNoDiskPressure", ""),
            condition("PIDPressure", "False", "TargetHasSufficientPID", ""),
        ],
        "addresses": [{"type": "InternalIP", "address": address}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "declaredFeatures": list(DECLARED_FEATURES if features is None else features),
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": f"multicluster-scheduler-{__version__}",
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "",
            "kernelVersion": "",
            "osImage": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def status_differs(current: dict | None, desired: dict) -> bool:
    """Whether anything users or schedulers read changed (heartbeats aside)."""
    if current is None:
        return True

    # API servers before 1.35 (and 1.35 without the NodeDeclaredFeatures gate) drop
    # declaredFeatures: compared only where the server keeps it, or every pass would rewrite
    # the status for a field that never sticks. (Where it is new, the periodic write adds it.)
    features_kept = "declaredFeatures" in current

    def essence(status: dict) -> tuple:
        conditions = sorted(
            (c.get("type"), c.get("status"), c.get("reason"), c.get("message") or "")
            for c in status.get("conditions") or ()
        )
        return (
            status.get("capacity") or {},
            status.get("allocatable") or {},
            conditions,
            status.get("addresses") or [],
            status.get("daemonEndpoints") or {},
            (status.get("declaredFeatures") or []) if features_kept else None,
        )

    return essence(current) != essence(desired)

"""What a cluster offers, computed from its nodes and pods (pure functions, no I/O).

Totals of real nodes (virtual nodes excluded, so clusters that target each other do not count
each other twice), and node groups: nodes that look alike to a scheduler (same labels, minus
high-cardinality and excluded keys, and same taints) with their count, allocatable, requested
and the most of each resource free on a single node. A source filters targets on these groups
without any API call: a pod whose nodeSelector, affinity, tolerations or requests no group can
satisfy will not fit there.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from multicluster.sharing import SHARED

from ..api import keys
from ..api.quantity import add, format_list, parse_list
from ..api.summary import HIGH_CARDINALITY_LABELS, pod_requests

# Taints that come and go with a node's health; they would split groups for no lasting reason.
TRANSIENT_TAINT_PREFIX = "node.kubernetes.io/"
TERMINAL_PHASES = ("Succeeded", "Failed")


def is_virtual(node: dict) -> bool:
    labels = node["metadata"].get("labels") or {}
    return labels.get("type") == "virtual-kubelet" or keys.PROVIDER_KEY in labels


def slim_pod(pod: dict) -> dict:
    """What a summary counts of a pod: its node, phase and requests. Its spec and status are
    shared with equal ones (:data:`~multicluster.sharing.SHARED`; pods of one template on one
    node have equal ones): read-only."""
    meta, spec = pod["metadata"], pod.get("spec") or {}

    def requests(containers: Any) -> list[dict]:
        return [
            {
                "requests": ((c.get("resources") or {}).get("requests")) or {},
                "restartPolicy": c.get("restartPolicy"),
            }
            for c in containers or ()
        ]

    return {
        "metadata": {  # its own (a name is unique): only the strings are shared
            "name": SHARED.share(meta["name"]),
            "namespace": SHARED.share(meta.get("namespace")),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": SHARED.share(
            {
                "nodeName": spec.get("nodeName"),
                "containers": requests(spec.get("containers")),
                "initContainers": requests(spec.get("initContainers")),
                "overhead": spec.get("overhead") or {},
            }
        ),
        "status": SHARED.share({"phase": (pod.get("status") or {}).get("phase")}),
    }


def group_key(node: dict, exclude: re.Pattern | None) -> tuple:
    labels = node["metadata"].get("labels") or {}
    kept = tuple(
        sorted(
            (k, v)
            for k, v in labels.items()
            if k not in HIGH_CARDINALITY_LABELS and not (exclude and exclude.search(k))
        )
    )
    taints = tuple(
        sorted(
            (t["key"], t.get("value") or "", t["effect"])
            for t in (node.get("spec") or {}).get("taints") or ()
            if not t["key"].startswith(TRANSIENT_TAINT_PREFIX)
        )
    )
    return kept, taints


def counted(pod: dict) -> tuple[str, dict[str, Fraction]] | None:
    """The node a pod's requests count against, and those requests; None when they count
    nowhere (not bound yet, or finished)."""
    node = pod["spec"].get("nodeName")
    if not node or pod["status"].get("phase") in TERMINAL_PHASES:
        return None
    return node, {name: amount for name, amount in pod_requests(pod).items() if amount}


class RequestedLedger:
    """Requests per node, kept up to date pod event by pod event, so a summary costs a pass
    over nodes, not over every pod (10,000s of them in a busy cluster). Pods with equal
    requests on one node (one workload's, mostly) share one entry."""

    def __init__(self) -> None:
        self.by_node: dict[str, dict[str, Fraction]] = {}
        self._pods: dict[str, tuple[str, dict[str, Fraction]]] = {}
        self._entries: dict[tuple, list] = {}  # signature → [entry, pods holding it]

    def update(self, key: str, pod: dict | None) -> None:
        """Account for the pod's latest state (None: deleted)."""
        old = self._pods.pop(key, None)
        if old is not None:
            node, requests = old
            totals = self.by_node[node]
            for name, amount in requests.items():
                left = totals[name] - amount
                if left:
                    totals[name] = left
                else:
                    del totals[name]
            if not totals:
                del self.by_node[node]
            self._release(old)
        new = counted(pod) if pod is not None else None
        if new is not None:
            self._pods[key] = self._held(new)
            add(self.by_node.setdefault(new[0], {}), new[1])

    def _held(self, entry: tuple[str, dict[str, Fraction]]) -> tuple[str, dict[str, Fraction]]:
        held = self._entries.setdefault(_signature(entry), [entry, 0])
        held[1] += 1
        return held[0]

    def _release(self, entry: tuple[str, dict[str, Fraction]]) -> None:
        signature = _signature(entry)
        held = self._entries[signature]
        held[1] -= 1
        if not held[1]:
            del self._entries[signature]


def _signature(entry: tuple[str, dict[str, Fraction]]) -> tuple:
    node, requests = entry
    return (node, *sorted(requests.items()))


def summarize(
    nodes: list[dict], pods: list[dict], exclude: re.Pattern | None = None
) -> dict[str, Any]:
    """The ClusterSummary fields (capacity, allocatable, nodeGroups) for these objects."""
    ledger = RequestedLedger()
    for i, pod in enumerate(pods):
        ledger.update(str(i), pod)
    return summarize_nodes(nodes, ledger.by_node, exclude)


def summarize_nodes(
    nodes: list[dict],
    requested_by_node: dict[str, dict[str, Fraction]],
    exclude: re.Pattern | None = None,
) -> dict[str, Any]:
    """The ClusterSummary fields for these nodes, given the requests counted against each."""
    real = {n["metadata"]["name"]: n for n in nodes if not is_virtual(n)}
    requested = {name: requested_by_node.get(name, {}) for name in real}
    capacity: dict[str, Fraction] = {}
    allocatable: dict[str, Fraction] = {}
    groups: dict[tuple, dict[str, Any]] = {}
    for name, node in real.items():
        node_allocatable = parse_list(node["status"].get("allocatable"))
        add(capacity, parse_list(node["status"].get("capacity")))
        add(allocatable, node_allocatable)
        key = group_key(node, exclude)
        group = groups.setdefault(
            key, {"count": 0, "allocatable": {}, "requested": {}, "largestFree": {}}
        )
        group["count"] += 1
        add(group["allocatable"], node_allocatable)
        add(group["requested"], requested[name])
        for resource, amount in node_allocatable.items():
            free = amount - requested[name].get(resource, Fraction(0))
            current = group["largestFree"].get(resource)
            if current is None or free > current:
                group["largestFree"][resource] = free
    node_groups = []
    for (labels, taints), group in sorted(groups.items()):
        node_groups.append(
            {
                "labels": dict(labels),
                "taints": [
                    {"key": k, **({"value": v} if v else {}), "effect": e} for k, v, e in taints
                ],
                "count": group["count"],
                "allocatable": format_list(group["allocatable"]),
                "requested": format_list(group["requested"]),
                "largestFree": format_list(group["largestFree"]),
            }
        )
    return {
        "capacity": format_list(capacity),
        "allocatable": format_list(allocatable),
        "nodeGroups": node_groups,
    }

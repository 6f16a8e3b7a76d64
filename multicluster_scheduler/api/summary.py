"""What a ClusterSummary counts, shared by the cluster that writes it and the sources that read
it: a pod's effective requests, and the node labels that node groups leave out."""

from __future__ import annotations

from fractions import Fraction

from .quantity import add, parse_list

# Unique per node: grouping by them would make one group per node.
HIGH_CARDINALITY_LABELS = frozenset({"kubernetes.io/hostname"})


def pod_requests(pod: dict) -> dict[str, Fraction]:
    """Effective requests, as the scheduler counts them: the larger of the app containers (plus
    sidecars) and of any init container (plus the sidecars started before it), plus overhead;
    and one ``pods``."""
    spec = pod["spec"]
    total: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or ():
        requests = parse_list(container.get("requests"))
        if container.get("restartPolicy") == "Always":
            add(sidecars, requests)
            continue
        for name, value in requests.items():
            init_peak[name] = max(init_peak.get(name, Fraction(0)), value + sidecars.get(name, 0))
    for container in spec.get("containers") or ():
        add(total, parse_list(container.get("requests")))
    add(total, sidecars)
    for name, value in init_peak.items():
        total[name] = max(total.get(name, Fraction(0)), value)
    add(total, parse_list(spec.get("overhead")))
    total["pods"] = total.get("pods", Fraction(0)) + 1
    return total


def slim_node(node: dict) -> dict:
    """What is kept of a Node: what summaries count, and what the scheduler reads of a virtual
    node (cordon and taints). One informer of the agent's own cluster serves both."""
    meta, status = node["metadata"], node.get("status") or {}
    return {
        "metadata": {
            "name": meta["name"],
            "resourceVersion": meta.get("resourceVersion"),
            "labels": meta.get("labels") or {},
        },
        "spec": {
            "taints": (node.get("spec") or {}).get("taints") or [],
            "unschedulable": (node.get("spec") or {}).get("unschedulable") is True,
        },
        "status": {
            "capacity": status.get("capacity") or {},
            "allocatable": status.get("allocatable") or {},
        },
    }

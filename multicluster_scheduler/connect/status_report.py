"""What ``status`` reports, computed from objects listed in a source cluster (no I/O here).

A source cluster knows enough to say how its scheduling goes without asking any target: each
Target and ClusterTarget says whether it is Ready, and why not; each one's virtual node carries
the target's capacity and allocatable (from the target's ClusterSummary); proxy pods say where
their delegates are (the virtual node they are bound to) or why they are still Pending (their
``PodScheduled`` condition). This module turns those objects into one report, a plain dict
whose shape is the documented ``-o json`` schema (docs/reference.md), so that tables and
scripts read the same thing.

Use is counted from the proxy pods: the requests of those bound to a virtual node. A virtual
node's allocatable is the target's whole allocatable, not what is left of it: the summary's
per-group use is not on the node, and other pods in the target (its own, other sources') are
not visible from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from ..api.naming import virtual_node_name
from ..api.proxy import TERMINAL_PHASES, is_proxy
from ..api.quantity import add, format_list, parse_list
from ..api.summary import pod_requests
from .join import NO_STATUS_HINT, READY_HINTS, ready_condition

SCHEMA_VERSION = 1
# Exit codes (argparse's usage error is 2).
EXIT_READY = 0
EXIT_ERROR = 1
EXIT_NOT_READY = 3
# The owners a workload is named after, one level up: what made the ReplicaSet or Job.
RESOLVED_OWNERS = ("ReplicaSet", "Job")

# (kind, namespace, name) of a ReplicaSet or Job → (kind, name) of its own controller.
Controllers = dict[tuple[str, str, str], tuple[str, str]]


@dataclass
class Observed:
    """What was read in the source cluster. ``namespace`` None: all namespaces; ``nodes`` None:
    the virtual nodes could not be read."""

    context: str
    namespace: str | None
    targets: list[dict]
    cluster_targets: list[dict]
    nodes: list[dict] | None
    proxies: list[dict]
    controllers: Controllers = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def target_ref(kind: str, name: str, namespace: str | None) -> dict:
    return {"kind": kind, "namespace": namespace, "name": name}


def target_label(ref: dict | None, node: str) -> str:
    """How tables name a target: ``c1`` for a Target, ``clustertarget/c1`` for a ClusterTarget,
    ``node/NAME`` for a virtual node whose target is not listed (deleted, or out of scope)."""
    if ref is None:
        return f"node/{node}"
    return ref["name"] if ref["kind"] == "Target" else f"clustertarget/{ref['name']}"


def node_status(node: dict | None, readable: bool) -> str:
    if not readable:
        return "NotReadable"
    if node is None:
        return "NotFound"
    for condition in (node.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            status = condition.get("status")
            return "Ready" if status == "True" else "NotReady" if status == "False" else "Unknown"
    return "Unknown"


def proxy_requests(pod: dict) -> dict[str, Fraction]:
    """A proxy pod's requests as kube-scheduler counts them (its spec is the elected pod's:
    the webhook keeps containers and their resources); pod-level requests replace the sum."""
    spec = pod.get("spec") or {}

    def slim(containers: Iterable[dict] | None) -> list[dict]:
        return [
            {
                "requests": (c.get("resources") or {}).get("requests") or {},
                "restartPolicy": c.get("restartPolicy"),
            }
            for c in containers or ()
        ]

    total = pod_requests(
        {
            "spec": {
                "containers": slim(spec.get("containers")),
                "initContainers": slim(spec.get("initContainers")),
                "overhead": spec.get("overhead") or {},
            }
        }
    )
    total.update(parse_list((spec.get("resources") or {}).get("requests")))
    return total


def is_terminating(pod: dict) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def pod_scheduled(pod: dict) -> dict:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled":
            return condition
    return {}


def workload_of(pod: dict, controllers: Controllers) -> tuple[str, str]:
    """(kind, name) of what made the pod: its controller, or the controller of that
    (ReplicaSet → Deployment, Job → CronJob) when known; the pod itself when it has none."""
    meta = pod["metadata"]
    refs = meta.get("ownerReferences") or ()
    ref = next((r for r in refs if r.get("controller")), None)
    if ref is None:
        return "Pod", meta["name"]
    kind, name = ref.get("kind") or "?", ref.get("name") or "?"
    return controllers.get((kind, meta.get("namespace") or "", name), (kind, name))


def _target_entry(obj: dict, kind: str, node: dict | None, nodes_readable: bool) -> dict:
    meta = obj["metadata"]
    namespace = meta.get("namespace") if kind == "Target" else None
    condition = ready_condition(obj)
    ready = condition is not None and condition.get("status") == "True"
    if condition is None:
        reason = message = since = None
        hint: str | None = NO_STATUS_HINT
    else:
        reason = condition.get("reason") or None
        message = condition.get("message") or None
        since = condition.get("lastTransitionTime")
        hint = None if ready else READY_HINTS.get(reason or "")
    status = (node or {}).get("status") or {}
    return {
        **target_ref(kind, meta["name"], namespace),
        "self": bool((obj.get("spec") or {}).get("self")),
        "ready": ready,
        "status": "Unknown" if condition is None else condition.get("status") or "Unknown",
        "reason": reason,
        "message": message,
        "hint": hint,
        "lastTransitionTime": since,
        "virtualNode": {
            "name": virtual_node_name(meta["name"], namespace),
            "status": node_status(node, nodes_readable),
            "capacity": dict(status.get("capacity") or {}) if node else None,
            "allocatable": dict(status.get("allocatable") or {}) if node else None,
            "requested": {},
            "proxyPods": 0,
        },
    }


def _workload_entry(namespace: str, kind: str, name: str) -> dict:
    return {
        "namespace": namespace,
        "kind": kind,
        "name": name,
        "pods": 0,
        "placed": [],
        "pending": 0,
        "pendingReasons": [],
        "succeeded": 0,
        "failed": 0,
        "terminating": 0,
    }


def build_report(observed: Observed) -> dict:
    """The report (the ``-o json`` document) of what was observed."""
    nodes = {n["metadata"]["name"]: n for n in observed.nodes or ()}
    readable = observed.nodes is not None
    listed = [(t, "Target") for t in sorted(observed.targets, key=_namespace_name)]
    listed += [(t, "ClusterTarget") for t in sorted(observed.cluster_targets, key=_namespace_name)]
    targets = []
    for obj, kind in listed:
        meta = obj["metadata"]
        node = virtual_node_name(meta["name"], meta.get("namespace") if kind == "Target" else None)
        targets.append(_target_entry(obj, kind, nodes.get(node), readable))
    by_node = {t["virtualNode"]["name"]: t for t in targets}
    requested: dict[str, dict[str, Fraction]] = {}

    workloads: dict[tuple[str, str, str], dict] = {}
    placed: dict[tuple[str, str, str], Counter[str]] = {}
    reasons: dict[tuple[str, str, str], Counter[tuple[str | None, str | None]]] = {}
    for pod in observed.proxies:
        if not is_proxy(pod):
            continue
        namespace = pod["metadata"].get("namespace") or ""
        key = (namespace, *workload_of(pod, observed.controllers))
        entry = workloads.setdefault(key, _workload_entry(*key))
        bound_to = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if bound_to and phase not in TERMINAL_PHASES:  # what the target's node holds
            add(requested.setdefault(bound_to, {}), proxy_requests(pod))
        if phase == "Succeeded":
            entry["succeeded"] += 1
        elif phase == "Failed":
            entry["failed"] += 1
        elif is_terminating(pod):
            entry["terminating"] += 1
        elif bound_to:
            entry["pods"] += 1
            placed.setdefault(key, Counter())[bound_to] += 1
        else:
            entry["pods"] += 1
            entry["pending"] += 1
            condition = pod_scheduled(pod)
            if condition.get("status") == "False":
                why = (condition.get("reason") or None, condition.get("message") or None)
            else:
                why = (None, None)  # the scheduler has not decided yet
            reasons.setdefault(key, Counter())[why] += 1

    for node, amounts in requested.items():
        if node in by_node:
            entry = by_node[node]["virtualNode"]
            entry["requested"] = format_list(amounts)
            entry["proxyPods"] = int(amounts.get("pods", 0))
    for key, entry in workloads.items():
        for node, count in sorted((placed.get(key) or {}).items()):
            found = by_node.get(node)
            ref = target_ref(found["kind"], found["name"], found["namespace"]) if found else None
            entry["placed"].append({"target": ref, "virtualNode": node, "pods": count})
        entry["placed"].sort(key=lambda p: target_label(p["target"], p["virtualNode"]))
        entry["pendingReasons"] = [
            {"reason": reason, "message": message, "pods": count}
            for (reason, message), count in sorted(
                (reasons.get(key) or {}).items(), key=lambda item: (-item[1], str(item[0]))
            )
        ]
    return {
        "version": SCHEMA_VERSION,
        "context": observed.context,
        "namespace": observed.namespace,
        "ready": all(t["ready"] for t in targets),
        "targets": targets,
        "workloads": [workloads[k] for k in sorted(workloads)],
        "warnings": list(observed.warnings),
    }


def _namespace_name(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def exit_code(report: dict) -> int:
    return EXIT_READY if report["ready"] else EXIT_NOT_READY

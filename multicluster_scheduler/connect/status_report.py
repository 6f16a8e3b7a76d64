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

A Target's condition is what an agent last wrote, and an agent that is gone (uninstalled,
crashing, scaled to zero) writes nothing more: its Targets would stay Ready forever. The agent
writes each virtual node's status at least every minute (its heartbeat) and Kubernetes deletes
the virtual nodes with the chart, so a Ready Target whose virtual node is missing, or silent for
:data:`AGENT_SILENT_AFTER` seconds, is reported not Ready (``AgentNotSeen``). The costliest
mistakes are silent too: pods that carry the election, or a key that looks like it, and are not
proxy pods run in this cluster, and a namespace with Targets but without the
``multicluster-scheduler=enabled`` label elects nothing. Those are the report's ``problems``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from multicluster.kubetime import parse_time

from ..api import keys
from ..api.keycheck import annotation_mistakes, namespace_enabled
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
# The agent writes each virtual node's status at least every 60 s: three times that without a
# word, and no agent is running.
AGENT_SILENT_AFTER = 180.0
# A Target Ready this recently may not have its virtual node yet.
NEW_TARGET_GRACE = 60.0
AGENT_NOT_SEEN = "AgentNotSeen"
AGENT_HINT = (
    "the agents must run in this cluster: kubectl get pods -n admiralty (or the chart's "
    "namespace); after helm uninstall, install the chart again or delete the Targets"
)
# Namespaces where the webhook never acts, whatever their labels (besides the chart's own).
NEVER_ELECTED = ("kube-system",)

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
    # The namespaces looked at (those with Targets, the one asked for), by name; one missing
    # from here could not be read.
    namespaces: dict[str, dict] = field(default_factory=dict)
    # Pods that are not proxy pods, in those namespaces (None: not read).
    pods: list[dict] | None = None
    # Whether the chart's webhook configuration exists (None: it could not be looked for).
    installed: bool | None = None
    now: dt.datetime | None = None  # when it was read (default: now)


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


def node_heartbeat(node: dict | None) -> str | None:
    """When the agent last wrote the virtual node's status (its Ready condition's heartbeat)."""
    for condition in ((node or {}).get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return condition.get("lastHeartbeatTime")
    return None


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def agent_silence(
    condition: dict | None,
    node: dict | None,
    node_name: str,
    observed: Observed,
    now: dt.datetime,
) -> str | None:
    """Why no agent seems to keep this Target (its condition says Ready), or None: the chart is
    not installed, its virtual node is missing, or the node's status has not been written for
    :data:`AGENT_SILENT_AFTER` seconds. Nothing is said when nodes could not be read."""
    if condition is None or condition.get("status") != "True":
        return None
    where = f"context {observed.context}"
    if observed.installed is False:
        return (
            f"multicluster-scheduler is not installed in {where} (no webhook configuration of "
            f"the chart): no agent keeps this Target, its Ready condition is the last one written"
        )
    if observed.nodes is None:
        return None
    if node is None:
        since = parse_time(condition.get("lastTransitionTime"))
        if since is not None and (now - since).total_seconds() < NEW_TARGET_GRACE:
            return None  # its node is being made
        return (
            f"its virtual node {node_name} does not exist: no agent keeps this Target in "
            f"{where} (its Ready condition is the last one written)"
        )
    beat = parse_time(node_heartbeat(node))
    if beat is None:
        return None
    silent = (now - beat).total_seconds()
    if silent < AGENT_SILENT_AFTER:
        return None
    return (
        f"no agent has written its virtual node {node_name} for {_ago(silent)} (since "
        f"{node_heartbeat(node)}): no agent is running in {where}"
    )


def _target_entry(
    obj: dict, kind: str, node: dict | None, observed: Observed, now: dt.datetime
) -> dict:
    meta = obj["metadata"]
    namespace = meta.get("namespace") if kind == "Target" else None
    node_name = virtual_node_name(meta["name"], namespace)
    condition = ready_condition(obj)
    ready = condition is not None and condition.get("status") == "True"
    status_word = "Unknown" if condition is None else condition.get("status") or "Unknown"
    if condition is None:
        reason = message = since = None
        hint: str | None = NO_STATUS_HINT
    else:
        reason = condition.get("reason") or None
        message = condition.get("message") or None
        since = condition.get("lastTransitionTime")
        hint = None if ready else READY_HINTS.get(reason or "")
    silence = agent_silence(condition, node, node_name, observed, now)
    if silence:
        ready, status_word, reason, message = False, "Unknown", AGENT_NOT_SEEN, silence
        hint = AGENT_HINT
    status = (node or {}).get("status") or {}
    return {
        **target_ref(kind, meta["name"], namespace),
        "self": bool((obj.get("spec") or {}).get("self")),
        "ready": ready,
        "status": status_word,
        "reason": reason,
        "message": message,
        "hint": hint,
        "lastTransitionTime": since,
        "virtualNode": {
            "name": node_name,
            "status": node_status(node, observed.nodes is not None),
            "capacity": dict(status.get("capacity") or {}) if node else None,
            "allocatable": dict(status.get("allocatable") or {}) if node else None,
            "requested": {},
            "proxyPods": 0,
            "lastHeartbeatTime": node_heartbeat(node),
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
    now = observed.now or dt.datetime.now(dt.UTC)
    nodes = {n["metadata"]["name"]: n for n in observed.nodes or ()}
    listed = [(t, "Target") for t in sorted(observed.targets, key=_namespace_name)]
    listed += [(t, "ClusterTarget") for t in sorted(observed.cluster_targets, key=_namespace_name)]
    targets = []
    for obj, kind in listed:
        meta = obj["metadata"]
        node = virtual_node_name(meta["name"], meta.get("namespace") if kind == "Target" else None)
        targets.append(_target_entry(obj, kind, nodes.get(node), observed, now))
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
        "notElected": not_elected(observed),
        "problems": problems(observed, targets),
        "warnings": list(observed.warnings),
    }


def namespaces_to_check(observed: Observed) -> list[str]:
    """The namespaces whose label matters here: those of the Targets listed, and the one asked
    for when ClusterTargets serve it."""
    names = {t["metadata"].get("namespace") or "" for t in observed.targets}
    if observed.namespace and observed.cluster_targets:
        names.add(observed.namespace)
    return sorted(n for n in names if n)


def elects_in(namespace: str, observed: Observed) -> bool | None:
    """Whether the webhook acts in ``namespace`` (None: its labels could not be read)."""
    if namespace in NEVER_ELECTED:
        return False
    found = observed.namespaces.get(namespace)
    return None if found is None else namespace_enabled(found)


def problems(observed: Observed, targets: list[dict]) -> list[dict]:
    """What keeps scheduling from happening as set up, besides targets not Ready: the chart not
    installed, namespaces with Targets that are not enabled."""
    found = []
    if observed.installed is False:
        found.append(
            {
                "reason": "NotInstalled",
                "namespace": None,
                "message": f"multicluster-scheduler is not installed in context "
                f"{observed.context}: no webhook elects pods and no agent runs; the Targets and "
                f"their conditions are what was left",
                "hint": "helm install the chart (docs/operations.md), or delete what was left "
                "(docs/operations.md#uninstall)",
            }
        )
    for namespace in namespaces_to_check(observed):
        if elects_in(namespace, observed) is not False:
            continue
        mine = [t["name"] for t in targets if t["namespace"] == namespace]
        plural = "s" if len(mine) > 1 else ""
        served = f"Target{plural} {', '.join(mine)}" if mine else "ClusterTargets serving it"
        found.append(
            {
                "reason": "NamespaceNotEnabled",
                "namespace": namespace,
                "message": f"namespace {namespace} has {served} but is not labelled "
                f"{keys.NAMESPACE_ENABLED_LABEL}={keys.NAMESPACE_ENABLED_VALUE}: no pod of "
                f"it is elected, they all run in this cluster",
                "hint": f"kubectl label namespace {namespace} "
                f"{keys.NAMESPACE_ENABLED_LABEL}={keys.NAMESPACE_ENABLED_VALUE}",
            }
        )
    return found


def _why_not_elected(pod: dict, observed: Observed) -> tuple[str, list[str]] | None:
    meta = pod["metadata"]
    if keys.PARENT_UID in (meta.get("labels") or {}) or is_proxy(pod):
        return None  # a delegate (of a self target), or a proxy pod
    annotations = meta.get("annotations") or {}
    if keys.ELECT in annotations:
        enabled = elects_in(meta.get("namespace") or "", observed)
        if enabled is False:
            return "NamespaceNotEnabled", [keys.ELECT]
        return ("NotMutated", [keys.ELECT]) if enabled else None
    mistakes = annotation_mistakes(annotations)
    return ("MisspeltKey", [m.key for m in mistakes]) if mistakes else None


NOT_ELECTED_MESSAGES = {
    "NamespaceNotEnabled": "{carry} {keys} but {their} namespace is not labelled "
    + f"{keys.NAMESPACE_ENABLED_LABEL}={keys.NAMESPACE_ENABLED_VALUE}"
    + ": {they} in this cluster",
    "NotMutated": "{carry} {keys} but {are} not proxy pods (made before the namespace was "
    "labelled, or while no webhook of multicluster-scheduler answered): {they} in this cluster; "
    "once the webhook answers, delete {them} and {their} owner makes proxy pods",
    "MisspeltKey": "{carry} {keys}, not {elect}: {they} in this cluster",
}


def _not_elected_message(reason: str, count: int, found_keys: tuple[str, ...]) -> str:
    one = count == 1
    words = {
        "carry": "carries" if one else "carry",
        "their": "its" if one else "their",
        "they": "it runs" if one else "they run",
        "them": "it" if one else "them",
        "are": "is" if one else "are",
        "keys": ", ".join(found_keys),
        "elect": keys.ELECT,
    }
    return f"{count} pod{'' if one else 's'} " + NOT_ELECTED_MESSAGES[reason].format(**words)


def not_elected_pods(observed: Observed) -> list[tuple[dict, tuple[str, list[str]]]]:
    """The pods that carry the election, or a key like it, and are not proxy pods; with why."""
    found = []
    for pod in observed.pods or ():
        if pod["metadata"].get("deletionTimestamp"):
            continue
        why = _why_not_elected(pod, observed)
        if why is not None:
            found.append((pod, why))
    return found


def not_elected(observed: Observed) -> list[dict]:
    """Workloads whose pods carry the election, or a key like it, and run in this cluster."""
    groups: Counter[tuple[str, str, str, str, tuple[str, ...]]] = Counter()
    for pod, why in not_elected_pods(observed):
        namespace = pod["metadata"].get("namespace") or ""
        kind, name = workload_of(pod, observed.controllers)
        groups[(namespace, kind, name, why[0], tuple(why[1]))] += 1
    found = []
    for (namespace, kind, name, reason, found_keys), count in sorted(groups.items()):
        found.append(
            {
                "namespace": namespace,
                "kind": kind,
                "name": name,
                "pods": count,
                "reason": reason,
                "keys": list(found_keys),
                "message": _not_elected_message(reason, count, found_keys),
            }
        )
    return found


def _namespace_name(obj: dict) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


def exit_code(report: dict) -> int:
    """3 when a target is not Ready, or when scheduling cannot happen as set up (a problem, or
    pods that should be elected run here); 0 otherwise."""
    ok = report["ready"] and not report["problems"] and not report["notElected"]
    return EXIT_READY if ok else EXIT_NOT_READY

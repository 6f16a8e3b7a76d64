"""Delegates kept alive in their target while their source cluster is away: the pure rules.

A source cluster's agent renews, in each namespace of a target where it places delegates, a
Lease of its own (its *heartbeat*). The target's agent keeps what it needs to recreate each
delegate of another cluster whose ``restartPolicy`` is ``Always``; when such a delegate is
deleted (by hand, a drain, an eviction) and its source renews nothing there for
:data:`AWAY` seconds after, the source cannot replace it (as it does when it is there: its
proxy pod is deleted and its owner makes another), so the target recreates it, as it was, under
the same name. When the source is back, it finds a delegate where it expects one and mirrors it
as before. Upstream (Admiralty v0.16+) keeps a PodChaperon per delegate for this and waits one
minute too.
"""

from __future__ import annotations

import enum
import hashlib

import orjson

from . import keys
from .proxy import looks_like_delegate, parent_cluster

AWAY = 60.0  # seconds without a heartbeat after a delegate went: its source is away
HEARTBEAT_PERIOD = 20.0  # how often a source renews its heartbeats
HEARTBEAT_LABEL = keys.PREFIX + "source-heartbeat"  # value: "true"; the source in an annotation
RECREATED = keys.PREFIX + "recreated-while-source-away"  # annotation: when (RFC 3339)


def heartbeat_name(cluster_name: str) -> str:
    """The Lease a source cluster renews in a target's namespace: a DNS label whatever the
    cluster's name (the name itself is in an annotation)."""
    return "multicluster-scheduler-source-" + hashlib.sha256(cluster_name.encode()).hexdigest()[:16]


def heartbeat_lease(cluster_name: str, namespace: str, now: str) -> dict:
    """The heartbeat Lease of source ``cluster_name`` in ``namespace``, renewed at ``now``
    (a MicroTime)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": heartbeat_name(cluster_name),
            "namespace": namespace,
            "labels": {HEARTBEAT_LABEL: "true"},
            "annotations": {keys.PARENT_CLUSTER_NAME: cluster_name},
        },
        "spec": {
            "holderIdentity": cluster_name,
            "leaseDurationSeconds": int(AWAY),
            "renewTime": now,
        },
    }


def heartbeat_source(lease: dict) -> str | None:
    """The source cluster whose heartbeat ``lease`` is, if it is one (its name must match)."""
    meta = lease["metadata"]
    source = (meta.get("annotations") or {}).get(keys.PARENT_CLUSTER_NAME)
    if not source or meta.get("name") != heartbeat_name(source):
        return None
    return source


def restarts_always(pod: dict) -> bool:
    return ((pod.get("spec") or {}).get("restartPolicy") or "Always") == "Always"


def keepable(pod: dict, cluster_name: str) -> str | None:
    """The source cluster of ``pod`` if it is a delegate of another cluster than
    ``cluster_name`` (this one), named as that source names its delegates, that restarts
    always and has not ended (an evicted one was replaced by its proxy pod's owner already);
    None otherwise."""
    source = parent_cluster(pod)
    if not source or source == cluster_name or not restarts_always(pod):
        return None
    if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        return None
    return source if looks_like_delegate(pod, source) else None


def kept(pod: dict, cluster_name: str) -> dict:
    """What the target's cache holds of a pod with a ``parent-uid`` label: for a keepable
    delegate, what recreating it needs (its metadata as written, and its spec serialized, far
    smaller than parsed); for others, their name only."""
    meta = pod["metadata"]
    slim: dict = {"metadata": {"name": meta["name"], "namespace": meta.get("namespace")}}
    source = keepable(pod, cluster_name)
    if source is None:
        return slim
    slim["source"] = source
    slim["metadata"] |= {
        k: meta[k] for k in ("uid", "labels", "annotations", "deletionTimestamp") if k in meta
    }
    slim["spec"] = orjson.dumps(pod.get("spec") or {})
    return slim


def recreated(slim: dict, now: str) -> dict:
    """The pod to create again from what :func:`kept` held: the same name, labels, annotations
    and spec, not bound to the node it ran on (the target's scheduler places it again)."""
    meta = slim["metadata"]
    spec = orjson.loads(slim["spec"])
    for assigned in ("nodeName", "ephemeralContainers", "priority"):  # refused on create
        spec.pop(assigned, None)
    annotations = dict(meta.get("annotations") or {})
    annotations[RECREATED] = now
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(meta.get("labels") or {}),
            "annotations": annotations,
        },
        "spec": spec,
    }


class Verdict(enum.Enum):
    WAIT = "wait"  # the source may still come, or may be away: look again later
    RECREATE = "recreate"  # the source has been away since the delegate went: recreate it
    FORGET = "forget"  # the source was there after the delegate went (it decides), or never
    # renews a heartbeat here (keeping alive is not in use)


def verdict(missing_since: float, last_heartbeat: float | None, now: float) -> Verdict:
    """What to do about a delegate gone at ``missing_since`` whose source's heartbeat in its
    namespace was last seen renewed at ``last_heartbeat`` (None: never), all on this agent's
    monotonic clock (the clusters' clocks may differ)."""
    if last_heartbeat is None:
        return Verdict.FORGET
    if last_heartbeat > missing_since:
        return Verdict.FORGET  # the source renewed after: it is there, and acts itself
    if now - missing_since >= AWAY:
        return Verdict.RECREATE
    return Verdict.WAIT

"""Delegates kept alive in their target while their source cluster is away: the pure rules.

A source cluster's agent renews, in each namespace of a target where it places delegates, a
``SourceHeartbeat`` of its own (its *heartbeat*). It says when the source was last there, who
wrote it (the user name the source has in that target: the chart's admission policy refuses any
other value, so ``spec.writer`` is whoever wrote it last), and which delegates the source
created there, name to uid, as the target answered its create requests. When such a delegate
is deleted (by hand, a drain, an eviction) and its source renews nothing there for
:data:`AWAY` seconds after, the source cannot replace it (as it does when it is there: its proxy
pod is deleted and its owner makes another), so the target's agent recreates it, as it was,
under the same name, but only when all of these hold (:func:`refusal` says which does not):

- its name and uid are listed in the heartbeat of the source it names: a pod someone else made
  in the target, however it is named and annotated, never is; nor is a recreated one (it has a
  new uid), so each pod the source created is recreated once at most;
- the heartbeat was last written by the identity of a Source of that namespace, or of a
  ClusterSource, that exists and is not being deleted, and that identity may create pods there
  now (a SubjectAccessReview): losing the source's access ends the protection;
- a service account wrote it with a token of its own, of the account that exists now
  (``spec.writerUID``, which the chart's policy makes the writer's uid): Kubernetes' ``edit``
  role lets whoever has it impersonate the service accounts of its namespace, a namespaced
  Source's among them, and an impersonated request has no uid; an account deleted and made
  again (a new uid) voids its old tokens and what they wrote;
- its spec was not changed after it was created (``metadata.generation``);
- it restarts always and had not ended.

The target's agent reads heartbeats of this kind only: Leases (which the previous release used,
and which anyone with ``edit`` in a namespace may write) mean nothing to it. Upstream (Admiralty
v0.16+) keeps a PodChaperon per delegate for this and waits one minute too.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson

from . import keys
from .proxy import looks_like_delegate, parent_cluster
from .v1alpha1 import MAX_HEARTBEAT_DELEGATES

AWAY = 60.0  # seconds without a heartbeat after a delegate went: its source is away
HEARTBEAT_PERIOD = 20.0  # how often a source renews its heartbeats
MAX_DELEGATES = MAX_HEARTBEAT_DELEGATES  # listed in one heartbeat (one source, one namespace)
# What the target's agent holds of a listed delegate to create it again: its labels, annotations
# and spec, serialized. Whoever may edit pods in its namespace may add labels and annotations to
# it (they count no generation), up to the 1.5 MB of an object: without a bound, the delegates
# of one namespace would hold gigabytes of the agent's memory, which serves every namespace.
MAX_HELD_BYTES = 64 * 1024
RECREATED = keys.PREFIX + "recreated-while-source-away"  # annotation: when (RFC 3339)
# The previous release's heartbeats were Leases with this label: a source of this release
# deletes its own (an agent of that release takes a Lease no longer renewed for a source away
# for good, and would recreate every delegate deleted in that namespace).
LEGACY_HEARTBEAT_LABEL = keys.PREFIX + "source-heartbeat"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
AUTHENTICATED = "system:authenticated"


def heartbeat_name(cluster_name: str) -> str:
    """The name of source ``cluster_name``'s heartbeat in a namespace (of the previous release's
    Lease too): a DNS label whatever the cluster's name (the name itself is in the spec)."""
    return "multicluster-scheduler-source-" + hashlib.sha256(cluster_name.encode()).hexdigest()[:16]


def heartbeat_object(
    cluster_name: str,
    namespace: str,
    writer: str,
    now: str,
    delegates: Mapping[str, str],
    writer_uid: str = "",
) -> dict:
    """The heartbeat of source ``cluster_name`` in ``namespace``, renewed at ``now`` (a
    MicroTime) by ``writer`` (the user name the source has there, of uid ``writer_uid``),
    listing ``delegates``."""
    spec: dict = {"source": cluster_name, "writer": writer, "renewTime": now}
    if writer_uid:
        spec["writerUID"] = writer_uid
    if delegates:
        spec["delegates"] = dict(delegates)
    return {
        "apiVersion": keys.API_VERSION,
        "kind": "SourceHeartbeat",
        "metadata": {"name": heartbeat_name(cluster_name), "namespace": namespace},
        "spec": spec,
    }


@dataclass(frozen=True)
class Heartbeat:
    """What a SourceHeartbeat says."""

    source: str
    writer: str
    renew_time: str
    delegates: Mapping[str, str]
    writer_uid: str = ""  # as the API server authenticated the writer ("": none)

    def lists(self, name: str, uid: object) -> bool:
        """Whether the source says it created the pod ``name`` of this ``uid``."""
        return isinstance(uid, str) and bool(uid) and self.delegates.get(name) == uid


def read_heartbeat(obj: dict) -> Heartbeat | None:
    """What ``obj`` says, if it is a heartbeat: named after the source it names, not being
    deleted, its fields of the types the CRD gives them (a server whose CRD is older may
    accept anything), its delegates :data:`MAX_DELEGATES` at most. None otherwise."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, dict) or meta.get("deletionTimestamp"):
        return None
    source, writer, renewed = spec.get("source"), spec.get("writer"), spec.get("renewTime")
    if not (isinstance(source, str) and source and isinstance(writer, str) and writer):
        return None
    if meta.get("name") != heartbeat_name(source):
        return None
    listed = spec.get("delegates") or {}
    if not isinstance(listed, dict) or len(listed) > MAX_DELEGATES:
        return None
    delegates = {k: v for k, v in listed.items() if isinstance(k, str) and isinstance(v, str)}
    uid = spec.get("writerUID")
    return Heartbeat(
        source,
        writer,
        renewed if isinstance(renewed, str) else "",
        delegates,
        uid if isinstance(uid, str) else "",
    )


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


def unchanged(pod: dict) -> bool | None:
    """Whether ``pod``'s spec is as it was created: the API server sets ``metadata.generation``
    to 1 on creation and adds one for each change of the spec (an image, a toleration, an
    ephemeral container, a resize; not a binding, a status, labels nor annotations), and once
    more when the pod starts being deleted gracefully (Kubernetes 1.33 and later). None when
    the server does not count (no generation)."""
    meta = pod.get("metadata") or {}
    generation = meta.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
        return None
    return generation == (2 if meta.get("deletionTimestamp") else 1)


def slim(pod: dict, cluster_name: str, listed: bool = False) -> dict:
    """What the target's cache holds of a pod with a ``parent-uid`` label: its name and uid,
    and for a keepable delegate its source and whether its spec is unchanged; for one its
    source lists (``listed``), what recreating it needs too: its labels, annotations and spec,
    serialized (far smaller than parsed), :data:`MAX_HELD_BYTES` at most (past that, only how
    large they were)."""
    meta = pod["metadata"]
    held: dict = {
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "deletionTimestamp") if k in meta
        }
    }
    source = keepable(pod, cluster_name)
    if source is not None:
        held["source"] = source
        held["unchanged"] = unchanged(pod)
        if listed:
            kept = {k: meta[k] for k in ("labels", "annotations") if k in meta}
            labelled = orjson.dumps(kept)
            spec = orjson.dumps(pod.get("spec") or {})
            if len(labelled) + len(spec) > MAX_HELD_BYTES:
                held["too_large"] = len(labelled) + len(spec)
            else:
                held["labelled"] = labelled
                held["spec"] = spec
    return held


def recreated(held: dict, now: str) -> dict:
    """The pod to create again from what :func:`slim` held of a listed delegate: the same name,
    labels, annotations and spec, not bound to the node it ran on (the target's scheduler
    places it again)."""
    meta = held["metadata"]
    kept = orjson.loads(held["labelled"])
    spec = orjson.loads(held["spec"])
    for assigned in ("nodeName", "ephemeralContainers", "priority"):  # refused on create
        spec.pop(assigned, None)
    annotations = dict(kept.get("annotations") or {})
    annotations[RECREATED] = now
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(kept.get("labels") or {}),
            "annotations": annotations,
        },
        "spec": spec,
    }


# -- who may keep delegates alive -------------------------------------------------------------


def identities(source: dict) -> set[str]:
    """The user names a Source or ClusterSource stands for (its service account's, its user's);
    none while it is being deleted."""
    meta = source.get("metadata") or {}
    spec = source.get("spec")
    if meta.get("deletionTimestamp") or not isinstance(spec, dict):
        return set()
    found = set()
    if meta.get("namespace"):
        account = spec.get("serviceAccountName")
        if isinstance(account, str) and account:
            found.add(f"{SERVICE_ACCOUNT_PREFIX}{meta['namespace']}:{account}")
    else:
        ref = spec.get("serviceAccount")
        ref = ref if isinstance(ref, dict) else {}
        name, namespace = ref.get("name"), ref.get("namespace")
        if isinstance(name, str) and name and isinstance(namespace, str) and namespace:
            found.add(f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}")
    user = spec.get("userName")
    if isinstance(user, str) and user:
        found.add(user)
    return found


def known_writer(writer: str, sources: Iterable[dict], cluster_sources: Iterable[dict]) -> bool:
    """Whether ``writer`` is the identity of one of ``sources`` (those of the heartbeat's
    namespace) or ``cluster_sources``."""
    return any(writer in identities(s) for s in (*sources, *cluster_sources))


def service_account(user: str) -> tuple[str, str] | None:
    """The namespace and name of the service account ``user`` is, if it is one."""
    parts = user.split(":")
    if len(parts) == 4 and user.startswith(SERVICE_ACCOUNT_PREFIX) and all(parts[2:]):
        return parts[2], parts[3]
    return None


def groups_of(user: str) -> list[str]:
    """The groups the API server gives ``user`` when it authenticates a service account's token
    (any other user: only ``system:authenticated``, the groups it really has are not known)."""
    account = service_account(user)
    if account is not None:
        return [
            "system:serviceaccounts",
            f"system:serviceaccounts:{account[0]}",
            "system:authenticated",
        ]
    return [AUTHENTICATED]


def account_refusal(heartbeat: Heartbeat, account_uid: str | None) -> str | None:
    """Why ``heartbeat``, written by a service account, is not that account's word: it was
    written without a token of its own (impersonated: Kubernetes' ``edit`` role grants that for
    the accounts of its namespace, so whoever may edit a namespace where a Source's account is
    could speak for it), or with a token of an account of that name deleted since
    (``account_uid``: the uid of the one that exists now; None: none does). None when it is, or
    when the writer is a user (``edit`` grants no impersonation of users)."""
    account = service_account(heartbeat.writer)
    if account is None:
        return None
    named = f"service account {account[0]}/{account[1]}"
    if not heartbeat.writer_uid:
        return (
            f"the heartbeat was written as {named} without a token of that account (by "
            "someone impersonating it, which Kubernetes' edit role grants in its namespace)"
        )
    if account_uid is None:
        return f"{named}, which wrote the heartbeat, no longer exists"
    if account_uid != heartbeat.writer_uid:
        return (
            f"the heartbeat was written with a token of an earlier {named} (deleted and made "
            "again since: its tokens, and what they wrote, no longer count)"
        )
    return None


def refusal(gone: dict, heartbeat: Heartbeat, writer_known: bool) -> str | None:
    """Why the delegate ``gone`` (what :func:`slim` held of it), deleted while its source is
    away, is not to be recreated; None when nothing forbids it but the writer's permission to
    create pods, which is asked of the API server then."""
    meta = gone["metadata"]
    source = gone["source"]
    if not heartbeat.lists(meta["name"], meta.get("uid")):
        return (
            f"source {source} does not list it among the delegates it created here (a pod made "
            "by someone else, or one recreated once already)"
        )
    if "too_large" in gone:
        return (
            f"its labels, annotations and spec were {gone['too_large']} bytes, over the "
            f"{MAX_HELD_BYTES} this cluster holds of a delegate to create it again"
        )
    if "spec" not in gone:
        return "it went while this cluster's agent was not watching, its spec unseen"
    if gone.get("unchanged") is None:
        return (
            "this cluster does not tell whether its spec was changed after its creation "
            "(metadata.generation of pods: Kubernetes 1.33 and later)"
        )
    if not gone["unchanged"]:
        return "its spec was changed after its source created it (metadata.generation)"
    if not writer_known:
        return (
            f"the heartbeat of source {source} here was last written by {heartbeat.writer}, whom "
            f"no Source of namespace {meta.get('namespace')} nor any ClusterSource names"
        )
    return None


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

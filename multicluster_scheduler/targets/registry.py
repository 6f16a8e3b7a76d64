"""The targets a source cluster schedules to, as live connections other components use.

The targets controller keeps one :class:`TargetConnection` per Target and ClusterTarget; the
virtual kubelet (one node per target) and the scheduler read them. Listeners hear of targets
added and removed, of connections made and dropped (a connection's informers change when its
kubeconfig does), and of changes of readiness or summary; each connection's ``changed`` event
also fires then, for the one loop that owns its virtual node.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from multicluster import Client, Cluster, Informer, Unreachable
from multicluster.resources import PODS

from ..api import keys
from ..api.naming import unique_name, virtual_node_name
from ..api.proxy import parent_cluster, parent_uid

log = logging.getLogger(__name__)
DELEGATE_INDEX = "parent-uid"
SETTLE_GRACE = 15.0


REFERENCE_INDEX = "references"


def by_parent_uid(pod: dict) -> list[str]:
    uid = parent_uid(pod)
    return [uid] if uid else []


def by_reference(pod: dict) -> list[str]:
    """Config maps and secrets a (slim) delegate uses, as ``cluster|Kind:namespace/name``
    (``cluster``: its parent cluster's name; a target may serve several source clusters)."""
    used = pod.get("references")
    if not used:
        return []
    cluster = parent_cluster(pod) or ""
    return [f"{cluster}|{ref}" for ref in used]


@dataclass
class TargetConnection:
    kind: str  # Target or ClusterTarget
    name: str
    namespace: str | None
    cluster: Cluster | None = None
    summaries: Informer | None = None
    delegates: Informer | None = None  # pods with a parent-uid label, in the target's scope
    ready: bool = False
    reason: str = "Connecting"
    message: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    failover_after: float | None = None  # spec.failoverAfterSeconds
    excluded_labels_regexp: str | None = None  # spec.excludedLabelsRegexp, as written
    excluded_labels: Any = None  # ... compiled (None: none, or invalid)
    identity: str | None = None  # who this cluster is to the target (a user name), if known
    identity_uid: str = ""  # ... and its uid there ("": none given)
    not_ready_since: float | None = None  # since when it has been failing (not Connecting)

    def set_ready(self, ready: bool, reason: str, message: str) -> bool:
        """Record the target's readiness; whether anything changed. Time away counts from the
        first failure (connecting after an agent restart is not one)."""
        changed = (self.ready, self.reason, self.message) != (ready, reason, message)
        if ready:
            self.not_ready_since = None
        elif self.not_ready_since is None and reason != "Connecting":
            self.not_ready_since = time.monotonic()
        self.ready, self.reason, self.message = ready, reason, message
        return changed

    def failover_in(self, now: float | None = None) -> float | None:
        """Seconds until the proxy pods bound to this target are to be released (0: due now),
        or None when they are not (the target is Ready, or it has no failover setting)."""
        if self.ready or self.failover_after is None or self.not_ready_since is None:
            return None
        away = (time.monotonic() if now is None else now) - self.not_ready_since
        return max(0.0, self.failover_after - away)

    @property
    def client(self) -> Client:
        """The target's client. A connection that is not (or no longer) connected has none: it
        is unreachable, which is how callers already treat a target that does not answer."""
        if self.cluster is None:
            raise Unreachable(f"target {self.name}: not connected")
        return self.cluster.client

    @functools.cached_property
    def node_name(self) -> str:
        """Its virtual node's name (a Target's name and namespace never change; hashed names
        are not worked out again on every lookup: with 100 targets, it was a seventh of the
        scheduler's time)."""
        return virtual_node_name(self.name, self.namespace)

    @property
    def labels(self) -> dict[str, str]:
        """The virtual node's labels naming its target (a name longer than a label value may
        be, 63 characters, is shortened with a hash)."""
        name = unique_name([self.name])
        if self.namespace:
            return {keys.TARGET_NAMESPACE_LABEL: self.namespace, keys.TARGET_NAME_LABEL: name}
        return {keys.CLUSTER_TARGET_NAME_LABEL: name}

    def same_place(self, other: TargetConnection, namespace: str) -> bool:
        """Whether both serve ``namespace`` in the same cluster: then they see the same delegates
        of its proxy pods there, and one's delegate is no duplicate of the other's. Whichever
        pair a user makes (two Targets, a Target and a ClusterTarget, a self target and a
        kubeconfig to this cluster), the cluster is the same when the address is, or when the
        ClusterSummary both read is the same object."""
        if not (self.allows(namespace) and other.allows(namespace)):
            return False
        if self.cluster is None or other.cluster is None:
            return False
        if self.cluster.config.server == other.cluster.config.server:
            return True
        mine, theirs = _uid(self.summary()), _uid(other.summary())
        return mine is not None and mine == theirs

    def allows(self, namespace: str) -> bool:
        """A namespaced Target serves only proxy pods of its own namespace."""
        return self.namespace is None or self.namespace == namespace

    @property
    def delegates_synced(self) -> bool:
        informer = self.delegates
        return informer is not None and informer.has_synced and informer.last_error is None

    def delegates_using(self, reference: str, cluster_name: str) -> list[dict]:
        """Delegates of source cluster ``cluster_name`` that use a config map or secret
        (``Kind:namespace/name``)."""
        if self.delegates is None:
            return []
        return self.delegates.by_index(REFERENCE_INDEX, f"{cluster_name}|{reference}")

    def delegates_of(self, proxy_uid: str) -> list[dict]:
        if self.delegates is None:
            return []
        return self.delegates.by_index(DELEGATE_INDEX, proxy_uid)

    async def delete_delegate(self, delegate: dict, why: str) -> None:
        """Delete this very delegate (not a namesake made since); gone already is fine."""
        if self.cluster is None:
            return
        meta = delegate["metadata"]
        await self.cluster.client.delete(
            PODS,
            meta["name"],
            meta["namespace"],
            missing_ok=True,
            preconditions={"uid": meta["uid"]} if meta.get("uid") else None,
        )
        log.info(
            "delegate deleted namespace=%s name=%s target=%s reason=%r",
            meta["namespace"],
            meta["name"],
            self.node_name,
            why,
        )

    def summary(self) -> dict | None:
        if self.summaries is None:
            return None
        return self.summaries.get(keys.CLUSTER_SUMMARY_NAME)


def _uid(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("uid")


Listener = Callable[[TargetConnection], Awaitable[None]]
Callback = Callable[[TargetConnection], None]


class TargetRegistry:
    def __init__(self) -> None:
        self.connections: dict[str, TargetConnection] = {}
        self._added: list[Listener] = []
        self._removing: list[Listener] = []
        self._removed: list[Listener] = []
        self._connected: list[Callback] = []
        self._disconnected: list[Callback] = []
        self._changed: list[Callback] = []
        self._created = time.monotonic()
        self.targets_listed: Callable[[], bool] = lambda: True
        # The virtual node names of every Target and ClusterTarget there is (None until listed).
        self.target_nodes: Callable[[], set[str] | None] = lambda: None
        self.removing: set[str] = set()  # nodes whose removal listeners are running

    def on_added(self, listener: Listener) -> None:
        self._added.append(listener)

    def on_removing(self, listener: Listener) -> None:
        """Called first when a target goes, once it takes no new work: to wait for the work
        on it in flight (a delegate being created there, a proxy pod being bound to it), so that
        what ``on_removed`` listeners clean up is all there is."""
        self._removing.append(listener)

    def on_removed(self, listener: Listener) -> None:
        self._removed.append(listener)

    def settled(self, grace: float = SETTLE_GRACE) -> bool:
        """Every Target is known and has tried to connect once (or ``grace`` seconds passed):
        until then, "no target fits" may only mean "not connected yet"."""
        if time.monotonic() - self._created > grace:
            return True
        return self.targets_listed() and all(
            c.reason != "Connecting" for c in self.connections.values()
        )

    def on_connected(self, callback: Callback) -> None:
        """Called when a connection gets its cluster and informers (they are new each time)."""
        self._connected.append(callback)

    def on_disconnected(self, callback: Callback) -> None:
        self._disconnected.append(callback)

    def on_changed(self, callback: Callback) -> None:
        """Called when a target's readiness or summary may have changed."""
        self._changed.append(callback)

    def connected(self, connection: TargetConnection) -> None:
        for callback in self._connected:
            callback(connection)

    def disconnected(self, connection: TargetConnection) -> None:
        for callback in self._disconnected:
            callback(connection)

    def changed(self, connection: TargetConnection) -> None:
        connection.changed.set()
        for callback in self._changed:
            callback(connection)

    def by_node(self, node_name: str | None) -> TargetConnection | None:
        return self.connections.get(node_name) if node_name else None

    async def add(self, connection: TargetConnection) -> None:
        self.connections[connection.node_name] = connection
        for listener in self._added:
            await listener(connection)

    async def remove(self, node_name: str) -> TargetConnection | None:
        self.removing.add(node_name)
        try:
            connection = self.connections.pop(node_name, None)
            if connection is not None:
                for listener in (*self._removing, *self._removed):
                    try:
                        await listener(connection)
                    except Exception:  # one listener's failure must not skip the others
                        log.exception("target removal step failed node=%s", node_name)
        finally:
            self.removing.discard(node_name)
        return connection

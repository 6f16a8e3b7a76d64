"""Which pods of a target are the delegates of which proxy pods: one rule, for every component
that acts on a delegate or on behalf of one.

Delegates are found by their ``parent-uid`` label in each target's cache of pods. Anyone who may
create pods in a target can put that label and this cluster's name on a pod: a co-tenant of a
shared namespace, a user of another namespace of the same target, a user of the target cluster.
Taking the label at its word bound other tenants' proxy pods to such pods, mirrored their status
and copied the source's Secrets to wherever such a pod claimed to use them. So a pod counts as
the delegate of a proxy pod only if this agent could have made it:

- it is in the proxy pod's namespace, under the name derived from the proxy pod, and carries its
  references and this cluster's name (:func:`..api.proxy.is_delegate_of`);
- it is seen through a target that serves that namespace;
- to act on its behalf (copy what it uses, say), the proxy pod is placed there: bound to that
  target's virtual node or to another Target or ClusterTarget serving the namespace in the same
  cluster (they are one place), or being placed there by the scheduler now.

The scheduler, the virtual kubelet (status, deletion, duplicates, logs and exec) and the follow
controller ask here; none of them reads a delegate's labels on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from multicluster import Cluster, Informer
from multicluster.gc import has_finalizer
from multicluster.resources import NAMESPACES

from ..api import keys
from ..api.proxy import PROXY_UID_INDEX, is_delegate_of, parent_uid
from .registry import TargetConnection, TargetRegistry


@dataclass
class Placement:
    """A delegate created in a target, waiting for that target's scheduler."""

    node: str
    delegate: str
    started: float  # wall-clock seconds
    announced: bool = False  # a DelegateCreated event says it is waiting


ENABLED_NAMESPACES = f"{keys.NAMESPACE_ENABLED_LABEL}={keys.NAMESPACE_ENABLED_VALUE}"


def _namespace_name(namespace: dict) -> dict:
    return {"metadata": {"name": namespace["metadata"]["name"]}}


def enabled_namespaces(local: Cluster) -> Informer:
    """The namespaces that opted in (labelled ``multicluster-scheduler=enabled``): only their
    pods are placed and only their Services are rerouted and copied (one shared informer)."""
    return local.informer(NAMESPACES, label_selector=ENABLED_NAMESPACES, transform=_namespace_name)


def is_proxy(pod: dict) -> bool:
    """Whether ``pod`` (a cached, slim proxy pod) is one we act for: the webhook's finalizer is
    on it (a pod that merely names our scheduler, bound to a virtual node by hand, is not; the
    scheduler checks the rest of what the webhook writes before it places a pod)."""
    return has_finalizer(pod, keys.FINALIZER)


class DelegateLookup:
    def __init__(self, registry: TargetRegistry, proxies: Informer, cluster_name: str) -> None:
        self.registry = registry
        self.proxies = proxies  # the shared cache of proxy pods (indexed by uid)
        self.cluster_name = cluster_name
        # Proxy pod uid → the delegate being placed for it. The scheduler alone writes it.
        self.placements: dict[str, Placement] = {}

    def proxy(self, uid: str | None) -> dict | None:
        """The proxy pod of this uid, if it exists."""
        found = self.proxies.by_index(PROXY_UID_INDEX, uid) if uid else ()
        return found[0] if found else None

    def home(self, proxy: dict) -> TargetConnection | None:
        """The target the proxy pod is placed in: its virtual node's, or the one the scheduler
        is placing it in."""
        node = proxy["spec"].get("nodeName")
        if not node:
            placement = self.placements.get(proxy["metadata"]["uid"])
            node = placement.node if placement else None
        return self.registry.by_node(node)

    def placed_in(self, proxy: dict, connection: TargetConnection) -> bool:
        home = self.home(proxy)
        return home is not None and (
            home is connection or home.same_place(connection, proxy["metadata"]["namespace"])
        )

    def counts(self, pod: dict, proxy: dict, connection: TargetConnection) -> bool:
        """Whether ``pod``, seen through ``connection``, is ``proxy``'s delegate."""
        return connection.allows(proxy["metadata"]["namespace"]) and is_delegate_of(
            pod, proxy, self.cluster_name
        )

    def in_target(self, proxy: dict, connection: TargetConnection) -> list[dict]:
        """The delegates of ``proxy`` seen through ``connection`` (one at most, besides one being
        deleted: the name is fixed)."""
        return [
            pod
            for pod in connection.delegates_of(proxy["metadata"]["uid"])
            if self.counts(pod, proxy, connection)
        ]

    def everywhere(
        self, proxy: dict, prefer: str | None = None
    ) -> list[tuple[TargetConnection, dict]]:
        """The delegates of ``proxy`` in every target that serves its namespace, wherever it is
        placed (an agent that restarts has forgotten the placements in flight). Seen through two
        targets of one place, a delegate counts once, through ``prefer`` (a virtual node) if it
        is one of them."""
        namespace = proxy["metadata"]["namespace"]
        connections = sorted(
            (c for c in self.registry.connections.values() if c.allows(namespace)),
            key=lambda c: c.node_name != prefer,
        )
        found: dict[object, tuple[TargetConnection, dict]] = {}
        for connection in connections:
            for pod in self.in_target(proxy, connection):
                key = pod["metadata"].get("uid") or (connection.node_name, id(pod))
                found.setdefault(key, (connection, pod))
        return list(found.values())

    def proxy_of(self, pod: dict, connection: TargetConnection) -> dict | None:
        """The proxy pod whose delegate ``pod`` (seen through ``connection``) is, if it is placed
        there; None for anyone else's pod, however it is labelled."""
        proxy = self.proxy(parent_uid(pod))
        if proxy is None or not is_proxy(proxy) or not self.counts(pod, proxy, connection):
            return None
        return proxy if self.placed_in(proxy, connection) else None

    def uses(self, pod: dict, connection: TargetConnection, reference: str) -> bool:
        """Whether ``pod`` is a delegate placed in ``connection`` whose proxy pod uses the config
        map or secret ``reference`` (``Kind:namespace/name``) too. What a pod in a target says
        it uses is the word of whoever created it; the proxy pod's own volumes and env, which
        its API server checked and which never change, are the source's."""
        proxy = self.proxy_of(pod, connection)
        return proxy is not None and reference in (proxy.get("references") or ())

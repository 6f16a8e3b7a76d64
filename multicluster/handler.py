"""Event handlers: which Requests an object's event should enqueue.

The same pod event may concern the pod itself, its owner in the same cluster, or its parent in
another cluster (multicluster controllers keep such cross-cluster references in annotations,
since owner references cannot cross clusters). Each handler maps an event to Requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .gc import ParentReferences
from .reconcile import Request

MapFunc = Callable[[str, dict], Iterable[Request]]


class EventHandler:
    """Base class: ``requests(cluster, obj)`` says which Requests an object's event enqueues."""

    def requests(self, cluster: str, obj: dict) -> Iterable[Request]:
        raise NotImplementedError


class EnqueueObject(EventHandler):
    """Enqueue the object itself."""

    def requests(self, cluster: str, obj: dict) -> Iterable[Request]:
        meta = obj["metadata"]
        return (Request(cluster, meta.get("namespace", ""), meta["name"]),)


class EnqueueOwner(EventHandler):
    """Enqueue the owners (ownerReferences) of a given kind, in the same cluster and namespace."""

    def __init__(self, kind: str, api_group: str | None = None, *, controller_only: bool = True):
        self.kind = kind
        self.api_group = api_group
        self.controller_only = controller_only

    def requests(self, cluster: str, obj: dict) -> Iterable[Request]:
        meta = obj["metadata"]
        found = []
        for ref in meta.get("ownerReferences") or ():
            if ref.get("kind") != self.kind or (self.controller_only and not ref.get("controller")):
                continue
            if self.api_group is not None:
                group = ref.get("apiVersion", "").rpartition("/")[0]
                if group != self.api_group:
                    continue
            found.append(Request(cluster, meta.get("namespace", ""), ref["name"]))
        return found


class EnqueueParent(EventHandler):
    """Enqueue the parent named by annotations, typically in another cluster.

    The keys are those the cross-cluster garbage collector writes (see :mod:`multicluster.gc`).
    """

    def __init__(self, references: ParentReferences | None = None) -> None:
        self.references = references or ParentReferences()

    def requests(self, cluster: str, obj: dict) -> Iterable[Request]:
        parent = self.references.parent_of(obj)
        return (parent,) if parent else ()


class EnqueueMapped(EventHandler):
    """Enqueue whatever a function returns for the object."""

    def __init__(self, func: MapFunc) -> None:
        self.func = func

    def requests(self, cluster: str, obj: dict) -> Iterable[Request]:
        return self.func(cluster, obj)

"""Cross-cluster garbage collection: owner references that cross clusters, and finalizers.

Kubernetes' garbage collector follows ``ownerReferences`` within one cluster only. A child in
another cluster instead carries its parent's name, namespace and cluster in annotations and its
uid in a label (so children of a parent are found with a label selector). The parent keeps a
finalizer until its remote children are gone, so deleting it deletes them first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .client import Client
from .errors import Conflict, NotFound
from .reconcile import Request
from .resources import Resource

DEFAULT_PREFIX = "multicluster.admiralty.io/"


@dataclass(frozen=True)
class ParentReferences:
    """Where parent references live on a child: annotation and label keys under a prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def name_key(self) -> str:
        return self.prefix + "parent-name"

    @property
    def namespace_key(self) -> str:
        return self.prefix + "parent-namespace"

    @property
    def cluster_key(self) -> str:
        return self.prefix + "parent-cluster-name"

    @property
    def uid_key(self) -> str:
        return self.prefix + "parent-uid"

    @property
    def finalizer(self) -> str:
        return self.prefix + "multiclusterForegroundDeletion"

    def set_parent(self, child: dict, parent: dict, parent_cluster: str) -> dict:
        """Write the references to ``parent`` (in ``parent_cluster``) into ``child``; return it."""
        meta = child.setdefault("metadata", {})
        parent_meta = parent["metadata"]
        annotations = meta.setdefault("annotations", {})
        annotations[self.name_key] = parent_meta["name"]
        annotations[self.namespace_key] = parent_meta.get("namespace", "")
        annotations[self.cluster_key] = parent_cluster
        meta.setdefault("labels", {})[self.uid_key] = parent_meta["uid"]
        return child

    def parent_of(self, child: dict) -> Request | None:
        annotations = child["metadata"].get("annotations") or {}
        name = annotations.get(self.name_key)
        cluster = annotations.get(self.cluster_key)
        if not name or cluster is None:
            return None
        return Request(cluster, annotations.get(self.namespace_key, ""), name)

    def selector(self, parent: dict) -> str:
        """Label selector of the children of ``parent``."""
        return f"{self.uid_key}={parent['metadata']['uid']}"

    def is_child_of(self, child: dict, parent: dict) -> bool:
        labels = child["metadata"].get("labels") or {}
        return labels.get(self.uid_key) == parent["metadata"].get("uid")


def has_finalizer(obj: dict, finalizer: str) -> bool:
    return finalizer in (obj["metadata"].get("finalizers") or ())


def is_deleting(obj: dict) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def finalizer_changes(meta: dict, finalizer: str, present: bool, label: str | None = None) -> dict:
    """The metadata fields of a merge patch that puts ``finalizer`` on (``present``) or takes it
    off, with ``label`` set to ``"true"`` while it is on (so that a label selector finds the
    objects that hold it); empty when nothing changes."""
    finalizers = list(meta.get("finalizers") or ())
    labels = meta.get("labels") or {}
    fields: dict = {}
    if present and finalizer not in finalizers:
        fields["finalizers"] = [*finalizers, finalizer]
    elif not present and finalizer in finalizers:
        fields["finalizers"] = [f for f in finalizers if f != finalizer]
    if label is not None and present and labels.get(label) != "true":
        fields["labels"] = {label: "true"}
    elif label is not None and not present and label in labels:
        fields["labels"] = {label: None}
    return fields


def finalizer_patch(
    obj: dict, finalizer: str, present: bool, label: str | None = None
) -> dict | None:
    """:func:`finalizer_changes` as a merge patch conditional on the object's resourceVersion;
    None when nothing changes."""
    meta = obj["metadata"]
    fields = finalizer_changes(meta, finalizer, present, label)
    if not fields:
        return None
    return {"metadata": {**fields, "resourceVersion": meta["resourceVersion"]}}


async def add_finalizer(
    client: Client, resource: Resource, obj: dict, finalizer: str, *, label: str | None = None
) -> dict:
    """Add ``finalizer`` (and ``label``) unless present. Conditional on resourceVersion: raises
    Conflict when ``obj`` is behind."""
    patch = finalizer_patch(obj, finalizer, True, label)
    if patch is None:
        return obj
    meta = obj["metadata"]
    return await client.patch(resource, meta["name"], patch, meta.get("namespace"))


async def remove_finalizer(
    client: Client, resource: Resource, obj: dict, finalizer: str, *, label: str | None = None
) -> dict | None:
    """Remove ``finalizer`` (and ``label``) if present; None when the object is gone meanwhile.
    Conditional on resourceVersion: raises Conflict when ``obj`` is behind."""
    patch = finalizer_patch(obj, finalizer, False, label)
    if patch is None:
        return obj
    meta = obj["metadata"]
    try:
        return await client.patch(resource, meta["name"], patch, meta.get("namespace"))
    except NotFound:
        return None


async def delete_children(children: Iterable[tuple[Client, Resource, dict]]) -> int:
    """Delete each (client, resource, child) not already deleting; return how many remain."""
    remaining = 0
    for client, resource, child in children:
        remaining += 1
        if is_deleting(child):
            continue
        meta = child["metadata"]
        try:
            await client.delete(
                resource,
                meta["name"],
                meta.get("namespace"),
                preconditions={"uid": meta["uid"]},
            )
        except (NotFound, Conflict):
            remaining -= 1
    return remaining

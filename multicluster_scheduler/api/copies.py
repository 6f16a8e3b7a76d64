"""Copies a source cluster keeps of its own objects in its targets (global Services, the
Ingresses that route to them): what is ours on a copy, and the finalizer on the original.

A copy lives in a cluster whose controllers, webhooks and defaults write to it too (a load
balancer's annotations and status, a default ingress class, assigned IPs). So each copy records
in :data:`MANAGED_KEYS` which of its labels, annotations and top-level spec fields the agent
wrote; only those are compared with the original and written, and everything else on the copy
is someone else's, kept as it is. The kind-specific rules (:mod:`.services`, :mod:`.ingresses`)
build on these pure functions.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Iterable, Mapping

import orjson

from multicluster.gc import finalizer_changes

from . import keys

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
TRUE = "true"
# On each copy: which of its labels, annotations and spec fields are ours, as compact JSON
# ``{"annotations": [...], "labels": [...], "spec": [...]}`` (keys sorted; the annotation does
# not list itself). A key listed there that the original no longer has is removed from the copy.
MANAGED_KEYS = keys.PREFIX + "managed-keys"


def annotations_of(obj: dict) -> dict[str, str]:
    return obj["metadata"].get("annotations") or {}


def is_copy(obj: dict) -> bool:
    """A copy made by some source cluster: never made global, copied again or finalized."""
    return keys.IS_DELEGATE in annotations_of(obj)


def copy_metadata(
    original: dict, cluster_name: str, *, local_annotations: Iterable[str] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations of a copy of ``original`` (before :data:`MANAGED_KEYS`): the
    original's (but ``has-finalizer`` and the annotations its own cluster writes about it,
    ``local_annotations``), plus ``parent-uid``, ``is-delegate`` and the parent references."""
    meta = original["metadata"]
    local = frozenset(local_annotations) | {MANAGED_KEYS}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != keys.HAS_FINALIZER}
    labels[keys.PARENT_UID] = meta["uid"]
    annotations = {k: v for k, v in annotations_of(original).items() if k not in local}
    annotations[keys.IS_DELEGATE] = ""
    annotations[keys.PARENT_NAME] = meta["name"]
    annotations[keys.PARENT_NAMESPACE] = meta["namespace"]
    annotations[keys.PARENT_CLUSTER_NAME] = cluster_name
    return labels, annotations


def managed_record(
    labels: Iterable[str], annotations: Iterable[str], spec_fields: Iterable[str]
) -> str:
    """The value of :data:`MANAGED_KEYS` for a copy with these keys and spec fields."""
    record = {
        "annotations": sorted(annotations),
        "labels": sorted(labels),
        "spec": sorted(spec_fields),
    }
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()


class Managed:
    """What a copy in a target says is ours (:data:`MANAGED_KEYS`): keys of its labels and
    annotations, and fields of its spec. ``local_annotations`` are never ours (the target's own
    controllers write them on the copy), ``target_kept`` spec fields neither."""

    def __init__(
        self,
        existing: dict,
        *,
        local_annotations: frozenset[str] = frozenset(),
        target_kept: frozenset[str] = frozenset(),
    ) -> None:
        meta = existing["metadata"]
        labels, annotations = meta.get("labels") or {}, annotations_of(existing)
        local = local_annotations | {MANAGED_KEYS}
        try:
            recorded = orjson.loads(annotations[MANAGED_KEYS])
            self.labels = frozenset(recorded["labels"])
            self.annotations = frozenset(recorded["annotations"]) - local
            self.spec = frozenset(recorded["spec"])
        except (KeyError, TypeError, ValueError):
            # A copy made before MANAGED_KEYS existed (or whose record was mangled): all of
            # it is taken as ours, once; the update that follows records what is.
            self.labels = frozenset(labels)
            self.annotations = frozenset(annotations) - local
            self.spec = frozenset(existing.get("spec") or ()) - target_kept


def differs(want: Mapping, have: Mapping, ours: frozenset[str]) -> bool:
    """Whether ``have`` lacks a key-value of ``want``, or still has a key of ours that ``want``
    dropped. Other keys of ``have`` are someone else's."""
    if any(have.get(k) != v for k, v in want.items()):
        return True
    return any(k in have and k not in want for k in ours)


def theirs(have: Mapping, ours: frozenset[str]) -> dict:
    """What of ``have`` is not ours."""
    return {k: v for k, v in have.items() if k not in ours}


def metadata_differs(desired: dict, existing: dict, ours: Managed) -> bool:
    meta, old_meta = desired["metadata"], existing["metadata"]
    if differs(meta["labels"], old_meta.get("labels") or {}, ours.labels):
        return True
    return differs(meta["annotations"], annotations_of(existing), ours.annotations)


def update_body(
    desired: dict, existing: dict, ours: Managed, *, never_kept: Iterable[str] = ()
) -> dict:
    """The body that replaces ``existing`` with ``desired`` (a PUT, conditional on the
    resourceVersion): our labels, annotations and spec fields written, those of ours that
    ``desired`` dropped removed; others' labels, annotations, finalizers and owners, spec fields
    that are not ours (but ``never_kept``) and the status kept as the target has them."""
    body = _copy.deepcopy(desired)
    meta, old_meta = body["metadata"], existing["metadata"]
    meta["resourceVersion"] = old_meta["resourceVersion"]
    for field in ("finalizers", "ownerReferences"):
        if old_meta.get(field):
            meta[field] = old_meta[field]
    meta["labels"] = {**theirs(old_meta.get("labels") or {}, ours.labels), **meta["labels"]}
    meta["annotations"] = {
        **theirs(annotations_of(existing), ours.annotations),
        **meta["annotations"],
    }
    if "status" in existing:
        body["status"] = _copy.deepcopy(existing["status"])  # the API server keeps it anyway
    spec, excluded = body["spec"], frozenset(never_kept)
    for field, value in (existing.get("spec") or {}).items():
        if field not in ours.spec and field not in spec and field not in excluded:
            spec[field] = _copy.deepcopy(value)  # a target's default, controller or webhook
    return body


def finalizer_patch(
    obj: dict, *, present: bool, marks: Mapping[str, str] | None = None
) -> dict | None:
    """The merge patch that adds (``present``) or removes our finalizer, the ``has-finalizer``
    label next to it and the annotations ``marks`` (what the original says about its copies, for
    those that say it); None when nothing is to change. Marks are removed only with the
    finalizer or its label, and only where they still have our value: an original the agent
    never marked keeps what its user wrote."""
    meta = obj["metadata"]
    annotations = meta.get("annotations") or {}
    marks = marks or {}
    patch = finalizer_changes(meta, keys.FINALIZER, present, keys.HAS_FINALIZER)
    if present:
        wanted = {k: v for k, v in marks.items() if annotations.get(k) != v}
        if wanted:
            patch["annotations"] = wanted
    else:
        dropped = {k: None for k, v in marks.items() if annotations.get(k) == v}
        if patch and dropped:
            patch["annotations"] = dropped
    if not patch:
        return None
    patch["resourceVersion"] = meta["resourceVersion"]
    return {"metadata": patch}

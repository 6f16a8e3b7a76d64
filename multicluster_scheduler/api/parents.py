"""Objects a source cluster keeps in its targets (delegates' config maps and secrets, service
copies) name their original by parent-reference annotations (docs/reference.md, "What the agent
writes in target clusters")."""

from __future__ import annotations

from . import keys


def is_copy_of(copy: dict, namespace: str, name: str, cluster_name: str) -> bool:
    """Whether ``copy`` is ours: made by cluster ``cluster_name`` from ``namespace/name``."""
    annotations = (copy.get("metadata") or {}).get("annotations") or {}
    return (
        annotations.get(keys.PARENT_CLUSTER_NAME) == cluster_name
        and annotations.get(keys.PARENT_NAMESPACE) == namespace
        and annotations.get(keys.PARENT_NAME) == name
    )


def is_ours(copy: dict, cluster_name: str) -> bool:
    """Whether ``copy`` is a copy made by cluster ``cluster_name`` of its namesake there (copies
    keep their original's namespace and name)."""
    meta = copy["metadata"]
    return is_copy_of(copy, meta.get("namespace") or "", meta["name"], cluster_name)

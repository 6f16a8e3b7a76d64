"""Config maps and secrets that follow delegates: which ones a pod uses, and what their copies in
a target look like (docs/follow.md; docs/reference.md, "What the agent writes in target clusters").

A copy has the source object's name, namespace, data, type and user labels and annotations, plus
parent references (annotations) and the source's uid (label ``parent-uid``, by which copies are
found). Whether a copy is current is a comparison of :func:`content_hash` values, so that the
caches keep a digest instead of every object's data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import orjson

from . import keys
from .parents import is_copy_of as is_copy_of

CONFIG_MAP = "ConfigMap"
SECRET = "Secret"
KINDS = (CONFIG_MAP, SECRET)
# Not copied: the token controller of the target owns such secrets (and deletes those whose
# service account it does not know).
UNFOLLOWED_SECRET_TYPES = frozenset({"kubernetes.io/service-account-token"})
# Every namespace of every cluster has its own, published by the root-CA publisher (it is in the
# service-account volume the target's admission adds to each delegate).
UNFOLLOWED_CONFIG_MAPS = frozenset({"kube-root-ca.crt"})
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
CONTENT_FIELDS = ("data", "binaryData", "type", "immutable")


def _names(items: object, *path: str) -> Iterable[str]:
    """Strings at ``path`` in each dict of ``items`` (anything malformed is skipped)."""
    if not isinstance(items, list):
        return
    for item in items:
        value = item
        for step in path:
            value = value.get(step) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            yield value


def references(spec: Any) -> dict[str, set[str]]:
    """Names of the config maps and secrets a pod spec uses, by kind: volumes (plain and
    projected), ``env`` key references and ``envFrom`` of every container, and image pull
    secrets."""
    config_maps: set[str] = set()
    secrets: set[str] = set()
    if not isinstance(spec, dict):
        return {CONFIG_MAP: config_maps, SECRET: secrets}
    volumes = spec.get("volumes")
    config_maps.update(_names(volumes, "configMap", "name"))
    secrets.update(_names(volumes, "secret", "secretName"))
    for volume in volumes if isinstance(volumes, list) else ():
        projected = volume.get("projected") if isinstance(volume, dict) else None
        sources = projected.get("sources") if isinstance(projected, dict) else None
        config_maps.update(_names(sources, "configMap", "name"))
        secrets.update(_names(sources, "secret", "name"))
    for field in ("initContainers", "containers", "ephemeralContainers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else ():
            if not isinstance(container, dict):
                continue
            env, env_from = container.get("env"), container.get("envFrom")
            config_maps.update(_names(env, "valueFrom", "configMapKeyRef", "name"))
            secrets.update(_names(env, "valueFrom", "secretKeyRef", "name"))
            config_maps.update(_names(env_from, "configMapRef", "name"))
            secrets.update(_names(env_from, "secretRef", "name"))
    secrets.update(_names(spec.get("imagePullSecrets"), "name"))
    return {CONFIG_MAP: config_maps - UNFOLLOWED_CONFIG_MAPS, SECRET: secrets}


def reference_keys(namespace: str, spec: dict) -> list[str]:
    """``Kind:namespace/name`` of everything :func:`references` finds (an index's values)."""
    return sorted(
        f"{kind}:{namespace}/{name}" for kind, names in references(spec).items() for name in names
    )


def reference_key(kind: str, namespace: str, name: str) -> str:
    return f"{kind}:{namespace}/{name}"


def is_followed(obj: dict) -> bool:
    return obj.get("type") not in UNFOLLOWED_SECRET_TYPES


def _user_labels(labels: dict | None) -> dict:
    return {k: v for k, v in (labels or {}).items() if k != keys.PARENT_UID}


def _user_annotations(annotations: dict | None) -> dict:
    return {
        k: v
        for k, v in (annotations or {}).items()
        if not k.startswith(keys.PREFIX) and k != LAST_APPLIED
    }


def content(obj: dict) -> dict:
    """What a copy must share with its source: data, type, and the user's labels and
    annotations (ours and kubectl's bookkeeping left out)."""
    meta = obj.get("metadata") or {}
    projected = {field: obj[field] for field in CONTENT_FIELDS if obj.get(field) is not None}
    labels = _user_labels(meta.get("labels"))
    labels.pop(keys.HAS_FINALIZER, None)
    projected["labels"] = labels
    projected["annotations"] = _user_annotations(meta.get("annotations"))
    return projected


def content_hash(obj: dict) -> str:
    return hashlib.sha256(orjson.dumps(content(obj), option=orjson.OPT_SORT_KEYS)).hexdigest()


def desired_copy(source: dict, cluster_name: str) -> dict:
    """The copy of ``source`` (a full ConfigMap or Secret) to keep in a target."""
    meta = source["metadata"]
    body = content(source)
    labels = body.pop("labels")
    labels[keys.PARENT_UID] = meta["uid"]
    annotations = body.pop("annotations")
    annotations[keys.PARENT_NAME] = meta["name"]
    annotations[keys.PARENT_NAMESPACE] = meta["namespace"]
    annotations[keys.PARENT_CLUSTER_NAME] = cluster_name
    return {
        "apiVersion": "v1",
        "kind": source.get("kind") or (SECRET if "type" in source else CONFIG_MAP),
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
        },
        **body,
    }


_SLIM_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")


def slim_followed(obj: dict) -> dict:
    """What the cache keeps of a config map or secret: identity, deletion, and a digest."""
    meta = obj["metadata"]
    slim = {k: meta[k] for k in _SLIM_METADATA if k in meta}
    for key in ("deletionTimestamp", "finalizers"):
        if meta.get(key):
            slim[key] = meta[key]
    annotations = meta.get("annotations") or {}
    parents = {k: v for k, v in annotations.items() if k.startswith(keys.PREFIX + "parent-")}
    if parents:
        slim["annotations"] = parents
    result: dict[str, object] = {"metadata": slim, "hash": content_hash(obj)}
    if obj.get("type"):
        result["type"] = obj["type"]
    if obj.get("immutable"):
        result["immutable"] = True
    return result

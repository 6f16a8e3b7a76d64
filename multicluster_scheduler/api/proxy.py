"""Proxy pods and their delegates: how one is recognised, and how the other is built from it.

The webhook saves an elected pod's manifest on the proxy pod, sealed with a MAC; the scheduler
builds the delegate from that manifest, once the MAC says it is the one the webhook saved; the
virtual kubelet finds the delegate again by its ``parent-uid`` label. These rules are shared by
both components, so they live here, as pure functions (docs/reference.md, "The saved manifest
and its MAC", "What the agent writes in target clusters").
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
import yaml

from multicluster import is_deleting as is_deleting  # the runtime's, re-exported
from multicluster.kubetime import parse_time
from multicluster.sharing import SHARED

from . import keys
from .constraints import delegate_constraints
from .follow import reference_keys
from .manifest_mac import ManifestKey, verify
from .naming import prefixed_label_key
from .regexps import compile_regexp, without_matching

PROXY_FIELD_SELECTOR = f"spec.schedulerName={keys.PROXY_SCHEDULER_NAME}"
DELEGATE_LABEL_SELECTOR = keys.PARENT_UID
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TERMINAL_PHASES = ("Succeeded", "Failed")
NAME_LIMIT = 63
HASH_LENGTH = 10
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]+")
_LABEL_FIELD = re.compile(r"metadata\.labels\['([^']+)'\]")


class InvalidManifest(ValueError):
    """The proxy pod's saved manifest is missing or is not a pod."""


def is_proxy(pod: dict) -> bool:
    return (pod.get("spec") or {}).get("schedulerName") == keys.PROXY_SCHEDULER_NAME


def is_terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def stopped_status(proxy: dict, now: str) -> dict | None:
    """What a kubelet writes of a pod it stopped because the pod was deleted, as a strategic
    merge patch of the status: Failed (its containers were killed), neither Ready nor
    ContainersReady; other conditions (DisruptionTarget, the Eviction API's mark) stay. For a
    proxy pod being deleted, before our finalizer goes, when someone else waits for that status:
    a finalizer other than ours holds the pod (the Job controller's: a Job with a pod failure
    policy replaces a pod, and judges it, only once it has failed). None when the pod is
    terminal already, or goes as soon as our finalizer does."""
    finalizers = proxy["metadata"].get("finalizers") or ()
    if is_terminal(proxy) or all(f == keys.FINALIZER for f in finalizers):
        return None
    stopped = [
        {"type": c["type"], "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
        for c in (proxy.get("status") or {}).get("conditions") or ()
        if c.get("type") in ("Ready", "ContainersReady") and c.get("status") != "False"
    ]
    return {"phase": "Failed", **({"conditions": stopped} if stopped else {})}


def controller_uid(pod: dict) -> str | None:
    """The uid of the pod's controller (ReplicaSet, Job, …), if any."""
    refs = pod["metadata"].get("ownerReferences") or ()
    for ref in refs:
        if ref.get("controller"):
            return ref.get("uid")
    return refs[0].get("uid") if refs else None


def source_manifest(proxy: dict) -> dict:
    """The pod as the webhook received it (JSON, or YAML as the original project wrote it)."""
    text = (proxy["metadata"].get("annotations") or {}).get(keys.SOURCEPOD_MANIFEST)
    if not text:
        raise InvalidManifest(f"the proxy pod has no {keys.SOURCEPOD_MANIFEST} annotation")
    try:
        manifest = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            manifest = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InvalidManifest(f"{keys.SOURCEPOD_MANIFEST} is neither JSON nor YAML: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("spec"), dict):
        raise InvalidManifest(f"{keys.SOURCEPOD_MANIFEST} does not hold a pod with a spec")
    if not isinstance(manifest["spec"].get("containers"), list) or not manifest["spec"].get(
        "containers"
    ):
        raise InvalidManifest(f"{keys.SOURCEPOD_MANIFEST} holds a pod without containers")
    metadata = manifest.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InvalidManifest(f"{keys.SOURCEPOD_MANIFEST} holds a pod whose metadata is no map")
    for field in ("labels", "annotations"):
        entries = metadata.get(field) or {}
        if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
            raise InvalidManifest(
                f"{keys.SOURCEPOD_MANIFEST} holds a pod whose {field} are not a map of strings"
            )
    return manifest


def delegate_name(proxy_name: str, proxy_uid: str) -> str:
    """Deterministic, distinct from the proxy's own name (self targets share its namespace),
    and a DNS label of at most 63 characters, so that it is also a valid hostname."""
    digest = hashlib.sha256(proxy_uid.encode()).hexdigest()[:HASH_LENGTH]
    head = _NOT_IN_LABEL.sub("-", proxy_name.lower())[: NAME_LIMIT - HASH_LENGTH - 1].strip("-")
    return f"{head}-{digest}" if head else digest


def prefixed_key(key: str) -> str:
    return prefixed_label_key(key)


def prefixed_labels(labels: dict[str, str], unprefixed: Any = None) -> dict[str, str]:
    """``k=v`` → ``multicluster.admiralty.io/<last segment of k>=v``, so that controllers in
    the target never mistake delegates for their own pods. When two keys end the same way, the
    one that sorts last wins (deterministic). Labels whose ``k=v`` the compiled regexp
    ``unprefixed`` matches (``no-prefix-label-regexp``) are kept as they are, and win."""
    kept = without_matching(labels, unprefixed) if unprefixed is not None else labels
    prefixed = {prefixed_key(k): v for k, v in sorted(kept.items())}
    if unprefixed is None:
        return prefixed
    return {**prefixed, **{k: v for k, v in labels.items() if k not in kept}}


def no_prefix_regexp(annotations: Any) -> Any:
    """The compiled ``no-prefix-label-regexp`` of an object's annotations, or None; ValueError
    with the reason when it is not a regular expression."""
    if not isinstance(annotations, dict) or keys.NO_PREFIX_LABEL_REGEXP not in annotations:
        return None
    try:
        return compile_regexp(annotations[keys.NO_PREFIX_LABEL_REGEXP])
    except ValueError as e:
        raise ValueError(
            f"annotation {keys.NO_PREFIX_LABEL_REGEXP} is not a regular expression (RE2 "
            f"syntax): {e}"
        ) from None


def _without_service_account_token(spec: dict) -> None:
    """Drop the token's mounts and volumes. Whatever is malformed (a manifest is user input) is
    left as it is, for the target's API server to refuse with its own precise message."""
    removed: set[str] = set()
    for field in ("initContainers", "containers", "ephemeralContainers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else ():
            mounts = container.get("volumeMounts") if isinstance(container, dict) else None
            if not mounts or not isinstance(mounts, list):
                continue
            kept = []
            for mount in mounts:
                path = mount.get("mountPath") if isinstance(mount, dict) else None
                if isinstance(path, str) and path.rstrip("/") == SERVICE_ACCOUNT_MOUNT:
                    if isinstance(name := mount.get("name"), str):
                        removed.add(name)
                else:
                    kept.append(mount)
            if kept:
                container["volumeMounts"] = kept
            else:
                container.pop("volumeMounts", None)
    volumes = spec.get("volumes")
    if removed and volumes and isinstance(volumes, list):
        spec["volumes"] = [
            v for v in volumes if not (isinstance(v, dict) and v.get("name") in removed)
        ]
        if not spec["volumes"]:
            del spec["volumes"]


def _items(value: Any) -> list[dict]:
    """The maps of a list in a manifest (user input: anything else is left for the target's
    API server to refuse)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _with_prefixed_label_fields(spec: dict, source_labels: dict, labels: dict) -> None:
    """The downward API reads a label by its key (``metadata.labels['k']``; the Job controller
    gives each pod of an indexed Job ``JOB_COMPLETION_INDEX`` so): on the delegate, a label
    that was prefixed is read under its prefixed key, which holds the same value."""

    def rewrite(ref: Any) -> None:
        path = ref.get("fieldPath") if isinstance(ref, dict) else None
        match = _LABEL_FIELD.fullmatch(path) if isinstance(path, str) else None
        if not match or match[1] in labels or match[1] not in source_labels:
            return
        key = prefixed_key(match[1])
        if labels.get(key) == source_labels[match[1]]:
            ref["fieldPath"] = f"metadata.labels['{key}']"

    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in _items(spec.get(field)):
            for env in _items(container.get("env")):
                value_from = env.get("valueFrom")
                if isinstance(value_from, dict):
                    rewrite(value_from.get("fieldRef"))
    for volume in _items(spec.get("volumes")):
        projected = volume.get("projected")
        sources = _items(projected.get("sources")) if isinstance(projected, dict) else []
        for api in [volume.get("downwardAPI"), *(s.get("downwardAPI") for s in sources)]:
            for item in _items(api.get("items")) if isinstance(api, dict) else ():
                rewrite(item.get("fieldRef"))


def delegate_pod(proxy: dict, manifest: dict, cluster_name: str) -> dict:
    """The delegate of ``proxy`` (the pod to create in a target), built from its manifest."""
    meta = proxy["metadata"]
    source_meta = manifest.get("metadata") or {}
    annotations = {
        k: v
        for k, v in (source_meta.get("annotations") or {}).items()
        if not k.startswith(keys.PREFIX)
    }
    annotations[keys.PARENT_NAME] = meta["name"]
    annotations[keys.PARENT_NAMESPACE] = meta["namespace"]
    annotations[keys.PARENT_CLUSTER_NAME] = cluster_name
    try:
        unprefixed = no_prefix_regexp(source_meta.get("annotations"))
    except ValueError as e:
        raise InvalidManifest(str(e)) from None
    labels = prefixed_labels(source_meta.get("labels") or {}, unprefixed)
    labels[keys.PARENT_UID] = meta["uid"]
    spec = orjson.loads(orjson.dumps(delegate_constraints(manifest)["spec"]))  # a deep copy
    spec.pop("nodeName", None)
    spec.pop("priority", None)
    _without_service_account_token(spec)
    _with_prefixed_label_fields(spec, source_meta.get("labels") or {}, labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": delegate_name(meta["name"], meta["uid"]),
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


PROXY_UID_INDEX = "uid"


def proxy_uid_index(pod: dict) -> list[str]:
    """Index proxy pods by uid: delegates name their proxy pod by its uid."""
    return [pod["metadata"]["uid"]]


def pod_reference(pod: dict) -> dict:
    """A cached pod (lists carry no kind) as events need it."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}


def parent_uid(delegate: dict) -> str | None:
    return (delegate["metadata"].get("labels") or {}).get(keys.PARENT_UID)


def parent_cluster(delegate: dict) -> str | None:
    annotations = (delegate.get("metadata") or {}).get("annotations")
    if not isinstance(annotations, dict):
        return None  # as a target sent it: anything may be missing
    found = annotations.get(keys.PARENT_CLUSTER_NAME)
    return found if isinstance(found, str) else None


def is_delegate_of(pod: dict, proxy: dict, cluster_name: str) -> bool:
    """Whether ``pod``, a pod of a target, is what this cluster makes as ``proxy``'s delegate.

    Labels and annotations are whatever whoever created the pod wrote: anyone who may create
    pods in a target can copy a proxy pod's uid and this cluster's name onto one. What they
    cannot choose is the pair of namespace and name: the delegate is in the proxy pod's
    namespace, under the name derived from the proxy's name and uid, and a pod of that name
    there is either the real delegate or stands where it would be."""
    meta, proxy_meta = pod["metadata"], proxy["metadata"]
    uid, namespace, name = proxy_meta["uid"], proxy_meta["namespace"], proxy_meta["name"]
    annotations = meta.get("annotations") or {}
    return (
        meta.get("namespace") == namespace
        and (meta.get("labels") or {}).get(keys.PARENT_UID) == uid
        and annotations.get(keys.PARENT_CLUSTER_NAME) == cluster_name
        and annotations.get(keys.PARENT_NAMESPACE) == namespace
        and annotations.get(keys.PARENT_NAME) == name
        and meta.get("name") == delegate_name(name, uid)
    )


def looks_like_delegate(pod: dict, cluster_name: str) -> bool:
    """Whether ``pod`` is named as the delegate this cluster would make for the proxy pod it
    names (whether or not that proxy pod still exists): only such pods are ever deleted as
    orphans, never a pod that merely carries our labels."""
    meta = pod["metadata"]
    annotations = meta.get("annotations") or {}
    uid = (meta.get("labels") or {}).get(keys.PARENT_UID)
    name = annotations.get(keys.PARENT_NAME)
    return (
        bool(uid and name)
        and annotations.get(keys.PARENT_CLUSTER_NAME) == cluster_name
        and annotations.get(keys.PARENT_NAMESPACE) == meta.get("namespace")
        and meta.get("name") == delegate_name(name, uid)  # type: ignore[arg-type]
    )


def not_made_by_webhook(proxy: dict) -> str | None:
    """What ``proxy`` lacks of what the webhook leaves on an elected pod (its saved manifest and
    our finalizer: without it, deleting the pod would not delete its delegate), or None."""
    meta = proxy["metadata"]
    missing = [
        what
        for what, present in (
            (
                f"no {keys.SOURCEPOD_MANIFEST} annotation",
                keys.SOURCEPOD_MANIFEST in (meta.get("annotations") or {}),
            ),
            (f"no {keys.FINALIZER} finalizer", keys.FINALIZER in (meta.get("finalizers") or ())),
        )
        if not present
    ]
    return " and ".join(missing) or None


_ANOTHER = "it was saved for another pod"


def untrusted_manifest(proxy: dict, key: ManifestKey) -> str | None:
    """Why the saved manifest of ``proxy`` is not one the webhook saved for it, if it is not:
    its MAC does not verify for the pod's namespace under ``key``, or the manifest names
    another pod, or it has no MAC and the pod was made after the key was (a pod made before,
    by an earlier release's webhook, which wrote no MAC, is trusted without one). None when it
    is (or when it has no manifest at all: :func:`not_made_by_webhook` says so)."""
    meta = proxy["metadata"]
    annotations = meta.get("annotations") or {}
    manifest = annotations.get(keys.SOURCEPOD_MANIFEST)
    if not isinstance(manifest, str):
        return None
    mac = annotations.get(keys.SOURCEPOD_MANIFEST_MAC)
    if mac is None:
        created = parse_time(meta.get("creationTimestamp"))
        if key.created is not None and created is not None and created.timestamp() < key.created:
            return None
        return (
            f"it has no {keys.SOURCEPOD_MANIFEST_MAC}, and the pod was made after the key that "
            "seals manifests: by hand, or admitted by the webhook of an earlier release while "
            "this one rolled out"
        )
    try:
        verify(key, meta["namespace"], manifest, mac)
    except ValueError as e:
        return f"its {keys.SOURCEPOD_MANIFEST_MAC}: {e}"
    try:
        saved = orjson.loads(manifest)
    except orjson.JSONDecodeError:
        saved = None
    saved_meta = saved.get("metadata") if isinstance(saved, dict) else None
    if not isinstance(saved_meta, dict):
        return _ANOTHER
    name, generated = saved_meta.get("name"), saved_meta.get("generateName")
    if name or not generated:
        if name != meta["name"]:
            return f"it was saved for pod {name[:253]!r}" if isinstance(name, str) else _ANOTHER
    elif not isinstance(generated, str) or not meta["name"].startswith(generated[:58]):
        # The API server keeps at most 58 characters of generateName, then adds 5.
        return (
            f"it was saved for a pod named {generated[:253]!r}…"
            if isinstance(generated, str)
            else _ANOTHER
        )
    return None


def pod_condition(pod: dict, kind: str) -> dict | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return condition
    return None


_PROXY_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
)
_DELEGATE_METADATA = _PROXY_METADATA[:8]
_READ_UNBOUND = (keys.SOURCEPOD_MANIFEST, keys.SOURCEPOD_MANIFEST_MAC)


def _shared_metadata(kept: dict) -> dict:
    """Identity fields interned, maps and lists (labels, owners, …) shared."""
    return {k: SHARED.share(v) for k, v in kept.items()}


def slim_proxy(pod: dict) -> dict:
    """What the scheduler and the virtual kubelet read of a proxy pod (no containers: the
    manifest annotation holds what the delegate needs, and only until the pod is bound: a
    bound proxy's manifest is never read again, and 10,000 of them are megabytes), and the
    config maps and secrets its own spec uses (``Kind:namespace/name``): a pod's volumes and
    env never change, and they bound what may follow its delegate. Equal parts of cached pods
    are one object (:class:`~multicluster.sharing.SharedValues`): read-only."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    kept = {k: meta[k] for k in _PROXY_METADATA if k in meta}
    annotations = kept.get("annotations")
    if spec.get("nodeName") and annotations and keys.SOURCEPOD_MANIFEST in annotations:
        kept["annotations"] = {k: v for k, v in annotations.items() if k not in _READ_UNBOUND}
    slim_spec = {"nodeName": spec.get("nodeName"), "schedulerName": spec.get("schedulerName")}
    if not spec.get("nodeName"):  # what the proxy pod asks of virtual nodes, until it is bound
        for name in ("nodeSelector", "affinity", "tolerations"):
            if spec.get(name):
                slim_spec[name] = spec[name]
    slim = {
        "metadata": _shared_metadata(kept),
        "spec": SHARED.share(slim_spec),
        "status": SHARED.share(pod.get("status") or {}),
    }
    used = reference_keys(meta.get("namespace") or "", spec)
    if used:
        slim["references"] = SHARED.share(used)
    return slim


def slim_delegate(pod: dict) -> dict:
    """What the caches keep of a delegate: identity, node, status, and the config maps and
    secrets it uses (``Kind:namespace/name``, for the follow controller). Of its labels, only
    ``parent-uid`` is read: the others (as many as whoever made the pod wrote) are not kept.
    Equal parts of cached pods are one object, as in :func:`slim_proxy`."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    kept = {k: meta[k] for k in _DELEGATE_METADATA if k in meta}
    uid = (meta.get("labels") or {}).get(keys.PARENT_UID)
    if uid is None:
        kept.pop("labels", None)
    else:
        kept["labels"] = {keys.PARENT_UID: uid}
    slim = {
        "metadata": _shared_metadata(kept),
        "spec": SHARED.share({"nodeName": spec.get("nodeName")}),
        "status": SHARED.share(pod.get("status") or {}),
    }
    used = reference_keys(meta.get("namespace") or "", spec)
    if used:
        slim["references"] = SHARED.share(used)
    return slim

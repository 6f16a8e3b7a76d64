"""How an elected pod becomes a proxy pod: the admission webhook's one decision, as pure functions.

The proxy pod stays in the source cluster and is scheduled by the proxy scheduler onto a virtual
node; the delegate that really runs is built later from the pod as the user wrote it. So the
mutation saves the pod as received, then pins the proxy to virtual nodes and lets go of it
quickly. It is kept apart from the server so that every step, and idempotence (the API server
may call a webhook again), is tested without a cluster or a socket.

The result is a list of RFC 6902 operations, emitted only for fields that differ from the proxy
form: mutating an already mutated pod yields an empty list. The manifest is saved with its MAC
(``api.manifest_mac``), made by the caller's ``seal``; whether a manifest a pod arrives with is
the webhook's own is the caller's to check first (``reinvocation``). A pod that cannot become a
working proxy is refused with the reason (ValueError): one bound to a node already, or one too
large for its manifest to fit in its annotations. What the delegate will lose is said in
warnings: user labels that become the same prefixed label.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.constraints import proxy_scheduling_constraints
from multicluster_scheduler.api.naming import prefixed_label_key
from multicluster_scheduler.api.regexps import compile_regexp

# Kubernetes' own taints, set by the node lifecycle controller.
NETWORK_UNAVAILABLE_TAINT = "node.kubernetes.io/network-unavailable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"

# Without tolerationSeconds: a proxy is never evicted when its virtual node goes NotReady or
# unreachable (a target that is down); it keeps its last known status instead.
PROXY_TOLERATIONS: Final[tuple[dict[str, str], ...]] = (
    {"key": keys.PROVIDER_KEY, "operator": "Equal", "value": keys.PROVIDER},
    {"key": NETWORK_UNAVAILABLE_TAINT, "operator": "Exists"},
    {"key": NOT_READY_TAINT, "operator": "Exists", "effect": "NoExecute"},
    {"key": UNREACHABLE_TAINT, "operator": "Exists", "effect": "NoExecute"},
)
PROXY_NODE_SELECTOR: Final[dict[str, str]] = {keys.PROVIDER_KEY: keys.PROVIDER}
HAS_FINALIZER_VALUE = "true"
REMOVED_SPEC_FIELDS = ("affinity", "topologySpreadConstraints")
# Kubernetes' limit on the total size of an object's annotations (keys and values, in bytes).
ANNOTATIONS_LIMIT = 256 * 1024

# The MAC of a manifest (the ``sourcepod-manifest-mac`` annotation's value), given the manifest.
Seal = Callable[[str], str]


def is_elected(pod: dict) -> bool:
    """Whether the pod opted in (the elect annotation, whatever its value).

    Raises ValueError when the pod, its metadata or its annotations are not objects.
    """
    metadata = _object(_pod(pod).get("metadata"), "metadata")
    return keys.ELECT in _object(metadata.get("annotations"), "metadata.annotations")


def mutation_patch(pod: dict, seal: Seal) -> list[dict]:
    """The JSON patch that turns ``pod`` into a proxy pod; empty when it already is one. A pod
    without a saved manifest gets one, with its MAC (``seal(manifest)``); one that has a
    manifest keeps it (the caller has checked that it is the webhook's own).

    Raises ValueError when ``pod`` cannot be patched (not an object, metadata or spec not
    objects, annotations or labels not maps of strings, finalizers not a list of strings) or
    cannot work as a proxy pod (``spec.nodeName`` set, annotations over the limit once the
    manifest is saved).
    """
    pod = _pod(pod)
    return _metadata_patch(pod, seal) + _spec_patch(pod)


def label_warnings(pod: dict) -> list[str]:
    """Warnings for the user: labels that become the same label of the delegate (each user
    label ``k=v`` is copied as ``multicluster.admiralty.io/<last segment of k>=v``; the key
    that sorts last wins) or that our own label replaces. Given once, when the pod is saved as
    the manifest the delegate is built from: none for a pod that has its manifest already (a
    reinvocation). Malformed labels give none."""
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(metadata, dict):
        return []
    labels, annotations = metadata.get("labels"), metadata.get("annotations")
    if not isinstance(labels, dict) or (
        isinstance(annotations, dict) and keys.SOURCEPOD_MANIFEST in annotations
    ):
        return []
    groups: dict[str, list[str]] = {}
    for key in sorted(labels):
        groups.setdefault(prefixed_label_key(key), []).append(key)
    warnings = []
    for prefixed, found in groups.items():
        if prefixed == keys.PARENT_UID:
            warnings.append(
                f"label {', '.join(found)} becomes {prefixed} on the delegate, where "
                "multicluster-scheduler sets its own value"
            )
        elif len(found) > 1:
            warnings.append(
                f"labels {', '.join(found)} all become {prefixed} on the delegate: {found[-1]} wins"
            )
    return warnings


def _metadata_patch(pod: dict, seal: Seal) -> list[dict]:
    if pod.get("metadata") is None:
        metadata = {
            "annotations": _saved(pod, {}, seal),
            "labels": {keys.HAS_FINALIZER: HAS_FINALIZER_VALUE},
            "finalizers": [keys.FINALIZER],
        }
        return [_op("add", "/metadata", metadata)]
    metadata = _object(pod["metadata"], "metadata")
    annotations = _string_map(metadata.get("annotations"), "metadata.annotations")
    labels = _string_map(metadata.get("labels"), "metadata.labels")
    finalizers = _string_list(metadata.get("finalizers"), "metadata.finalizers")

    if keys.NO_PREFIX_LABEL_REGEXP in annotations:
        try:
            compile_regexp(annotations[keys.NO_PREFIX_LABEL_REGEXP])
        except ValueError as e:
            raise ValueError(
                f"annotation {keys.NO_PREFIX_LABEL_REGEXP} is not a regular expression (RE2 "
                f"syntax, as Go's): {e}"
            ) from None
    ops = []
    if keys.SOURCEPOD_MANIFEST not in annotations:
        ops.extend(_set_entries(metadata, "annotations", _saved(pod, annotations, seal)))
    if labels.get(keys.HAS_FINALIZER) != HAS_FINALIZER_VALUE:
        ops.extend(_set_entries(metadata, "labels", {keys.HAS_FINALIZER: HAS_FINALIZER_VALUE}))
    if keys.FINALIZER not in finalizers:
        if metadata.get("finalizers") is None:
            ops.append(_op("add", "/metadata/finalizers", [keys.FINALIZER]))
        else:
            ops.append(_op("add", "/metadata/finalizers/-", keys.FINALIZER))
    return ops


def _set_entries(metadata: dict, field: str, wanted: dict[str, str]) -> list[dict]:
    """Set the keys of ``wanted`` in the map ``metadata[field]``, adding the map if it is
    missing."""
    entries = metadata.get(field)
    if entries is None:
        return [_op("add", f"/metadata/{field}", wanted)]
    return [
        _op("replace" if key in entries else "add", _path(f"/metadata/{field}", key), value)
        for key, value in wanted.items()
    ]


def _spec_patch(pod: dict) -> list[dict]:
    spec = _object(pod.get("spec"), "spec")
    if spec.get("nodeName") not in (None, ""):
        raise ValueError(
            f"spec.nodeName is set ({spec['nodeName']!r}): an elected pod is placed in a target "
            "cluster by multicluster-scheduler, so it cannot be bound to a node here; remove "
            f"spec.nodeName or the {keys.ELECT} annotation"
        )
    asks = _proxy_asks(pod, spec)
    wanted: dict[str, Any] = {}
    tolerations = [dict(toleration) for toleration in PROXY_TOLERATIONS]
    tolerations += asks.get("tolerations") or []
    if spec.get("tolerations") != tolerations:
        wanted["tolerations"] = tolerations
    if spec.get("schedulerName") != keys.PROXY_SCHEDULER_NAME:
        wanted["schedulerName"] = keys.PROXY_SCHEDULER_NAME
    selector = {**(asks.get("nodeSelector") or {}), **PROXY_NODE_SELECTOR}
    if spec.get("nodeSelector") != selector:
        wanted["nodeSelector"] = selector
    for field in REMOVED_SPEC_FIELDS:  # the proxy's own, or none
        if field in asks and spec.get(field) != asks[field]:
            wanted[field] = asks[field]
    grace = spec.get("terminationGracePeriodSeconds")
    if type(grace) is not int or grace != 0:  # strictly: false and 0.0 are not 0
        wanted["terminationGracePeriodSeconds"] = 0
    if pod.get("spec") is None:
        return [_op("add", "/spec", wanted)]

    ops = [_op("replace" if f in spec else "add", f"/spec/{f}", v) for f, v in wanted.items()]
    ops.extend(
        {"op": "remove", "path": f"/spec/{f}"}
        for f in REMOVED_SPEC_FIELDS
        if f in spec and f not in asks
    )
    return ops


def _proxy_asks(pod: dict, spec: dict) -> dict:
    """What the proxy pod asks of virtual nodes besides theirs (upstream's
    ``proxy-pod-scheduling-constraints`` and ``use-constraints-from-spec-…``): the pod's own
    constraints are those of the manifest once saved (a reinvocation sees the proxy's)."""
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return {}
    own = spec
    if keys.USE_CONSTRAINTS_FROM_SPEC in annotations and keys.SOURCEPOD_MANIFEST in annotations:
        try:
            saved = orjson.loads(annotations[keys.SOURCEPOD_MANIFEST])
            own = saved["spec"] if isinstance(saved.get("spec"), dict) else {}
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            own = {}
    return proxy_scheduling_constraints(annotations, own)


def _saved(pod: dict, annotations: dict[str, str], seal: Seal) -> dict[str, str]:
    """The pod as JSON and its MAC, the annotations to save next to ``annotations``; ValueError
    when the sum would be over Kubernetes' limit (the API server's own refusal would blame the
    user's annotations)."""
    try:
        manifest = orjson.dumps(pod).decode()
    except orjson.JSONEncodeError as e:
        raise ValueError(f"pod cannot be saved as JSON: {e}") from None
    entries = {keys.SOURCEPOD_MANIFEST: manifest, keys.SOURCEPOD_MANIFEST_MAC: seal(manifest)}
    own = sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())
    saved = sum(len(k.encode()) + len(v.encode()) for k, v in entries.items())
    if own + saved > ANNOTATIONS_LIMIT:
        raise ValueError(
            f"the pod is too large to be saved in its {keys.SOURCEPOD_MANIFEST} annotation: "
            f"its annotations would total {own + saved} bytes ({own} of its own, {saved} for "
            f"the saved pod), over the {ANNOTATIONS_LIMIT} bytes Kubernetes allows; make the "
            "pod smaller, its annotations first (they count twice)"
        )
    return entries


def _op(op: str, path: str, value: Any) -> dict:
    return {"op": op, "path": path, "value": value}


def _path(parent: str, key: str) -> str:
    """A JSON pointer to ``key`` of the object at ``parent`` (RFC 6901 escaping)."""
    return f"{parent}/{key.replace('~', '~0').replace('/', '~1')}"


def _pod(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"the object is not a pod but {_json_type(value)}")
    return value


def _object(value: Any, what: str) -> dict:
    """``value`` as an object; missing or null counts as empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object but {_json_type(value)}")
    return value


def _string_map(value: Any, what: str) -> dict[str, str]:
    value = _object(value, what)
    for key, item in value.items():
        if not isinstance(item, str):
            raise ValueError(f"{what} is not a map of strings: {key!r} is {_json_type(item)}")
    return value


def _string_list(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what} is not a list of strings")
    return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__

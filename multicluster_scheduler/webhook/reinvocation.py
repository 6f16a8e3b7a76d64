"""Whether a pod that arrives at the webhook with a saved manifest is the webhook's own answer.

The API server calls a mutating webhook again (``reinvocationPolicy: IfNeeded``) when a later
webhook changed the pod: the pod then arrives with the manifest and its MAC that this webhook
wrote moments before, in the same request, and is left as it is. Any other pod that arrives with
them had them written by whoever creates it (a manifest of their own, or a copy of another pod's,
in a pod or a pod template), and the webhook would keep that manifest, from which the delegate
is built instead of the pod admission saw: it is refused, with what to do.

Ours means: the MAC verifies for this namespace (``api.manifest_mac``), it was made for the user
who makes this request, not long ago, and the manifest is this pod's (its name, generateName
and owners; a controller's pods are told apart by their owner). The API server gives a pod its
uid only after mutating admission, so nothing closer to the pod can be checked here.

Pure, as the mutation: tested without a cluster.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.manifest_mac import ManifestKey, user_hash, verify

# A reinvocation comes within the request that made the MAC (each webhook may take 30 s at most);
# the agents that answer the two calls may have clocks a little apart.
REINVOCATION_WINDOW: Final = 300
SAVED: Final = (keys.SOURCEPOD_MANIFEST, keys.SOURCEPOD_MANIFEST_MAC)
IDENTITY: Final = ("name", "generateName", "ownerReferences")


def carries_saved_manifest(pod: Any) -> bool:
    """Whether ``pod`` arrives with a saved manifest or a MAC (whatever their values)."""
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return isinstance(annotations, dict) and any(key in annotations for key in SAVED)


def foreign_manifest(
    pod: dict, key: ManifestKey, *, namespace: str, username: str, now: float
) -> str | None:
    """Why the saved manifest ``pod`` arrives with is not the webhook's own, written for this
    request (the refusal's message); None when it is."""
    why = _why_not_ours(pod, key, namespace=namespace, username=username, now=now)
    if why is None:
        return None
    return (
        f"the pod carries a {keys.SOURCEPOD_MANIFEST} annotation multicluster-scheduler did not "
        f"write for you in this namespace ({why}): remove it, and "
        f"{keys.SOURCEPOD_MANIFEST_MAC}, from the pod or from its template"
    )


def _why_not_ours(
    pod: dict, key: ManifestKey, *, namespace: str, username: str, now: float
) -> str | None:
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    annotations = metadata.get("annotations")
    annotations = annotations if isinstance(annotations, dict) else {}
    manifest, mac = (annotations.get(k) for k in SAVED)
    if not isinstance(manifest, str):
        return f"{keys.SOURCEPOD_MANIFEST_MAC} without a manifest"
    if mac is None:
        return f"no {keys.SOURCEPOD_MANIFEST_MAC}"
    try:
        found = verify(key, namespace, manifest, mac)
    except ValueError as e:
        return f"its MAC: {e}"
    if found.user != user_hash(username):
        return "it was saved for a pod another user made"
    if abs(now - found.issued) > REINVOCATION_WINDOW:
        return f"it was saved {int(now - found.issued)} s ago, for another request"
    try:
        saved = orjson.loads(manifest)
    except orjson.JSONDecodeError:
        saved = None
    saved_metadata = saved.get("metadata") if isinstance(saved, dict) else None
    if not isinstance(saved_metadata, dict):
        return "it was saved for another pod"
    for field in IDENTITY:
        if (saved_metadata.get(field) or None) != (metadata.get(field) or None):
            return f"it was saved for another pod: its {field} differs"
    return None

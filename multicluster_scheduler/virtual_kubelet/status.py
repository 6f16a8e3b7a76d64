"""What a proxy pod should show of its delegate (pure functions, no I/O).

A kubelet reports its pods' status; the virtual kubelet reports the delegate's instead: phase,
conditions, container statuses, IPs and start time. As a kubelet keeps the conditions others
write on its pods, the proxy pod keeps those of the source's control plane that its delegate
does not have (DisruptionTarget: the Eviction API marks a pod so before deleting it, and a Job's
pod failure policy reads it). Annotations that the target adds to the delegate flow back too,
except ours (they describe the delegate, not the proxy pod).
"""

from __future__ import annotations

from ..api import keys

MIRRORED_STATUS = (
    "phase",
    "conditions",
    "message",
    "reason",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "startTime",
    "initContainerStatuses",
    "containerStatuses",
    "ephemeralContainerStatuses",
)
# Conditions written on a pod by others than its kubelet, which a kubelet keeps.
SOURCE_CONDITIONS = ("DisruptionTarget",)


def _conditions(have: dict, want: dict) -> object:
    """The delegate's conditions, and the proxy pod's of SOURCE_CONDITIONS types it lacks."""
    mirrored = want.get("conditions")
    own = have.get("conditions")
    if not isinstance(own, list) or not isinstance(mirrored, list | None):
        return mirrored  # not conditions: for the API server to refuse
    types = {c.get("type") for c in mirrored or () if isinstance(c, dict)}
    kept = [
        c
        for c in own
        if isinstance(c, dict) and c.get("type") in SOURCE_CONDITIONS and c["type"] not in types
    ]
    return [*(mirrored or ()), *kept] if kept else mirrored


def status_patch(proxy: dict, delegate: dict) -> dict | None:
    """A merge patch of the proxy pod's status that mirrors the delegate's, or None when they
    already agree. Lists are replaced whole, as merge patches do."""
    have = proxy.get("status") or {}
    want = delegate.get("status") or {}
    if want.get("phase", "Pending") == "Pending" and not want.get("containerStatuses"):
        return None  # nothing started yet: the proxy pod's own Pending status says as much
    patch = {}
    for field in MIRRORED_STATUS:
        value = _conditions(have, want) if field == "conditions" else want.get(field)
        if have.get(field) != value:
            patch[field] = value
    return patch or None


# Annotations of a delegate never copied back: ours (they describe the delegate), and those
# that a source's controller reads as a pod's report to it (Argo's controllers before v3.6 read
# a step's outputs from workflows.argoproj.io/outputs on its pod: a target would write them
# unchecked; task results are brought back and checked instead: virtual_kubelet.argo).
NOT_MIRRORED = (keys.PREFIX, "workflows.argoproj.io/")


def annotation_patch(proxy: dict, delegate: dict) -> dict | None:
    """Annotations of the delegate outside our prefix that the proxy pod lacks, or that it got
    from the delegate and that changed there; and the keys of all it got so
    (``mirrored-annotations``). An annotation of the proxy pod's own is never changed: a target
    would otherwise rewrite what controllers of the source read on their pods (Argo's node
    ID, a ReplicaSet's deletion cost), and a change made on the proxy pod would be undone."""
    have = proxy["metadata"].get("annotations") or {}
    mirrored = set(filter(None, (have.get(keys.MIRRORED_ANNOTATIONS) or "").split(",")))
    patch = {
        k: v
        for k, v in (delegate["metadata"].get("annotations") or {}).items()
        if not k.startswith(NOT_MIRRORED)
        and isinstance(v, str)
        and (k not in have or (k in mirrored and have[k] != v))
    }
    if not patch:
        return None
    if not set(patch) <= mirrored:
        patch[keys.MIRRORED_ANNOTATIONS] = ",".join(sorted(mirrored | set(patch)))
    return patch

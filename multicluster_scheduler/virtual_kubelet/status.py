"""What a proxy pod should show of its delegate (pure functions, no I/O).

A kubelet reports its pods' status; the virtual kubelet reports the delegate's instead: phase,
conditions, container statuses, IPs and start time. Annotations that the target adds to the
delegate flow back too, except ours (they describe the delegate, not the proxy pod).
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


def status_patch(proxy: dict, delegate: dict) -> dict | None:
    """A merge patch of the proxy pod's status that mirrors the delegate's, or None when they
    already agree. Lists are replaced whole, as merge patches do."""
    have = proxy.get("status") or {}
    want = delegate.get("status") or {}
    if want.get("phase", "Pending") == "Pending" and not want.get("containerStatuses"):
        return None  # nothing started yet: the proxy pod's own Pending status says as much
    patch = {}
    for field in MIRRORED_STATUS:
        if have.get(field) != want.get(field):
            patch[field] = want.get(field)
    return patch or None


def annotation_patch(proxy: dict, delegate: dict) -> dict | None:
    """Annotations of the delegate outside our prefix that the proxy pod lacks or differs on."""
    have = proxy["metadata"].get("annotations") or {}
    patch = {
        k: v
        for k, v in (delegate["metadata"].get("annotations") or {}).items()
        if not k.startswith(keys.PREFIX) and have.get(k) != v
    }
    return patch or None

"""What a proxy pod should show of its delegate (pure functions, no I/O).

A kubelet reports its pods' status; the virtual kubelet reports the delegate's instead: phase,
conditions, container statuses, IPs and start time. Annotations that the target adds to the
delegate flow back too, except ours (they describe the delegate, not the proxy pod).
"""

from __future__ import annotations

import datetime as dt

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


def failed_status(proxy: dict, reason: str, message: str) -> dict:
    """The status of a proxy pod whose delegate is lost: Failed, so that its owner replaces it.
    Containers that were running are reported terminated, as a kubelet would."""
    status = proxy.get("status") or {}
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    containers = []
    for container in status.get("containerStatuses") or ():
        state = container.get("state") or {}
        if "terminated" not in state:
            container = {
                **container,
                "ready": False,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": 137,
                        "reason": reason,
                        "message": message,
                        "startedAt": (state.get("running") or {}).get("startedAt") or now,
                        "finishedAt": now,
                    }
                },
            }
        containers.append(container)
    conditions = [
        {**c, "status": "False", "reason": reason}
        if c.get("type") in ("Ready", "ContainersReady")
        else c
        for c in status.get("conditions") or ()
    ]
    patch: dict = {"phase": "Failed", "reason": reason, "message": message}
    if containers:
        patch["containerStatuses"] = containers
    if conditions:
        patch["conditions"] = conditions
    return patch

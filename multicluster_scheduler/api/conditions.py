"""Status conditions as every Kubernetes object reports them."""

from __future__ import annotations

from multicluster.kubetime import format_time


def ready_condition(
    ready: bool | None, reason: str, message: str, generation: int | None, previous: list | None
) -> dict:
    """The Ready condition (Unknown when ``ready`` is None); its transition time moves only when
    its status changes."""
    status = "Unknown" if ready is None else ("True" if ready else "False")
    old = next((c for c in previous or () if c.get("type") == "Ready"), None)
    if old is None or old.get("status") != status:
        since = format_time()
    else:
        since = old.get("lastTransitionTime")
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }

"""Kubernetes Events: tell users what happened, where they look (``kubectl describe``)."""

from __future__ import annotations

import asyncio
import logging
import secrets

from .client import Client
from .errors import ApiError
from .kubetime import format_time
from .resources import EVENTS

log = logging.getLogger(__name__)
MAX_PENDING = 1000


class EventRecorder:
    def __init__(self, client: Client, component: str, *, default_namespace: str = "default"):
        self.client = client
        self.component = component
        self.default_namespace = default_namespace
        self._pending: set[asyncio.Task] = set()

    def emit(self, obj: dict, event_type: str, reason: str, message: str) -> None:
        """Record in the background: a reconciler never waits on an event. Past
        ``MAX_PENDING`` events in flight, new ones are dropped (and logged at debug level)."""
        if len(self._pending) >= MAX_PENDING:
            log.debug("event dropped reason=%s object=%s", reason, obj["metadata"]["name"])
            return
        task = asyncio.get_running_loop().create_task(self.record(obj, event_type, reason, message))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def record(self, obj: dict, event_type: str, reason: str, message: str) -> None:
        """Record an event about ``obj`` (cluster-scoped objects' go to the default namespace).
        Failing to record is logged, never raised: events are a courtesy."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or self.default_namespace
        now = format_time()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.create(EVENTS, event, namespace)
        except ApiError as e:
            log.warning("could not record event reason=%s object=%s: %s", reason, meta["name"], e)

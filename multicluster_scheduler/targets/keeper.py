"""Delegates kept alive while their source is away (target side, leader only).

This cluster's agent caches, of every pod with a ``parent-uid`` label here, what recreating it
needs when it is the delegate of another cluster and restarts always, and the heartbeat Leases
that source clusters renew here (:mod:`..api.keepalive`). When such a delegate is deleted, it is
noted; every few seconds each noted delegate is looked at:

- a pod of that name exists again (its source replaced it, or someone did): forgotten;
- its source renewed its heartbeat in that namespace after the delegate went: the source is
  there and decides (it deletes the proxy pod, whose owner makes another): forgotten;
- its source never renewed a heartbeat there (keeping alive is off): forgotten;
- no heartbeat for :data:`..api.keepalive.AWAY` seconds since the delegate went: the source is
  away, and the delegate is created again as it was, under the same name (with the annotation
  ``multicluster.admiralty.io/recreated-while-source-away``), and a Normal event says so.

What is noted lives in memory: a delegate deleted while this agent restarts is not recreated.
Heartbeats seen before this agent started count as renewed when it starts (it cannot tell
when they were), which delays a recreation by :data:`..api.keepalive.AWAY` at most.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass

from multicluster import AlreadyExists, ApiError, Cluster, Unreachable
from multicluster.errors import ServerError, TooManyRequests
from multicluster.events import EventRecorder
from multicluster.informer import DELETED
from multicluster.resources import LEASES, PODS

from ..api import keys
from ..api.keepalive import (
    AWAY,
    HEARTBEAT_LABEL,
    Verdict,
    heartbeat_source,
    kept,
    recreated,
    verdict,
)
from ..api.proxy import DELEGATE_LABEL_SELECTOR, pod_reference

log = logging.getLogger(__name__)
LOOK_EVERY = 5.0


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Missing:
    pod: dict  # what :func:`kept` held of it
    since: float  # monotonic


class DelegateKeeper:
    def __init__(self, local: Cluster, cluster_name: str) -> None:
        self.local = local
        self.cluster_name = cluster_name
        self.pods = local.informer(
            PODS, label_selector=DELEGATE_LABEL_SELECTOR, transform=self._kept
        )
        self.leases = local.informer(LEASES, label_selector=HEARTBEAT_LABEL)
        self.events = EventRecorder(local.client, "admiralty-keeper")
        self.missing: dict[tuple[str, str], Missing] = {}
        self.heartbeats: dict[tuple[str, str], float] = {}  # (namespace, source) → when seen

    def _kept(self, pod: dict) -> dict:
        return kept(pod, self.cluster_name)

    def _pod_event(self, event: str, pod: dict, _old: dict | None, _initial: bool) -> None:
        if event != DELETED or "source" not in pod:
            return
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        self.missing[key] = Missing(pod, time.monotonic())

    def _lease_event(self, event: str, lease: dict, _old: dict | None, _initial: bool) -> None:
        source = heartbeat_source(lease)
        if source is None:
            return
        key = (lease["metadata"]["namespace"], source)
        if event == DELETED:
            self.heartbeats.pop(key, None)
        else:
            self.heartbeats[key] = time.monotonic()

    async def run(self) -> None:
        """While leading: note what goes, and decide about it every :data:`LOOK_EVERY`."""
        self.leases.add_handler(self._lease_event)  # replays the cached ones: seen now
        self.pods.add_handler(self._pod_event)
        try:
            await asyncio.gather(self.pods.wait_synced(), self.leases.wait_synced())
            while True:
                await asyncio.sleep(LOOK_EVERY)
                await self.look()
        finally:
            self.pods.remove_handler(self._pod_event)
            self.leases.remove_handler(self._lease_event)
            self.missing.clear()
            self.heartbeats.clear()

    async def look(self) -> None:
        """Decide about each delegate gone (see the module's docstring)."""
        now = time.monotonic()
        for key, missing in list(self.missing.items()):
            namespace, name = key
            if self.pods.get(name, namespace) is not None:
                del self.missing[key]
                continue
            source = missing.pod["source"]
            decided = verdict(missing.since, self.heartbeats.get((namespace, source)), now)
            if decided is Verdict.FORGET:
                del self.missing[key]
            elif decided is Verdict.RECREATE:
                await self._recreate(key, missing)

    async def _recreate(self, key: tuple[str, str], missing: Missing) -> None:
        body = recreated(missing.pod, _now())
        namespace, name = key
        try:
            made = await self.local.client.create(PODS, body, namespace)
        except AlreadyExists:
            del self.missing[key]
            return
        except (Unreachable, ServerError, TooManyRequests) as e:
            log.info("delegate not recreated yet namespace=%s name=%s error=%s", namespace, name, e)
            return  # looked at again in a few seconds
        except ApiError as e:  # its namespace going, a quota, a policy: not to be retried
            del self.missing[key]
            log.warning(
                "delegate not recreated namespace=%s name=%s source=%s error=%s",
                namespace,
                name,
                missing.pod["source"],
                e,
            )
            return
        del self.missing[key]
        source = missing.pod["source"]
        annotations = missing.pod["metadata"].get("annotations") or {}
        log.info(
            "delegate recreated while its source is away namespace=%s name=%s source=%s",
            namespace,
            name,
            source,
        )
        self.events.emit(
            pod_reference(made),
            "Normal",
            "RecreatedWhileSourceAway",
            f"this delegate of pod {annotations.get(keys.PARENT_NAMESPACE)}/"
            f"{annotations.get(keys.PARENT_NAME)} of cluster {source} was deleted while that "
            f"cluster was away (no heartbeat for {AWAY:g}s): created again as it was",
        )

"""Delegates kept alive while their source is away (target side, leader only).

This cluster's agent caches the heartbeat Leases that source clusters renew here
(:mod:`..api.keepalive`) and, in each namespace where another cluster's heartbeat is, of every
pod with a ``parent-uid`` label, what recreating it needs when it is the delegate of another
cluster and restarts always. When such a delegate is deleted, it is
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
import logging
import time
from dataclasses import dataclass

from multicluster import AlreadyExists, ApiError, Cluster, Informer, Unreachable
from multicluster.errors import ServerError, TooManyRequests
from multicluster.events import EventRecorder
from multicluster.informer import DELETED
from multicluster.kubetime import format_time
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
    return format_time()


@dataclass
class Missing:
    pod: dict  # what :func:`kept` held of it
    since: float  # monotonic


class DelegateKeeper:
    def __init__(self, local: Cluster, cluster_name: str) -> None:
        self.local = local
        self.cluster_name = cluster_name
        self.leases = local.informer(LEASES, label_selector=HEARTBEAT_LABEL)
        # Pods are watched only in namespaces where another cluster's heartbeat is: a source
        # that places no delegate here costs nothing (its own delegates are watched already).
        self.pods: dict[str, Informer] = {}  # by namespace
        self.events = EventRecorder(local.client, "admiralty-keeper")
        self.missing: dict[tuple[str, str], Missing] = {}
        self.heartbeats: dict[tuple[str, str], float] = {}  # (namespace, source) → when seen
        self._removing: set[asyncio.Task] = set()

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
        if source is None or source == self.cluster_name:
            return
        namespace = lease["metadata"]["namespace"]
        key = (namespace, source)
        if event == DELETED:
            self.heartbeats.pop(key, None)
            if not any(ns == namespace for ns, _ in self.heartbeats):
                self._unwatch(namespace)
        else:
            self.heartbeats[key] = time.monotonic()
            self._watch(namespace)

    def _watch(self, namespace: str) -> None:
        if namespace in self.pods:
            return
        pods = self.local.informer(
            PODS, namespace, label_selector=DELEGATE_LABEL_SELECTOR, transform=self._kept
        )
        pods.add_handler(self._pod_event)
        self.pods[namespace] = pods

    def _unwatch(self, namespace: str) -> None:
        pods = self.pods.pop(namespace, None)
        if pods is None:
            return
        pods.remove_handler(self._pod_event)
        task = asyncio.get_running_loop().create_task(self.local.remove_informer(pods))
        self._removing.add(task)
        task.add_done_callback(self._removing.discard)
        for key in [k for k in self.missing if k[0] == namespace]:
            del self.missing[key]

    async def run(self) -> None:
        """While leading: note what goes, and decide about it every :data:`LOOK_EVERY`."""
        self.leases.add_handler(self._lease_event)  # replays the cached ones: seen now
        try:
            await self.leases.wait_synced()
            while True:
                await asyncio.sleep(LOOK_EVERY)
                await self.look()
        finally:
            self.leases.remove_handler(self._lease_event)
            for namespace in list(self.pods):
                self._unwatch(namespace)
            self.missing.clear()
            self.heartbeats.clear()

    async def look(self) -> None:
        """Decide about each delegate gone (see the module's docstring)."""
        now = time.monotonic()
        for key, missing in list(self.missing.items()):
            namespace, name = key
            pods = self.pods.get(namespace)
            if pods is None or pods.get(name, namespace) is not None:
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

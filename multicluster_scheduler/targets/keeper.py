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
MAX_RECREATIONS = 50  # per look: 10 a second at most


def _now() -> str:
    return format_time()


def _renew_time(lease: dict) -> object:
    return (lease.get("spec") or {}).get("renewTime")


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
        self._lease_sources: dict[tuple[str, str], str] = {}  # (namespace, name) → source

    def _kept(self, pod: dict) -> dict:
        return kept(pod, self.cluster_name)

    def _pod_event(self, event: str, pod: dict, _old: dict | None, _initial: bool) -> None:
        if event != DELETED or "source" not in pod:
            return
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        self.missing[key] = Missing(pod, time.monotonic())

    def _lease_event(self, event: str, lease: dict, old: dict | None, initial: bool) -> None:
        """A heartbeat seen: renewed (its ``renewTime`` changed, or first seen), or gone (deleted,
        being deleted, or no longer a heartbeat of that source: its entry goes with it)."""
        meta = lease["metadata"]
        lease_key = (meta["namespace"], meta["name"])
        source = heartbeat_source(lease)
        gone = event == DELETED or meta.get("deletionTimestamp") or source is None
        before = self._lease_sources.get(lease_key)
        if before is not None and (gone or before != source):
            self._lease_sources.pop(lease_key, None)
            self._forget_heartbeat(meta["namespace"], before)
        if gone or source is None or source == self.cluster_name:
            return
        self._lease_sources[lease_key] = source
        renewed = (
            before is None
            or old is None
            or (old.get("spec") or {}).get("renewTime")
            != (lease.get("spec") or {}).get("renewTime")
        )
        if renewed:
            self.heartbeats[(meta["namespace"], source)] = time.monotonic()
        self._watch(meta["namespace"])

    def _forget_heartbeat(self, namespace: str, source: str) -> None:
        self.heartbeats.pop((namespace, source), None)
        if not any(ns == namespace for ns, _ in self.heartbeats):
            self._unwatch(namespace)

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
        self.local.forget_informer(pods)  # at once: a heartbeat back soon gets a new one
        task = asyncio.get_running_loop().create_task(pods.stop())
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
                try:
                    await self.look()
                except Exception:  # keeping delegates alive is a courtesy: never fatal
                    log.exception("delegates gone not looked at")
        finally:
            self.leases.remove_handler(self._lease_event)
            for namespace in list(self.pods):
                self._unwatch(namespace)
            self.missing.clear()
            self.heartbeats.clear()
            self._lease_sources.clear()

    async def look(self) -> None:
        """Decide about each delegate gone (see the module's docstring), recreating
        :data:`MAX_RECREATIONS` at most each time (whoever forged heartbeats and deleted
        hundreds of pods gets them back at that rate)."""
        if not self.leases.healthy:
            return  # heartbeats not seen now: a source that is there could look away
        now = time.monotonic()
        recreations = 0
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
            elif decided is Verdict.RECREATE and recreations < MAX_RECREATIONS:
                recreations += 1
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

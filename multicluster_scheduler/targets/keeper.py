"""Delegates kept alive while their source is away (target side, leader only).

This cluster's agent caches the SourceHeartbeats that source clusters renew here
(:mod:`..api.keepalive`), the Sources and ClusterSources, and, in each namespace where another
cluster's heartbeat is, a few fields of every pod with a ``parent-uid`` label; of the delegates
a heartbeat lists, what recreating them needs too (from the first event of the pod after it was
listed, at the latest from its deletion's). When a delegate of another cluster that restarts
always is deleted, it is noted; every few seconds each noted delegate is looked at:

- a pod of that name exists again (its source replaced it, or someone did): forgotten;
- its source renewed its heartbeat in that namespace after the delegate went: the source is
  there and decides (it deletes the proxy pod, whose owner makes another): forgotten;
- its source has no heartbeat there (keeping alive is off): forgotten;
- no renewal for :data:`..api.keepalive.AWAY` seconds since the delegate went: the source is
  away. The delegate is created again as it was, under the same name (with the annotation
  ``multicluster.admiralty.io/recreated-while-source-away``; a Normal event
  ``RecreatedWhileSourceAway``), if :func:`..api.keepalive.refusal` finds nothing against it, a
  service account that wrote the heartbeat wrote it with a token of its own account, the one of
  that name now (:func:`..api.keepalive.account_refusal`), and the heartbeat's writer may create
  pods in that namespace now (a SubjectAccessReview); else a Warning event ``NotRecreated`` and
  a log line say why, once.

Leases (the previous release's heartbeats) are not read: anyone with ``edit`` in a namespace may
write one.

What is noted lives in memory: a delegate deleted while this agent restarts is not recreated.
Heartbeats seen before this agent started count as renewed when it starts (it cannot tell
when they were), which delays a recreation by :data:`..api.keepalive.AWAY` at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from multicluster import AlreadyExists, ApiError, Cluster, Informer, NotFound, Unreachable
from multicluster.errors import ServerError, TooManyRequests
from multicluster.events import EventRecorder
from multicluster.informer import DELETED
from multicluster.kubetime import format_time
from multicluster.resources import PODS, SERVICEACCOUNTS, SUBJECT_ACCESS_REVIEWS

from ..api import keys
from ..api.keepalive import (
    AWAY,
    Heartbeat,
    Verdict,
    account_refusal,
    groups_of,
    known_writer,
    read_heartbeat,
    recreated,
    refusal,
    service_account,
    slim,
    verdict,
)
from ..api.proxy import DELEGATE_LABEL_SELECTOR, pod_reference
from ..api.resources import CLUSTER_SOURCES, SOURCE_HEARTBEATS, SOURCES

log = logging.getLogger(__name__)
LOOK_EVERY = 5.0
MAX_RECREATIONS = 50  # decisions per look: 10 a second at most
REVIEW_TIMEOUT = 5.0

# Whether ``user`` (with these groups) may create pods in ``namespace``: None if so, else why not.
Access = Callable[[str, list[str], str], Awaitable[str | None]]


def _now() -> str:
    return format_time()


@dataclass
class Seen:
    """A heartbeat as this agent follows it."""

    heartbeat: Heartbeat
    renewed: float  # when its renewTime last changed (monotonic)


@dataclass
class Missing:
    pod: dict  # what :func:`slim` held of it
    since: float  # monotonic


class DelegateKeeper:
    def __init__(self, local: Cluster, cluster_name: str, access: Access | None = None) -> None:
        self.local = local
        self.cluster_name = cluster_name
        self.access = access or self._review
        self.heartbeat_informer = local.informer(SOURCE_HEARTBEATS)
        self.sources = local.informer(SOURCES)
        self.cluster_sources = local.informer(CLUSTER_SOURCES)
        # Pods are watched only in namespaces where another cluster's heartbeat is: a source
        # that places no delegate here costs nothing (its own delegates are watched already).
        self.pods: dict[str, Informer] = {}  # by namespace
        self.events = EventRecorder(local.client, "admiralty-keeper")
        self.missing: dict[tuple[str, str], Missing] = {}
        self.heartbeats: dict[tuple[str, str], Seen] = {}  # (namespace, source) →
        self._removing: set[asyncio.Task] = set()
        self._sources_of: dict[tuple[str, str], str] = {}  # (namespace, name) → source

    # -- pods ---------------------------------------------------------------------------------

    def _slim(self, pod: dict) -> dict:
        """What the pods' cache holds (with what recreating the pod needs if it is listed)."""
        held = slim(pod, self.cluster_name)
        source = held.get("source")
        if source is None:
            return held
        meta = held["metadata"]
        seen = self.heartbeats.get((meta.get("namespace") or "", source))
        if seen is not None and seen.heartbeat.lists(meta["name"], meta.get("uid")):
            return slim(pod, self.cluster_name, listed=True)
        return held

    def _pod_event(self, event: str, pod: dict, _old: dict | None, _initial: bool) -> None:
        if event != DELETED or "source" not in pod:
            return
        meta = pod["metadata"]
        self.missing[(meta["namespace"], meta["name"])] = Missing(pod, time.monotonic())

    # -- heartbeats ---------------------------------------------------------------------------

    def _heartbeat_event(self, event: str, obj: dict, old: dict | None, initial: bool) -> None:
        """A heartbeat seen: renewed (its ``renewTime`` changed, or first seen), changed (its
        list), or gone (deleted, being deleted, or no longer a heartbeat of that source: its
        entry goes with it)."""
        meta = obj["metadata"]
        namespace = meta["namespace"]
        obj_key = (namespace, meta["name"])
        read = None if event == DELETED else read_heartbeat(obj)
        source = read.source if read is not None else None
        before = self._sources_of.get(obj_key)
        if before is not None and before != source:
            self._sources_of.pop(obj_key, None)
            self._forget_heartbeat(namespace, before)
        if read is None or read.source == self.cluster_name:
            return
        self._sources_of[obj_key] = read.source
        earlier = self.heartbeats.get((namespace, read.source))
        now = time.monotonic()
        renewed = earlier is None or earlier.heartbeat.renew_time != read.renew_time
        self.heartbeats[(namespace, read.source)] = Seen(
            read, now if renewed else earlier.renewed if earlier else now
        )
        self._watch(namespace)

    def _forget_heartbeat(self, namespace: str, source: str) -> None:
        self.heartbeats.pop((namespace, source), None)
        if not any(ns == namespace for ns, _ in self.heartbeats):
            self._unwatch(namespace)

    def _watch(self, namespace: str) -> None:
        if namespace in self.pods:
            return
        pods = self.local.informer(
            PODS, namespace, label_selector=DELEGATE_LABEL_SELECTOR, transform=self._slim
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

    # -- deciding -----------------------------------------------------------------------------

    async def run(self) -> None:
        """While leading: note what goes, and decide about it every :data:`LOOK_EVERY`."""
        self.heartbeat_informer.add_handler(self._heartbeat_event)  # replays the cached ones
        try:
            await self.heartbeat_informer.wait_synced()
            while True:
                await asyncio.sleep(LOOK_EVERY)
                try:
                    await self.look()
                except Exception:  # keeping delegates alive is a courtesy: never fatal
                    log.exception("delegates gone not looked at")
        finally:
            self.heartbeat_informer.remove_handler(self._heartbeat_event)
            for namespace in list(self.pods):
                self._unwatch(namespace)
            self.missing.clear()
            self.heartbeats.clear()
            self._sources_of.clear()

    def _writer_known(self, heartbeat: Heartbeat, namespace: str) -> bool:
        if not (self.sources.has_synced and self.cluster_sources.has_synced):
            return False
        return known_writer(
            heartbeat.writer, self.sources.list(namespace), self.cluster_sources.list()
        )

    async def look(self) -> None:
        """Decide about each delegate gone (see the module's docstring), recreating or refusing
        :data:`MAX_RECREATIONS` at most each time (whoever deleted hundreds of pods gets them
        back at that rate)."""
        if not self.heartbeat_informer.healthy:
            return  # heartbeats not seen now: a source that is there could look away
        now = time.monotonic()
        decided = 0
        for key, missing in list(self.missing.items()):
            namespace, name = key
            pods = self.pods.get(namespace)
            if pods is None or pods.get(name, namespace) is not None:
                del self.missing[key]
                continue
            seen = self.heartbeats.get((namespace, missing.pod["source"]))
            what = verdict(missing.since, seen.renewed if seen is not None else None, now)
            if what is Verdict.FORGET:
                del self.missing[key]
            elif what is Verdict.RECREATE and decided < MAX_RECREATIONS and seen is not None:
                decided += 1
                await self._decide(key, missing, seen.heartbeat)

    async def _decide(self, key: tuple[str, str], missing: Missing, heartbeat: Heartbeat) -> None:
        namespace, name = key
        why = refusal(missing.pod, heartbeat, self._writer_known(heartbeat, namespace))
        if why is None:
            why = await self._account(heartbeat)
        if why is None:
            why = await self.access(heartbeat.writer, groups_of(heartbeat.writer), namespace)
        if why is None:
            await self._recreate(key, missing)
            return
        del self.missing[key]
        source = missing.pod["source"]
        log.info(
            "delegate not recreated namespace=%s name=%s source=%s why=%r",
            namespace,
            name,
            source,
            why,
        )
        self.events.emit(
            pod_reference(missing.pod),
            "Warning",
            "NotRecreated",
            f"this pod, deleted while cluster {source} was away (no heartbeat for {AWAY:g}s), is "
            f"not created again: {why}",
        )

    async def _account(self, heartbeat: Heartbeat) -> str | None:
        """Why the heartbeat is not the word of the service account that wrote it, if one did
        (:func:`..api.keepalive.account_refusal`, with the uid that account has now)."""
        account = service_account(heartbeat.writer)
        if account is None:
            return None
        namespace, name = account
        try:
            async with asyncio.timeout(REVIEW_TIMEOUT):
                found = await self.local.client.get(SERVICEACCOUNTS, name, namespace)
        except NotFound:
            found = None
        except (ApiError, TimeoutError) as e:
            return f"service account {namespace}/{name} could not be read: {e}"
        uid = (found.get("metadata") or {}).get("uid") if isinstance(found, dict) else None
        return account_refusal(heartbeat, uid if isinstance(uid, str) else None)

    async def _review(self, user: str, groups: list[str], namespace: str) -> str | None:
        """Whether ``user`` may create pods in ``namespace`` now, as the API server says."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": "create",
                    "resource": "pods",
                },
            },
        }
        try:
            async with asyncio.timeout(REVIEW_TIMEOUT):
                answer = await self.local.client.create(SUBJECT_ACCESS_REVIEWS, review)
        except (ApiError, TimeoutError) as e:
            return f"whether {user} may create pods here could not be checked: {e}"
        status = answer.get("status") or {}
        if status.get("allowed") is True and not status.get("denied"):
            return None
        reason = status.get("reason") or status.get("evaluationError")
        return f"{user} may not create pods in namespace {namespace} now" + (
            f" ({reason})" if reason else ""
        )

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

"""Delegates' Events reflected onto their proxy pods (source side, leader only).

For each connected target, an informer watches the Events about pods
(``involvedObject.kind=Pod``) in the namespaces the target serves: a Target's own, all of them
for a ClusterTarget, as the Source role there allows (``list`` and ``watch`` on events). An Event
about one of our delegates, by uid, is written on its proxy pod as :mod:`.delegate_events` says,
at once, in the background, and bounded: nothing is polled, and nothing waits on another target.

The cache of Events has a budget of its own (``EVENT_CACHE``), one for the Targets of a namespace
together (as the rest of what is cached of them: a tenant who makes ten Targets does not get ten
budgets) and one per ClusterTarget: a target that sends more makes its events stop being
reflected, never its delegates stop being seen. Events listed
when a watch starts are reflected only if recent (:data:`.delegate_events.REPLAY_WINDOW`), and
those already reflected before an agent restart are written again under the same name (their
count brought up to date), not twice. An Event that arrives before its delegate is cached is
reflected when the delegate is (looked at once per delegate: a target that says a pod is added
again and again would otherwise have every Event cached about it looked at each time). Self
targets are left out: their delegates' Events are in this cluster already (``kubectl describe``
the delegate).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from multicluster import (
    AlreadyExists,
    ApiError,
    CacheBudget,
    Cluster,
    Informer,
    NotFound,
    Registration,
    metrics,
)
from multicluster.events import Correlator
from multicluster.informer import ADDED, DELETED
from multicluster.resources import EVENTS

from ..targets.delegates import DelegateLookup
from ..targets.limits import owner
from ..targets.registry import TargetConnection
from .delegate_events import (
    PROXY_BURST,
    PROXY_REFILL,
    REPLAY_WINDOW,
    TARGET_BURST,
    TARGET_RATE,
    TOTAL_BURST,
    TOTAL_RATE,
    DelegateEvent,
    Reflection,
    Reflections,
    count_patch,
    delegate_event,
    involved_uid,
    is_recent,
    reflected_event,
    slim_event,
)

log = logging.getLogger(__name__)
POD_EVENTS = "involvedObject.kind=Pod"
INVOLVED_INDEX = "involved-uid"
UID_INDEX = "uid"
EVENT_CACHE = 16 << 20
MAX_PENDING = 256  # writes in flight, all targets together
MAX_REPLAYED = 1024  # delegates of one target whose earlier Events were looked at, remembered

REFLECTED = Counter(
    "multicluster_scheduler_delegate_events_reflected_total",
    "Events of delegates in targets written on their proxy pods, by target (virtual node) and "
    "write (created: a new Event; updated: the count of one raised).",
    ["target", "write"],
    registry=metrics.REGISTRY,
)
DROPPED = Counter(
    "multicluster_scheduler_delegate_events_dropped_total",
    "Events of delegates in targets not written on their proxy pods, by target (virtual node) "
    "and reason (proxy_rate_limit, target_rate_limit, total_rate_limit, backlog, invalid, "
    "failed).",
    ["target", "reason"],
    registry=metrics.REGISTRY,
)


def _uid(pod: dict) -> list[str]:
    uid = pod["metadata"].get("uid")
    return [uid] if uid else []


@dataclass(eq=False)
class TargetEvents:
    """One target's watch of Events, and what it may write."""

    connection: TargetConnection
    informer: Informer
    since: dt.datetime  # listed Events seen before this are history
    registrations: list[Registration] = field(default_factory=list)
    # Delegates (by uid) whose Events cached before them were looked at: once each, however
    # often the target says the pod is added again.
    replayed: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def first_replay(self, uid: str) -> bool:
        """Whether the Events cached before delegate ``uid`` are still to be looked at (now
        remembered as looked at; the least recent delegates are forgotten first)."""
        if uid in self.replayed:
            self.replayed.move_to_end(uid)
            return False
        self.replayed[uid] = None
        while len(self.replayed) > MAX_REPLAYED:
            self.replayed.popitem(last=False)
        return True


class EventReflector:
    """Reflects the Events of every connected target's delegates onto their proxy pods."""

    def __init__(
        self,
        local: Cluster,
        lookup: DelegateLookup,
        *,
        proxy_limits: Correlator | None = None,
        target_limits: Correlator | None = None,
        total_limits: Correlator | None = None,
        event_cache: int = EVENT_CACHE,
    ) -> None:
        self.local = local
        self.lookup = lookup
        self.registry = lookup.registry
        self.event_cache = event_cache
        self.proxy_limits = proxy_limits or Correlator(burst=PROXY_BURST, refill_every=PROXY_REFILL)
        self.target_limits = target_limits or Correlator(
            burst=TARGET_BURST, refill_every=1.0 / TARGET_RATE
        )
        self.total_limits = total_limits or Correlator(
            burst=TOTAL_BURST, refill_every=1.0 / TOTAL_RATE
        )
        self.reflections = Reflections()
        self._budgets: dict[str, CacheBudget] = {}  # by owner (targets.limits.owner)
        self.targets: dict[str, TargetEvents] = {}
        self._tasks: set[asyncio.Task] = set()
        self.registry.on_connected(self._connected)
        self.registry.on_disconnected(self._disconnected)

    # -- wiring -------------------------------------------------------------------------------

    def _connected(self, connection: TargetConnection) -> None:
        cluster, delegates = connection.cluster, connection.delegates
        if cluster is None or delegates is None or cluster is self.local:
            return  # a self target: its delegates' events are here already
        node = connection.node_name
        self._stop(node)
        informer = Informer(
            cluster.client,
            EVENTS,
            connection.namespace,
            field_selector=POD_EVENTS,
            transform=slim_event,
            cluster=node,
            idle_timeout=cluster.idle_timeout,
            budget=self._budget(connection),
        )
        informer.add_indexer(INVOLVED_INDEX, involved_uid)
        delegates.add_indexer(UID_INDEX, _uid)
        watch = TargetEvents(connection, informer, since=_now() - _seconds(REPLAY_WINDOW))

        def on_event(kind: str, slim: dict, old: dict | None, initial: bool) -> None:
            if kind == DELETED or (old is not None and old.get("count") == slim.get("count")):
                return  # gone, or changed without being said again
            if initial and not is_recent(slim, watch.since):
                return
            self._observe(watch, slim)

        def on_delegate(kind: str, pod: dict, _old: dict | None, _initial: bool) -> None:
            """Events that came before the delegate was cached (it may come second)."""
            uid = pod["metadata"].get("uid")
            if kind != ADDED or not uid or not watch.first_replay(uid):
                return  # a hostile target's pod added again and again costs no look each time
            recent = _now() - _seconds(REPLAY_WINDOW)
            for slim in informer.by_index(INVOLVED_INDEX, uid):
                if is_recent(slim, recent):
                    self._observe(watch, slim)

        watch.registrations = [informer.add_handler(on_event), delegates.add_handler(on_delegate)]
        self.targets[node] = watch
        informer.start()

    def _budget(self, connection: TargetConnection) -> CacheBudget:
        """What the Events of ``connection`` may take: a namespace's Targets share one budget,
        as they share one for the rest of what is cached of them; a ClusterTarget has one."""
        key = owner(connection.name, connection.namespace)
        found = self._budgets.get(key)
        if found is None:
            holder = (
                f"the events of the Targets of namespace {connection.namespace}"
                if connection.namespace
                else f"the events of ClusterTarget {connection.name}"
            )
            found = self._budgets[key] = CacheBudget(self.event_cache, holder)
        return found

    def _disconnected(self, connection: TargetConnection) -> None:
        self._stop(connection.node_name)

    def _stop(self, node: str) -> None:
        watch = self.targets.pop(node, None)
        if watch is None:
            return
        for registration in watch.registrations:
            registration.remove()
        self._spawn(watch.informer.stop())

    async def run(self) -> None:
        """Nothing to run (informers start with their targets); stops them when the agent
        stops."""
        try:
            await asyncio.Event().wait()
        finally:
            for node in list(self.targets):
                self._stop(node)
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- one event ----------------------------------------------------------------------------

    def _observe(self, watch: TargetEvents, slim: dict) -> None:
        connection = watch.connection
        delegates = connection.delegates
        if delegates is None:
            return
        found = [
            pod
            for pod in delegates.by_index(UID_INDEX, slim["involvedUid"])
            if pod["metadata"].get("namespace") == slim["metadata"]["namespace"]
        ]
        proxy = self.lookup.proxy_of(found[0], connection) if len(found) == 1 else None
        if proxy is None:
            return  # not one of our delegates, whatever the event says
        if self.lookup.home(proxy) is not connection:
            return  # seen through another Target of the same cluster: that one says it
        node = connection.node_name
        event = delegate_event(slim)
        if event is None:
            DROPPED.labels(node, "invalid").inc()
            return
        meta = proxy["metadata"]
        key = (meta["uid"], node, event.type, event.reason, event.raw_message)
        reflection, due = self.reflections.observe(key, meta["name"], event, _now())
        if not due or reflection.writing:
            return  # nothing new, or the write under way takes the new count too
        why = self._limited(proxy, connection)
        if why is not None:
            DROPPED.labels(node, why).inc()
            return
        reflection.writing = True
        self._spawn(self._write(proxy, connection, event, reflection))

    def _limited(
        self, proxy: dict, connection: TargetConnection, *, writing: bool = False
    ) -> str | None:
        """Why a write about ``proxy`` from ``connection`` may not be made now, if it may not
        (``writing``: by a write under way, which holds its place). The limit of a target is
        its owner's: a namespace's Targets share one."""
        if not writing and len(self._tasks) >= MAX_PENDING:
            return "backlog"
        meta = proxy["metadata"]
        if not self.proxy_limits.allow((meta["namespace"], "Pod", meta["name"], meta["uid"])):
            return "proxy_rate_limit"
        who = owner(connection.name, connection.namespace)
        if not self.target_limits.allow(("", "Target", who, "")):
            return "target_rate_limit"
        if not self.total_limits.allow(("", "", "", "")):
            return "total_rate_limit"
        return None

    async def _write(
        self,
        proxy: dict,
        connection: TargetConnection,
        event: DelegateEvent,
        reflection: Reflection,
    ) -> None:
        """Write the reflection's count, and again while it grows and the limits allow."""
        node = connection.node_name
        namespace = proxy["metadata"]["namespace"]
        try:
            while True:
                await self._write_once(proxy, connection, event, reflection)
                if not reflection.due:
                    return
                why = self._limited(proxy, connection, writing=True)
                if why is not None:
                    DROPPED.labels(node, why).inc()
                    return
        except ApiError as e:
            DROPPED.labels(node, "failed").inc()
            log.warning(
                "delegate event not reflected namespace=%s proxy=%s target=%s reason=%s: %s",
                namespace,
                proxy["metadata"]["name"],
                node,
                event.reason,
                e,
            )
        finally:
            reflection.writing = False

    async def _write_once(
        self,
        proxy: dict,
        connection: TargetConnection,
        event: DelegateEvent,
        reflection: Reflection,
    ) -> None:
        node = connection.node_name
        namespace = proxy["metadata"]["namespace"]
        client = self.local.client
        count = reflection.count
        if reflection.written:
            try:
                await client.patch(EVENTS, reflection.name, count_patch(reflection), namespace)
                REFLECTED.labels(node, "updated").inc()
            except NotFound:  # expired (an hour, by default) or deleted: written anew
                reflection.written = 0
        if not reflection.written:
            body = reflected_event(proxy, node, connection.name, event, reflection)
            try:
                await client.create(EVENTS, body, namespace)
                REFLECTED.labels(node, "created").inc()
            except AlreadyExists:  # reflected before this agent restarted
                await client.patch(EVENTS, reflection.name, count_patch(reflection), namespace)
                REFLECTED.labels(node, "updated").inc()
        reflection.written = count

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _seconds(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=seconds)

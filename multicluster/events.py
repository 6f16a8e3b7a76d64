"""Kubernetes Events: tell users what happened, where they look (``kubectl describe``).

As client-go's recorder does, repeats are correlated rather than written again: the same event
(object, type, reason and message) recorded again raises the ``count`` of the Event already
written and moves its ``lastTimestamp``, so ``kubectl describe`` shows ``(x12 over 5m)``
instead of twelve lines; and each object gets at most 25 writes at once, then one every five
minutes, however often a controller says something about it. Controllers may therefore record
what they see on every reconcile, and need not remember what they already said.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field

from .client import Client
from .errors import ApiError, Conflict, NamespaceTerminating, NotFound
from .kubetime import format_time
from .resources import EVENTS

log = logging.getLogger(__name__)
MAX_PENDING = 1000
MAX_MESSAGE = 1024

ObjectKey = tuple[str, str, str, str]  # namespace, kind, name, uid
EventKey = tuple[ObjectKey, str, str, str]  # the object, type, reason, message


@dataclass
class Written:
    """An Event written for a key: its name and how many times it was recorded."""

    name: str
    count: int


class Correlator:
    """Which write an event takes: a new Event, a count raised on the one written before, or
    none (the object's writes are spent). Objects get ``burst`` writes, then one per
    ``refill_every`` seconds (client-go: 25, then one every 5 minutes); ``max_entries`` events
    and objects are remembered, the least recent forgotten first."""

    def __init__(
        self,
        *,
        burst: int = 25,
        refill_every: float = 300.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst = burst
        self.refill_every = refill_every
        self.max_entries = max_entries
        self.clock = clock
        self._written: OrderedDict[EventKey, Written] = OrderedDict()
        self._tokens: OrderedDict[ObjectKey, tuple[float, float]] = OrderedDict()

    def allow(self, obj: ObjectKey) -> bool:
        """Take one of the object's writes, if it has one left."""
        now = self.clock()
        tokens, since = self._tokens.pop(obj, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - since) / self.refill_every)
        allowed = tokens >= 1.0
        self._tokens[obj] = (tokens - 1.0 if allowed else tokens, now)
        _trim(self._tokens, self.max_entries)
        return allowed

    def written(self, key: EventKey) -> Written | None:
        """The Event written for ``key``, if remembered (now the most recent)."""
        entry = self._written.get(key)
        if entry is not None:
            self._written.move_to_end(key)
        return entry

    def remember(self, key: EventKey, entry: Written) -> None:
        self._written[key] = entry
        self._written.move_to_end(key)
        _trim(self._written, self.max_entries)

    def forget(self, key: EventKey) -> None:
        self._written.pop(key, None)


def _trim(entries: OrderedDict, most: int) -> None:
    while len(entries) > most:
        entries.popitem(last=False)


def object_key(obj: dict, default_namespace: str) -> ObjectKey:
    meta = obj["metadata"]
    return (
        meta.get("namespace") or default_namespace,
        obj.get("kind") or "",
        meta["name"],
        meta.get("uid") or "",
    )


@dataclass(eq=False)
class EventRecorder:
    """Writes the Events of one ``component`` with ``client``; those about cluster-scoped
    objects go to ``default_namespace``."""

    client: Client
    component: str
    _: KW_ONLY
    default_namespace: str = "default"
    correlator: Correlator = field(default_factory=Correlator)
    _pending: set[asyncio.Task] = field(default_factory=set, init=False, repr=False)

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
        """Record an event about ``obj`` (cluster-scoped objects' go to the default namespace):
        a new Event, or the count of the same one raised. Failing to record is logged, never
        raised: events are a courtesy."""
        target = object_key(obj, self.default_namespace)
        message = message[:MAX_MESSAGE]
        key = (target, event_type, reason, message)
        if not self.correlator.allow(target):
            log.debug("event spent reason=%s object=%s", reason, target[2])
            return
        try:
            await self._write(obj, key)
        except NamespaceTerminating:  # its object goes with the namespace: nobody would read it
            log.debug(
                "event dropped reason=%s object=%s: namespace being deleted", reason, target[2]
            )
        except ApiError as e:
            log.warning("could not record event reason=%s object=%s: %s", reason, target[2], e)

    async def _write(self, obj: dict, key: EventKey) -> None:
        namespace = key[0][0]
        now = format_time()
        written = self.correlator.written(key)
        if written is not None:
            patch = {"count": written.count + 1, "lastTimestamp": now}
            try:
                await self.client.patch(EVENTS, written.name, patch, namespace)
                written.count += 1
                return
            except NotFound:  # expired (Events live an hour by default): write it anew
                self.correlator.forget(key)
        name = f"{obj['metadata']['name']}.{secrets.token_hex(8)}"
        try:
            await self.client.create(EVENTS, self._event(obj, key, name, now), namespace)
        except Conflict:
            return  # that name, already taken: cannot happen but by chance; nothing lost
        self.correlator.remember(key, Written(name, 1))

    def _event(self, obj: dict, key: EventKey, name: str, now: str) -> dict:
        meta = obj["metadata"]
        (namespace, _, _, _), event_type, reason, message = key
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
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
            "message": message,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

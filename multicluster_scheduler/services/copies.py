"""Copies of this cluster's objects in its targets, for the services and ingresses controllers.

A global Service, and an Ingress that routes to one, are copied to each connected target that
serves their namespace, self targets excepted (the original is there already). What differs
between the two kinds is pure (:class:`CopyKind`: the copy to keep, whether a copy is out of
date, how it is updated); how copies are kept is the same, and lives here once:

- Copies are kept equal to their original and recreated if deleted; an object of the same name
  that is not our copy is never overwritten (a Warning event on the original says so). A copy
  deleted in its target by someone else is made again at once, from the deletion's watch event;
  deleted again and again, after 1, 2, 4... s, at most five minutes (``RepeatBackoff``), so
  that a target cannot keep us writing it. So is a copy changed there while its original stays
  as it was (a change of the original is written at once).
- The original carries our finalizer while it is copied: when it is deleted, or is no longer
  to be copied, its copies are deleted from every target that can be reached, then the
  finalizer is removed.
- A copy left meanwhile in a target that could not be reached is deleted when that target is
  seen again, since each target's copies are cached and reconciled against their originals:
  when the target's informer has synced, when the target becomes ready again, when that
  informer recovers from an error, and every five minutes anyway (from the caches, no API call
  unless a copy is out of date), so that no copy is orphaned because an event was missed or a
  requeue was lost.
- One reconcile handles one original in all targets at once, each target within its own time
  limit, so a slow or broken target never holds back the others. Requests to the targets of
  one owner (a namespace's Targets, or a ClusterTarget) hold at most a few workers at once
  (:class:`..targets.limits.TargetSlots`): a target that names thousands of objects as our
  copies and answers nothing cannot stall every other tenant's copies.

The controller that owns the originals decides whether one is to be copied now, and calls
:meth:`TargetCopies.reconcile`; events of copies in targets enqueue their original there.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

from multicluster import (
    AlreadyExists,
    ApiError,
    Cluster,
    Conflict,
    Informer,
    Invalid,
    NotFound,
    Registration,
    Request,
    Resource,
    Result,
    Unreachable,
    WorkQueue,
    is_deleting,
)
from multicluster.events import EventRecorder
from multicluster.informer import ADDED, DELETED, MODIFIED, strip_managed_fields
from multicluster.ratelimit import RepeatBackoff

from ..api import keys
from ..api.copies import finalizer_patch
from ..api.parents import is_copy_of, is_ours
from ..targets.limits import TargetSlots
from ..targets.registry import TargetConnection, TargetRegistry

log = logging.getLogger(__name__)
TARGET_TIMEOUT = 10.0  # one target's share of a reconcile
REMOVAL_TIMEOUT = 10.0  # deleting copies from a Target being deleted
REMOVAL_CONCURRENCY = 8  # ... that many at once (a target may claim thousands are ours)
RECHECK = 10.0  # a target that cannot be read now
RETRY_CONFLICT = 60.0  # an object of the same name, not ours, may be deleted by its owner
LOOK_AGAIN = 1.0
RESYNC_PERIOD = 300.0  # every copy in a target is looked at again (from the caches)
RECREATE_BACKOFF = 1.0  # a copy deleted there again: made again after 1, 2, 4... s
RECREATE_MAX = 300.0  # ... at most; each that long without a deletion takes one off the count


class CopyRules(Protocol):
    """The pure rules of one kind of copies: a module of the vocabulary (``..api.services``,
    ``..api.ingresses``)."""

    @property
    def MARKS(self) -> Mapping[str, str]:
        """Annotations the original carries, with the finalizer, while it is copied."""

    def desired_copy(self, original: dict, cluster_name: str) -> dict:
        """The copy to keep in a target."""

    def copy_differs(self, desired: dict, existing: dict) -> bool:
        """Whether the copy in a target is out of date."""

    def copy_update(self, desired: dict, existing: dict) -> dict:
        """The body of the copy's update."""

    def must_recreate(self, desired: dict, existing: dict) -> bool:
        """What cannot change in place."""


class CopyKind(NamedTuple):
    """One kind of copies: the resource and its rules."""

    resource: Resource
    rules: CopyRules


class Copy(enum.Enum):
    """What one target holds of one original, after a reconcile did its part there."""

    CURRENT = "current"  # an up-to-date copy (possibly just written)
    ABSENT = "absent"  # no copy of ours (possibly just deleted)
    PENDING = "pending"  # a copy is going away or changed meanwhile: look again soon
    UNKNOWN = "unknown"  # the target cannot be read or reached now
    BUSY = "busy"  # requests of the target's owner hold their share of the workers: back off
    CONFLICT = "conflict"  # an object of that name there is not ours
    DELAYED = "delayed"  # deleted there again and again: made again later
    FAILED = "failed"  # the target answered with an error


class TargetCopies:
    """Copies of one kind of object of ``local`` in every target of ``registry``.

    ``originals`` caches the objects copied; ``to_copy`` says whether a cached one is to be
    copied now (resyncs enqueue those, and those whose copies exist). Requests go to ``queue``,
    whose reconciler calls :meth:`reconcile`.
    """

    def __init__(
        self,
        kind: CopyKind,
        local: Cluster,
        registry: TargetRegistry,
        queue: WorkQueue[Request],
        *,
        cluster_name: str,
        originals: Informer,
        to_copy: Callable[[dict], bool],
        events: EventRecorder,
        slots: TargetSlots | None = None,
    ) -> None:
        self.kind = kind
        self.noun = kind.resource.kind.lower()  # in logs and messages: "service", "ingress"
        self.slots = slots or TargetSlots()
        self.local = local
        self.registry = registry
        self.queue = queue
        self.cluster_name = cluster_name
        self.originals = originals
        self.to_copy = to_copy
        self.events = events
        self.informers: dict[str, Informer] = {}  # copies in each target, by virtual node name
        self._handlers: dict[str, list[Registration]] = {}
        self._ready: dict[str, bool] = {}
        # Warnings said, until the situation changes: (ns, name) → node → reason.
        self._warned: dict[tuple[str, str], dict[str, str]] = {}
        # Copies deleted by someone else, by (node, namespace, name): made again later and later
        # if that keeps happening; and the uid of each copy this controller deleted itself.
        self._recreations: RepeatBackoff[tuple[str, str, str]] = RepeatBackoff(
            RECREATE_BACKOFF, RECREATE_MAX
        )
        self._deleting: dict[tuple[str, str, str], str] = {}
        # Copies changed by someone else → the resourceVersion of their original then: written
        # back later and later while the original stays as it was.
        self._changed_there: dict[tuple[str, str, str], str] = {}
        registry.on_connected(self._connected)
        registry.on_disconnected(self._disconnected)
        registry.on_changed(self._changed)
        registry.on_removed(self._removed)

    def request(self, namespace: str, name: str) -> Request:
        return Request(self.local.name, namespace, name)

    def namespace_changed(
        self, event: str, namespace: dict, _old: dict | None, initial: bool
    ) -> None:
        """A handler of the enabled namespaces: one that opts in or out has its originals
        looked at again."""
        if initial or event not in (ADDED, DELETED):
            return
        name = namespace["metadata"]["name"]
        for original in self.originals.list(name):
            self.queue.add(self.request(name, original["metadata"]["name"]))

    def _targets(self, namespace: str) -> list[TargetConnection]:
        """Connected targets that may hold copies of objects of ``namespace``."""
        return [
            c
            for c in self.registry.connections.values()
            if c.cluster is not None and c.cluster is not self.local and c.allows(namespace)
        ]

    # -- targets come and go ------------------------------------------------------------------

    def _connected(self, connection: TargetConnection) -> None:
        cluster = connection.cluster
        if cluster is None or cluster is self.local:
            return
        node = connection.node_name
        copies = cluster.informer(
            self.kind.resource,
            connection.namespace,
            label_selector=keys.PARENT_UID,
            transform=strip_managed_fields,
        )
        queue = self.queue

        def on_copy(event: str, copy: dict, old: dict | None, initial: bool) -> None:
            meta = copy["metadata"]
            # A namespaced Target's server may claim objects of any namespace: only those of
            # its own are looked at (others are no business of this target).
            if not is_ours(copy, self.cluster_name) or not connection.allows(
                meta.get("namespace") or ""
            ):
                return
            if event == DELETED:
                delay = self._deleted(node, copy)
            elif event == MODIFIED and old is not None and old is not copy:
                delay = self._changed_in_target(node, copy, old)
            else:
                delay = 0.0
            request = self.request(meta["namespace"], meta["name"])
            # One failing is retried with backoff already: a target that keeps changing
            # it must not make it retry at the rate of its events.
            if queue.failures(request):
                return
            if delay:
                queue.add_after(request, delay)
            else:
                queue.add(request, low_priority=initial)

        self.informers[node] = copies
        # Every copy looked at again every RESYNC_PERIOD; every original that has, or should
        # have, a copy there once the copies are cached, and whenever their informer recovers
        # (a relist or a resumed watch says nothing of copies that did not change, and a
        # reconcile may have given up on them meanwhile). All from the caches.
        self._handlers[node] = [
            copies.add_handler(on_copy, resync_period=RESYNC_PERIOD),
            copies.add_healthy_handler(lambda: self._recovered(connection)),
        ]
        if copies.healthy:  # cached already (another controller's informer): no transition
            self._resync(connection)

    def _deleted(self, node: str, copy: dict) -> float:
        """A copy of ours is gone from a target: the seconds to wait before making it again
        (if it is still wanted: the reconcile decides). Only copies of objects this cluster
        holds are counted: deletions a target makes up cost no memory."""
        meta = copy["metadata"]
        key = (node, meta["namespace"], meta["name"])
        uid = meta.get("uid")
        if uid is not None and self._deleting.get(key) == uid:
            del self._deleting[key]  # this controller deleted it
            return 0.0
        if self.originals.get(meta["name"], meta["namespace"]) is None:
            return 0.0
        return self._recreations.happened(key)

    def _changed_in_target(self, node: str, copy: dict, old: dict) -> float:
        """A copy of ours was changed in a target: the seconds to wait before writing it back,
        when it was what its original wants and is not any more (someone there changed it)."""
        meta = copy["metadata"]
        original = self.originals.get(meta["name"], meta["namespace"])
        if (
            original is None
            or not self.to_copy(original)
            or not self._current(original, old)
            or self._current(original, copy)
        ):
            return 0.0
        key = (node, meta["namespace"], meta["name"])
        self._changed_there[key] = original["metadata"].get("resourceVersion") or ""
        return self._recreations.happened(key)

    def _recovered(self, connection: TargetConnection) -> None:
        if self.informers.get(connection.node_name) is not None:
            log.info(
                "%s copies cached, looking at them again target=%s",
                self.noun,
                connection.node_name,
            )
            self._resync(connection)

    def _resync_copies(self, copies: Informer | None, connection: TargetConnection) -> None:
        """Reconcile the original of every copy of ours in a target's cache (gone or not)."""
        for copy in copies.list() if copies is not None else ():
            meta = copy["metadata"]
            if is_ours(copy, self.cluster_name) and connection.allows(meta.get("namespace") or ""):
                self.queue.add(self.request(meta["namespace"], meta["name"]), low_priority=True)

    def _resync(self, connection: TargetConnection) -> None:
        """Reconcile every original that has, or should have, a copy in this target."""
        self._resync_copies(self.informers.get(connection.node_name), connection)
        for original in self.originals.list():
            meta = original["metadata"]
            if connection.allows(meta["namespace"]) and self.to_copy(original):
                self.queue.add(self.request(meta["namespace"], meta["name"]), low_priority=True)

    def _changed(self, connection: TargetConnection) -> None:
        """A target that becomes ready again may hold copies whose original went away."""
        node = connection.node_name
        was_ready = self._ready.get(node, False)
        self._ready[node] = connection.ready
        if connection.ready and not was_ready and node in self.informers:
            self._resync(connection)

    def _disconnected(self, connection: TargetConnection) -> None:
        node = connection.node_name
        for registration in self._handlers.pop(node, ()):
            registration.remove()
        self.informers.pop(node, None)
        self._ready.pop(node, None)
        self._deleting = {k: uid for k, uid in self._deleting.items() if k[0] != node}
        self._changed_there = {k: v for k, v in self._changed_there.items() if k[0] != node}
        self._recreations.discard_if(lambda key: key[0] == node)
        for key in list(self._warned):
            self._forget_warning(key[0], key[1], node)

    async def _removed(self, connection: TargetConnection) -> None:
        """A Target is deleted: our copies there go too, if it can be reached."""
        copies = self.informers.get(connection.node_name)
        if copies is None or connection.cluster is None:
            return
        ours = [c for c in copies.list() if is_ours(c, self.cluster_name)]
        if not ours:
            return
        at_once = asyncio.Semaphore(REMOVAL_CONCURRENCY)

        async def delete(copy: dict) -> Copy:
            async with at_once:
                return await self._delete(connection, copy)

        try:
            async with asyncio.timeout(REMOVAL_TIMEOUT):
                results = await asyncio.gather(*(delete(c) for c in ours), return_exceptions=True)
        except TimeoutError:
            results = [TimeoutError("timed out")]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            log.warning(
                "%s copies not all deleted with their target target=%s error=%s",
                self.noun,
                connection.node_name,
                errors[0],
            )

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(
        self, namespace: str, name: str, obj: dict | None, wanted: bool
    ) -> Result | None:
        """Make every target's copy of ``namespace/name`` match ``obj``, the object of this
        cluster (None: gone), if it is ``wanted`` (to be copied now, and not being deleted);
        otherwise delete the copies, then release ``obj``. Raises Conflict when ``obj`` changed
        since it was cached (its event brings it back)."""
        original = None  # the object to copy, if it is to be copied
        if obj is not None and wanted and not is_deleting(obj):
            patch = finalizer_patch(obj, present=True, marks=self.kind.rules.MARKS)
            original = await self.patch(obj, patch)
            if original is None:
                return None  # deleted meanwhile: its event brings it back
        targets = self._targets(namespace)
        outcomes = await asyncio.gather(
            *(self._sync(c, namespace, name, original) for c in targets)
        )
        if Copy.FAILED in outcomes or Copy.BUSY in outcomes:
            return Result(requeue=True)  # backs off; each failure is logged already
        delays = []
        if Copy.PENDING in outcomes:
            delays.append(LOOK_AGAIN)
        if Copy.UNKNOWN in outcomes:
            delays.append(RECHECK)
        if Copy.CONFLICT in outcomes:
            delays.append(RETRY_CONFLICT)
        delays.extend(
            max(LOOK_AGAIN / 10, self._recreations.wait((c.node_name, namespace, name)))
            for c, outcome in zip(targets, outcomes, strict=True)
            if outcome is Copy.DELAYED
        )
        if original is None:
            self._warned.pop((namespace, name), None)  # nothing to copy: nothing to warn about
        if original is None and obj is not None and Copy.PENDING not in outcomes:
            # Copies in targets not reachable now are deleted when they are seen again.
            await self.patch(obj, finalizer_patch(obj, present=False, marks=self.kind.rules.MARKS))
        return Result(requeue_after=min(delays)) if delays else None

    async def patch(self, obj: dict, patch: dict | None) -> dict | None:
        """Apply a merge patch to an object of this cluster; the object as it is now, None if
        gone."""
        if patch is None:
            return obj
        meta = obj["metadata"]
        try:
            updated = await self.local.client.patch(
                self.kind.resource, meta["name"], patch, meta["namespace"]
            )
        except NotFound:
            return None
        return strip_managed_fields(updated)

    # -- one target ---------------------------------------------------------------------------

    async def _sync(
        self, connection: TargetConnection, namespace: str, name: str, original: dict | None
    ) -> Copy:
        """Make ``connection``'s copy of ``namespace/name`` match ``original`` (None: no copy
        is wanted there)."""
        copies = self.informers.get(connection.node_name)
        copy = copies.get(name, namespace) if copies is not None else None
        ours = copy is not None and is_copy_of(copy, namespace, name, self.cluster_name)
        if copies is None or not copies.has_synced or copies.last_error is not None:
            return Copy.UNKNOWN if original is not None or ours else Copy.ABSENT
        if original is None and not ours:
            return Copy.ABSENT
        if original is not None and copy is not None:
            if not ours:
                return self._conflict(original, connection)
            if self._current(original, copy):
                return self._resolved(connection, namespace, name)
        key = (connection.node_name, namespace, name)
        if original is not None and self._recreations.wait(key):
            version = original["metadata"].get("resourceVersion") or ""
            if copy is None or self._changed_there.get(key) == version:
                return Copy.DELAYED  # deleted or changed there again and again
        with self.slots.slot(connection.name, connection.namespace) as free:
            if not free:
                return Copy.BUSY
            return await self._request_target(connection, namespace, name, original, copy)

    def _current(self, original: dict, copy: dict) -> bool:
        """Whether ``copy`` is what ``original`` wants (nothing to ask its target)."""
        if is_deleting(copy):
            return False
        desired = self.kind.rules.desired_copy(original, self.cluster_name)
        return not self.kind.rules.must_recreate(
            desired, copy
        ) and not self.kind.rules.copy_differs(desired, copy)

    async def _request_target(
        self,
        connection: TargetConnection,
        namespace: str,
        name: str,
        original: dict | None,
        copy: dict | None,
    ) -> Copy:
        """Write or delete (``original`` None) the copy in ``connection``'s target."""
        noun = self.noun
        try:
            async with asyncio.timeout(TARGET_TIMEOUT):
                if original is None:
                    assert copy is not None
                    return await self._delete(connection, copy)
                return await self._write(connection, original, copy)
        except Conflict:
            return Copy.PENDING  # changed meanwhile: its event is on the way
        except (Unreachable, TimeoutError) as e:
            log.info(
                "target not reachable for %s copy namespace=%s name=%s target=%s error=%s",
                noun,
                namespace,
                name,
                connection.node_name,
                str(e) or "timed out",
            )
            return Copy.UNKNOWN
        except ApiError as e:
            log.warning(
                "%s copy failed namespace=%s name=%s target=%s error=%s",
                noun,
                namespace,
                name,
                connection.node_name,
                e,
            )
            if original is not None:
                self._warn(
                    original,
                    connection,
                    "CopyFailed",
                    f"the copy of this {noun} in target {connection.name} could not be "
                    f"written: {e.message}",
                )
            return Copy.FAILED

    async def _write(self, connection: TargetConnection, original: dict, copy: dict | None) -> Copy:
        client = connection.client
        resource = self.kind.resource
        meta = original["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        desired = self.kind.rules.desired_copy(original, self.cluster_name)
        if copy is None:
            # Not cached: a deletion of ours was seen already, or never made.
            self._deleting.pop((connection.node_name, namespace, name), None)
            try:
                await client.create(resource, desired, namespace)
            except AlreadyExists:
                # Not in our cache: not a copy, or one the cache has not seen yet.
                copy = await client.get(resource, name, namespace)
                if not is_copy_of(copy, namespace, name, self.cluster_name):
                    return self._conflict(original, connection)
            else:
                self._log_copy("created", connection, namespace, name)
                return self._resolved(connection, namespace, name)
        if is_deleting(copy):
            return Copy.PENDING
        if self.kind.rules.must_recreate(desired, copy):
            await self._delete(connection, copy)
            return Copy.PENDING  # created again once it is gone
        if not self.kind.rules.copy_differs(desired, copy):
            return self._resolved(connection, namespace, name)
        try:
            await client.update(resource, self.kind.rules.copy_update(desired, copy))
        except Invalid as e:
            log.info(
                "%s copy replaced namespace=%s name=%s target=%s reason=%r",
                self.noun,
                namespace,
                name,
                connection.node_name,
                e.message,
            )
            await self._delete(connection, copy)
            return Copy.PENDING
        self._log_copy("updated", connection, namespace, name)
        return self._resolved(connection, namespace, name)

    async def _delete(self, connection: TargetConnection, copy: dict) -> Copy:
        """Delete a copy of ours. Once its deletion is accepted, it counts as gone: the target
        finishes it (a load balancer's finalizer, say), and a finalizer that someone there added
        holds nothing of ours (it kept the original Terminating before)."""
        meta = copy["metadata"]
        if is_deleting(copy):
            return Copy.ABSENT
        key = (connection.node_name, meta["namespace"], meta["name"])
        if meta.get("uid"):
            self._deleting[key] = meta["uid"]  # its deletion event is ours, not someone else's
        try:
            await connection.client.delete(
                self.kind.resource,
                meta["name"],
                meta["namespace"],
                preconditions={"uid": meta["uid"]} if meta.get("uid") else None,
                missing_ok=True,
            )
        except Conflict:
            # Its uid is not that copy's any more: the copy is gone (what has the name now is
            # not ours). Waiting for it would let a target keep the original Terminating.
            self._deleting.pop(key, None)
            return Copy.ABSENT
        except BaseException:
            self._deleting.pop(key, None)
            raise
        self._log_copy("deleted", connection, meta["namespace"], meta["name"])
        self._forget_warning(meta["namespace"], meta["name"], connection.node_name)
        return Copy.ABSENT

    # -- telling users ------------------------------------------------------------------------

    def _log_copy(
        self, action: str, connection: TargetConnection, namespace: str, name: str
    ) -> None:
        log.info(
            "%s copy %s namespace=%s name=%s target=%s",
            self.noun,
            action,
            namespace,
            name,
            connection.node_name,
        )

    def _resolved(self, connection: TargetConnection, namespace: str, name: str) -> Copy:
        self._changed_there.pop((connection.node_name, namespace, name), None)
        self._forget_warning(namespace, name, connection.node_name)
        return Copy.CURRENT

    def _forget_warning(self, namespace: str, name: str, node: str) -> None:
        warned = self._warned.get((namespace, name))
        if warned is not None:
            warned.pop(node, None)
            if not warned:
                del self._warned[(namespace, name)]

    def _conflict(self, original: dict, connection: TargetConnection) -> Copy:
        meta = original["metadata"]
        self._warn(
            original,
            connection,
            "CopyConflict",
            f"{self.kind.resource.kind} {meta['namespace']}/{meta['name']} exists in target "
            f"{connection.name} and is not a copy made by this cluster: it is left as it is, "
            f"and this {self.noun} is not replicated there",
        )
        return Copy.CONFLICT

    def _warn(
        self, original: dict, connection: TargetConnection, reason: str, message: str
    ) -> None:
        """A Warning event on the original, once until the situation changes."""
        meta = original["metadata"]
        warned = self._warned.setdefault((meta["namespace"], meta["name"]), {})
        if warned.get(connection.node_name) == reason:
            return
        warned[connection.node_name] = reason
        log.warning(
            "%s not replicated namespace=%s name=%s target=%s reason=%s",
            self.noun,
            meta["namespace"],
            meta["name"],
            connection.node_name,
            reason,
        )
        resource = self.kind.resource
        # A cached original as events need it (lists omit kind).
        reference = {
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": original["metadata"],
        }
        self.events.emit(reference, "Warning", reason, message)

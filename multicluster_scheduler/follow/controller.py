"""The follow controller (source side, leader only): config maps and secrets go where delegates
use them.

For each config map and secret of this cluster, one reconcile decides, target by target, whether
a copy must exist there: yes while a delegate of this cluster in that target uses it (its
volumes, ``env``, ``envFrom`` or image pull secrets), no otherwise. Copies are created, kept
equal to their source and deleted when no longer used; a copy someone deletes in a target is
made again from the deletion's watch event, at once the first time and later and later if that
keeps happening (a target cannot keep us writing it); so is a copy someone changes there while
its source stays as it was (a change of the source is written at once); the source object
carries our finalizer while it has copies, so that deleting it deletes them first. Nothing is
copied to self targets (the object is there already). An object of the same name in a target
that is not our copy is never overwritten: a Warning event on the source says so.

The scheduler calls :meth:`Follow.prepare` before it creates a delegate: it asks the follow
controllers, the only writers of copies, for those the delegate will use (a request for that
one target, which no other target holds up) and waits for them a while, so that a delegate
normally finds its config maps and secrets in place when it starts; the reconciles triggered
by delegates, copies and sources then keep everything in step. Targets are handled
concurrently, each within ``TARGET_TIMEOUT``: a slow or unreachable target never holds up
another. A copy is not deleted for want of users while its target's delegates are not all
cached, nor in the ``GRACE`` seconds after it was written (its delegate may be on its way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from multicluster import (
    AlreadyExists,
    ApiError,
    Cluster,
    Controller,
    Informer,
    Invalid,
    NotFound,
    Registration,
    Request,
    Result,
)
from multicluster.events import EventRecorder
from multicluster.gc import add_finalizer, has_finalizer, is_deleting, remove_finalizer
from multicluster.informer import DELETED, MODIFIED
from multicluster.kubetime import parse_time
from multicluster.ratelimit import RepeatBackoff
from multicluster.resources import CONFIGMAPS, SECRETS, Resource

from ..api import keys
from ..api.follow import (
    CONFIG_MAP,
    KINDS,
    SECRET,
    desired_copy,
    is_copy_of,
    is_followed,
    reference_key,
    references,
    slim_followed,
)
from ..api.parents import is_ours
from ..api.proxy import parent_cluster, parent_uid
from ..targets.delegates import DelegateLookup
from ..targets.limits import TargetSlots
from ..targets.registry import TargetConnection

log = logging.getLogger(__name__)
GRACE = 30.0
TARGET_TIMEOUT = 10.0
PREPARE_TIMEOUT = 5.0
REMOVAL_CONCURRENCY = 8  # copies deleted at once from a removed target (it may claim thousands)
NOT_CACHED_RETRY = 2.0
FOREIGN_RETRY = 60.0  # someone else's object of the same name: looked at again after this
RESYNC_EVERY = 300.0
# A copy deleted (or changed) in its target by someone else is made again at once, from the
# watch event; deleted or changed again and again, it is made again after 1, 2, 4... s, at most
# RESYNC_EVERY (each RESYNC_EVERY without one takes one off the count: RepeatBackoff).
RECREATE_BACKOFF = 1.0
RESOURCES: dict[str, Resource] = {CONFIG_MAP: CONFIGMAPS, SECRET: SECRETS}

Key = tuple[str, str, str]  # (virtual node, namespace, name)
CopyAction = Literal["write", "delete"]


def _age(obj: dict) -> float:
    then = parse_time(obj["metadata"].get("creationTimestamp"))
    if then is None:
        return GRACE
    return time.time() - then.timestamp()


@dataclass
class _Plan:
    """One reconcile of a source object: what it read (the source, None once gone; the time),
    and what it decided target by target: the copies to write or delete, how many copies of
    ours stay as they are, and when to look again (None: no need)."""

    namespace: str
    name: str
    source: dict | None
    now: float
    actions: list[tuple[TargetConnection, CopyAction, dict | None]] = field(default_factory=list)
    remaining: int = 0
    requeue: float | None = None
    # How each action ended, by virtual node: True (a copy stays), False (none), a message
    # (failed), None (the target's owner had no slot free: tried again later).
    outcomes: dict[str, bool | str | None] = field(default_factory=dict)

    @property
    def gone(self) -> bool:
        return self.source is None or is_deleting(self.source)

    def key(self, connection: TargetConnection) -> Key:
        return (connection.node_name, self.namespace, self.name)

    def keep(self, *, look_again: float | None = None) -> None:
        """A copy of ours stays for now (looked at again within ``look_again`` seconds)."""
        self.remaining += 1
        if look_again is not None:
            self.later(look_again)

    def later(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)


class Follower:
    """Copies of one kind (ConfigMap or Secret)."""

    def __init__(
        self,
        kind: str,
        local: Cluster,
        lookup: DelegateLookup,
        *,
        events: EventRecorder,
        workers: int,
    ) -> None:
        self.kind = kind
        self.resource = RESOURCES[kind]
        self.local = local
        self.lookup = lookup
        self.registry = lookup.registry
        self.cluster_name = lookup.cluster_name
        self.events = events
        self.controller = Controller(f"follow-{self.resource.plural}", self, workers=workers)
        self.slots = TargetSlots()
        self.sources = self.controller.watch(
            local, self.resource, transform=slim_followed, predicates=[self._relevant]
        )
        self.copies: dict[str, Informer] = {}  # by virtual node name
        self._delegates: dict[str, Informer] = {}  # by virtual node name
        self._handlers: dict[str, list[Registration]] = {}
        self._locks: dict[Key, tuple[asyncio.Lock, int]] = {}
        # Copies asked for by delegates about to be created: key → (when asked, answer).
        self._wanted: dict[Key, list[tuple[float, asyncio.Future]]] = {}
        self._written: dict[Key, tuple[str, float]] = {}  # → (hash, monotonic time)
        self._foreign: dict[Key, float] = {}  # → monotonic time until which it is skipped
        # Copies deleted or changed by someone else, made again later and later if that keeps
        # happening.
        self._recreations: RepeatBackoff[Key] = RepeatBackoff(RECREATE_BACKOFF, RESYNC_EVERY)
        self._deleting: dict[Key, str] = {}  # → uid of the copy this controller deleted

    # -- wiring -------------------------------------------------------------------------------

    def _request(self, namespace: str, name: str) -> Request:
        return Request(self.local.name, namespace, name)

    def _uses(self, connection: TargetConnection, namespace: str, name: str) -> bool:
        """Whether a delegate placed in ``connection`` uses ``namespace/name``, by its own spec
        and by its proxy pod's (a pod that only claims to be a delegate gets nothing)."""
        ref = reference_key(self.kind, namespace, name)
        return any(
            self.lookup.uses(pod, connection, ref)
            for pod in connection.delegates_using(ref, self.cluster_name)
        )

    def _relevant(self, _event: str, obj: dict, _old: dict | None) -> bool:
        """Only objects that have copies or users in a target are reconciled."""
        meta = obj["metadata"]
        if has_finalizer(obj, keys.FINALIZER):
            return True
        namespace = meta.get("namespace") or ""
        return any(self._uses(c, namespace, meta["name"]) for c in self._targets(namespace))

    def _targets(self, namespace: str) -> list[TargetConnection]:
        """Connected targets that may hold copies of objects in ``namespace``."""
        return [
            c
            for c in self.registry.connections.values()
            if c.cluster is not None and c.cluster is not self.local and c.allows(namespace)
        ]

    def connected(self, connection: TargetConnection) -> None:
        cluster = connection.cluster
        if cluster is None or cluster is self.local or connection.delegates is None:
            return
        node = connection.node_name
        queue = self.controller.queue
        prefix = self.kind + ":"

        def on_delegate(event: str, delegate: dict, _old: dict | None, initial: bool) -> None:
            if event == MODIFIED:  # a pod's volumes and env never change
                return
            if parent_cluster(delegate) != self.cluster_name:
                return
            for ref in delegate.get("references") or ():
                if ref.startswith(prefix):
                    namespace, _, name = ref[len(prefix) :].partition("/")
                    queue.add(self._request(namespace, name), low_priority=initial)

        copies = cluster.informer(
            self.resource,
            connection.namespace,
            label_selector=keys.PARENT_UID,
            transform=slim_followed,
        )

        def on_copy(event: str, copy: dict, old: dict | None, initial: bool) -> None:
            meta = copy["metadata"]
            if event == DELETED:
                self._written.pop((node, meta["namespace"], meta["name"]), None)
            if not is_ours(copy, self.cluster_name) or not connection.allows(
                meta.get("namespace") or ""
            ):
                return
            if event == DELETED:
                delay = self._deleted(node, copy)
            elif event == MODIFIED and old is not None and old["hash"] != copy["hash"]:
                delay = self._changed(node, copy)
            else:
                delay = 0.0
            request = self._request(meta["namespace"], meta["name"])
            if queue.failures(request):
                return  # retried with backoff already
            if delay:
                queue.add_after(request, delay)
            else:
                queue.add(request, low_priority=initial)

        def recovered() -> None:
            # What changed while its caches could not tell (delegates gone, say) was skipped.
            delegates = self._delegates.get(node)
            if copies.healthy and (delegates is None or delegates.healthy):
                log.info(
                    "copies looked at again kind=%s target=%s: caches healthy", self.kind, node
                )
                self._resync_copies(node, copies)

        self.copies[node] = copies
        self._delegates[node] = connection.delegates
        # Every copy of ours is looked at again every RESYNC_EVERY (a watch that resumed after
        # an outage sends no event for copies whose source went meanwhile), and all of them
        # whenever these caches recover.
        self._handlers[node] = [
            connection.delegates.add_handler(on_delegate),
            copies.add_handler(on_copy, resync_period=RESYNC_EVERY),
            copies.add_healthy_handler(recovered),
            connection.delegates.add_healthy_handler(recovered),
        ]

    def _deleted(self, node: str, copy: dict) -> float:
        """A copy of ours is gone from a target: the seconds to wait before making it again (if
        it is still used: the reconcile decides). Only copies of objects this cluster holds are
        counted: deletions a target makes up cost no memory."""
        meta = copy["metadata"]
        key = (node, meta["namespace"], meta["name"])
        uid = meta.get("uid")
        if uid is not None and self._deleting.get(key) == uid:
            del self._deleting[key]  # deleted by this controller
            return 0.0
        if self.sources.get(meta["name"], meta["namespace"]) is None:
            return 0.0
        return self._recreations.happened(key)

    def _changed(self, node: str, copy: dict) -> float:
        """A copy of ours was changed in a target: the seconds to wait before writing it back,
        when someone there changed it while its source stayed as this controller last wrote it
        (0 for a change of ours, or when the source changed too)."""
        meta = copy["metadata"]
        key = (node, meta["namespace"], meta["name"])
        if copy["hash"] == (self._written.get(key) or ("",))[0] or not self._restores(key):
            return 0.0
        return self._recreations.happened(key)

    def _restores(self, key: Key) -> bool:
        """Whether writing the copy of ``key`` now would write what was written last: the
        source is as it was then (someone in the target changed or deleted the copy)."""
        written = self._written.get(key)
        source = self.sources.get(key[2], key[1])
        return written is not None and source is not None and source["hash"] == written[0]

    def disconnected(self, connection: TargetConnection) -> None:
        node = connection.node_name
        for registration in self._handlers.pop(node, ()):
            registration.remove()
        self.copies.pop(node, None)
        self._delegates.pop(node, None)
        for memo in (self._written, self._foreign, self._deleting):
            for key in [k for k in memo if k[0] == node]:
                del memo[key]
        self._recreations.discard_if(lambda key: key[0] == node)

    def _resync_copies(self, node: str, copies: Informer) -> None:
        connection = self.registry.by_node(node)
        if connection is None:
            return
        for copy in copies.list():
            meta = copy["metadata"]
            if is_ours(copy, self.cluster_name) and connection.allows(meta.get("namespace") or ""):
                self.controller.queue.add(
                    self._request(meta["namespace"], meta["name"]), low_priority=True
                )

    async def removed(self, connection: TargetConnection) -> None:
        """A Target is deleted: our copies there go too (if it can be reached soon)."""
        copies = self.copies.get(connection.node_name)
        if copies is None or connection.cluster is None:
            return
        ours = [
            c
            for c in copies.list()
            if is_ours(c, self.cluster_name) and not self._used_elsewhere(connection, c)
        ]
        if not ours:
            return
        at_once = asyncio.Semaphore(REMOVAL_CONCURRENCY)

        async def delete(copy: dict) -> None:
            async with at_once:
                await self._delete_copy(connection, copy)

        try:
            async with asyncio.timeout(TARGET_TIMEOUT):
                await asyncio.gather(*(delete(c) for c in ours))
        except (ApiError, TimeoutError) as e:
            log.warning(
                "copies not all deleted from removed target %s: %s", connection.node_name, e
            )
        for copy in ours:
            meta = copy["metadata"]
            self.controller.queue.add(self._request(meta["namespace"], meta["name"]))

    def _used_elsewhere(self, connection: TargetConnection, copy: dict) -> bool:
        """Whether delegates placed through another Target of the same place use ``copy``."""
        meta = copy["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        return any(
            other is not connection
            and other.same_place(connection, namespace)
            and self._uses(other, namespace, name)
            for other in self._targets(namespace)
        )

    @contextlib.asynccontextmanager
    async def _locked(self, key: Key) -> AsyncIterator[None]:
        """One writer per copy: the reconcile of a whole object and one asked for a single
        target (:meth:`want`) may run at once."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(self, request: Request) -> Result | None:
        namespace, name = request.namespace, request.name
        plan = _Plan(namespace, name, self.sources.get(name, namespace), time.monotonic())
        # A request for one target (its cluster is that target's virtual node) writes the copy
        # a delegate about to be created there wants, held up by no other target; the reconcile
        # of the whole object then settles the finalizer.
        target = None if request.cluster == self.local.name else request.cluster
        try:
            for connection in self._targets(namespace):
                if target is None or connection.node_name == target:
                    self._plan_target(plan, connection)
            busy = await self._carry_out(plan)
            if target is None:
                await self._settle_finalizer(plan)
        finally:
            self._answer_wanted(plan)
        if target is not None:
            self.controller.queue.add(self._request(namespace, name))
            return Result(requeue=True) if busy else None
        if busy:
            return Result(requeue=True)  # with backoff, holding no worker meanwhile
        if plan.requeue is None and plan.remaining:
            plan.requeue = RESYNC_EVERY
        return Result(requeue_after=plan.requeue) if plan.requeue else None

    def _plan_target(self, plan: _Plan, connection: TargetConnection) -> None:
        """What to do with the copy in ``connection``'s cluster: nothing while its copies, or
        the delegates that use them, are not known."""
        copies = self.copies.get(connection.node_name)
        if copies is None or not copies.has_synced or copies.last_error is not None:
            return  # not known now; its copies are looked at again when it is
        copy = copies.get(plan.name, plan.namespace)
        ours = copy is not None and is_copy_of(copy, plan.namespace, plan.name, self.cluster_name)
        if copy is None and plan.key(connection) in self._written:
            plan.keep(look_again=1.0)  # just written, not cached yet: wait for the cache
        elif not plan.gone and plan.key(connection) in self._wanted:
            if plan.source is not None and is_followed(plan.source):  # else said once it exists
                self._plan_write(plan, connection, copy, ours)  # for a delegate about to be made
        elif not connection.delegates_synced:
            if ours:
                plan.keep(look_again=NOT_CACHED_RETRY)  # who uses it is not known yet
        elif not plan.gone and self._uses(connection, plan.namespace, plan.name):
            self._plan_write(plan, connection, copy, ours)
        elif ours:
            self._plan_delete(plan, connection, copy)

    def _plan_write(
        self, plan: _Plan, connection: TargetConnection, copy: dict | None, ours: bool
    ) -> None:
        """A delegate there uses the source: its copy is written, unless it is up to date or
        may not be (a token secret, someone else's object of that name)."""
        source = plan.source
        assert source is not None
        key = plan.key(connection)
        if not is_followed(source):
            self._warn(key, source, connection, "NotCopied")
        elif ours and copy is not None and copy["hash"] == source["hash"]:
            plan.keep()
        elif copy is not None and not ours:
            self._warn(key, source, connection, "CopyConflict")
        elif self._foreign.get(key, 0.0) > plan.now:
            plan.later(self._foreign[key] - plan.now + 0.1)
        elif (copy is None or self._restores(key)) and (wait := self._recreations.wait(key)):
            plan.keep(look_again=wait)  # deleted or changed there again and again: later
        else:
            plan.actions.append((connection, "write", copy))

    def _plan_delete(self, plan: _Plan, connection: TargetConnection, copy: dict | None) -> None:
        """No delegate there uses our copy: it is deleted, unless it is young (written, or
        created, less than ``GRACE`` ago: its delegate may be on its way)."""
        written = self._written.get(plan.key(connection))
        young = written is not None and plan.now - written[1] < GRACE
        if not plan.gone and (young or (copy is not None and _age(copy) < GRACE)):
            plan.keep(look_again=GRACE / 2)
        else:
            plan.actions.append((connection, "delete", copy))

    async def _carry_out(self, plan: _Plan) -> int:
        """Write and delete the copies planned; how many targets had no slot free. Raises with
        the message of every one that failed."""
        full: dict | None = None
        if any(action == "write" for _, action, _ in plan.actions):
            full = await self._source_with_finalizer(plan.namespace, plan.name)
            if full is None or is_deleting(full):
                plan.actions = [p for p in plan.actions if p[1] != "write"]
        results = await asyncio.gather(
            *(self._act(c, action, copy, full, plan.now) for c, action, copy in plan.actions)
        )
        plan.outcomes = {c.node_name: r for (c, _, _), r in zip(plan.actions, results, strict=True)}
        failures = [f for f in results if isinstance(f, str)]
        busy = sum(1 for r in results if r is None)
        plan.remaining += busy + sum(1 for r in results if r is True)
        if failures:
            raise RuntimeError(f"{self.kind} {plan.namespace}/{plan.name}: " + "; ".join(failures))
        return busy

    async def _settle_finalizer(self, plan: _Plan) -> None:
        """Our finalizer on the source while copies of ours remain, and off once none does."""
        source, namespace, name = plan.source, plan.namespace, plan.name
        if source is None:
            return
        if has_finalizer(source, keys.FINALIZER) and plan.remaining == 0:
            # Unless a copy was written meanwhile (for a delegate on its way).
            if not any(
                (w := self._written.get((c.node_name, namespace, name))) and w[1] >= plan.now
                for c in self._targets(namespace)
            ):
                await self._remove_finalizer(namespace, name)
        elif not plan.gone and plan.remaining and not has_finalizer(source, keys.FINALIZER):
            await self._source_with_finalizer(namespace, name)  # copies exist: hold the source

    async def _act(
        self,
        connection: TargetConnection,
        action: CopyAction,
        copy: dict | None,
        source: dict | None,
        planned: float,
    ) -> bool | str | None:
        """Write or delete one copy within ``TARGET_TIMEOUT``: True if a copy of ours remains
        there, False if not, a message if it failed, None if the target's owner has no slot
        free (:class:`..targets.limits.TargetSlots`)."""
        acted_on = source if action == "write" else copy  # what the action reads
        assert acted_on is not None
        meta = acted_on["metadata"]
        key = (connection.node_name, meta["namespace"], meta["name"])
        with self.slots.slot(connection.name, connection.namespace) as free:
            if not free:
                return None
            try:
                async with asyncio.timeout(TARGET_TIMEOUT), self._locked(key):
                    written = self._written.get(key)
                    if written is not None and written[1] >= planned:
                        # Written since this reconcile looked (for a delegate on its way): a
                        # change of the source since then has a reconcile of its own.
                        return True
                    if action == "write":
                        return await self._write(connection, acted_on, copy)
                    await self._delete_copy(connection, acted_on)
                    return False
            except (ApiError, TimeoutError) as e:
                return f"{connection.name}: {str(e) or 'timed out'}"

    async def _source_with_finalizer(self, namespace: str, name: str) -> dict | None:
        """The source object, read in full, with our finalizer on it before any copy exists."""
        try:
            source = await self.local.client.get(self.resource, name, namespace)
        except NotFound:
            return None
        if is_deleting(source) or has_finalizer(source, keys.FINALIZER):
            return source
        return await add_finalizer(
            self.local.client, self.resource, source, keys.FINALIZER, label=keys.HAS_FINALIZER
        )

    async def _remove_finalizer(self, namespace: str, name: str) -> None:
        try:
            source = await self.local.client.get(self.resource, name, namespace)
        except NotFound:
            return
        if has_finalizer(source, keys.FINALIZER):
            await remove_finalizer(
                self.local.client, self.resource, source, keys.FINALIZER, label=keys.HAS_FINALIZER
            )

    async def _write(self, connection: TargetConnection, source: dict, copy: dict | None) -> bool:
        """Create or update the copy in ``connection``'s cluster; False if not ours to write."""
        meta = source["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        key = (connection.node_name, namespace, name)
        body = desired_copy({**source, "kind": self.kind}, self.cluster_name)
        written_hash = slim_followed(body)["hash"]
        client = connection.client
        if copy is None:
            self._deleting.pop(key, None)  # not cached: a deletion of ours was seen, or never made
            try:
                await client.create(self.resource, body, namespace)
                action = "created"
            except AlreadyExists:
                existing = await client.get(self.resource, name, namespace)
                if not is_copy_of(existing, namespace, name, self.cluster_name):
                    self._foreign[key] = time.monotonic() + FOREIGN_RETRY
                    self._warn(key, source, connection, "CopyConflict")
                    return False
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                await self._replace(connection, body, existing)
                action = "updated"
        else:
            body["metadata"]["resourceVersion"] = copy["metadata"]["resourceVersion"]
            await self._replace(connection, body, copy)
            action = "updated"
        self._foreign.pop(key, None)
        self._written[key] = (written_hash, time.monotonic())
        log.info("copy %s %s %s/%s target=%s", action, self.kind, namespace, name, connection.name)
        return True

    async def _replace(self, connection: TargetConnection, body: dict, copy: dict) -> None:
        client = connection.client
        try:
            await client.update(self.resource, body)
        except Invalid:
            # Only an immutable copy (or a secret whose type changed) is replaced rather than
            # updated; any other refusal is an error to report, not a reason to delete.
            if not (copy.get("immutable") or copy.get("type") != body.get("type")):
                raise
            await self._delete_copy(connection, copy)
            body["metadata"].pop("resourceVersion", None)
            await client.create(self.resource, body, body["metadata"]["namespace"])

    async def _delete_copy(self, connection: TargetConnection, copy: dict) -> None:
        meta = copy["metadata"]
        key = (connection.node_name, meta["namespace"], meta["name"])
        if meta.get("uid"):
            self._deleting[key] = meta["uid"]  # its deletion event is ours, not someone else's
        try:
            await connection.client.delete(
                self.resource,
                meta["name"],
                meta["namespace"],
                preconditions={"uid": meta["uid"]} if meta.get("uid") else None,
                missing_ok=True,
            )
        except BaseException:
            self._deleting.pop(key, None)
            raise
        self._written.pop(key, None)
        log.info(
            "copy deleted %s %s/%s target=%s",
            self.kind,
            meta["namespace"],
            meta["name"],
            connection.name,
        )

    def _warn(self, key: Key, source: dict, connection: TargetConnection, reason: str) -> None:
        """A Warning event on the source (said again, it is counted: see EventRecorder)."""
        meta = source["metadata"]
        if reason == "CopyConflict":
            message = (
                f"{self.kind} {meta['namespace']}/{meta['name']} exists in target "
                f"{connection.name} and is not a copy made by this cluster: left as it is, and "
                f"delegates there use it"
            )
        else:
            message = (
                f"service-account token secrets are not copied (target {connection.name} "
                f"issues its own): delegates there cannot use this one"
            )
        self.events.emit(
            {"apiVersion": "v1", "kind": self.kind, "metadata": meta}, "Warning", reason, message
        )

    # -- before a delegate is created ---------------------------------------------------------

    def want(self, connection: TargetConnection, namespace: str, name: str) -> asyncio.Future:
        """Ask for the copy of ``namespace/name`` in ``connection`` for a delegate about to be
        created there: the next reconcile of that object writes it (whoever uses it), and
        the future is done when a reconcile that began after this call has ended, whatever it
        did (a copy that could not be written is retried once the delegate exists)."""
        future = asyncio.get_running_loop().create_future()
        key = (connection.node_name, namespace, name)
        self._wanted.setdefault(key, []).append((time.monotonic(), future))
        self.controller.queue.add(Request(connection.node_name, namespace, name))
        return future

    def forget_wanted(
        self, connection: TargetConnection, namespace: str, name: str, future: asyncio.Future
    ) -> None:
        """The copy asked for with ``future`` is no longer waited for (the delegate is created,
        or not): from now on, the delegates that use it keep it."""
        key = (connection.node_name, namespace, name)
        future.cancel()
        waiting = [(t, f) for t, f in self._wanted.get(key, ()) if f is not future]
        if waiting:
            self._wanted[key] = waiting
        else:
            self._wanted.pop(key, None)

    def _answer_wanted(self, plan: _Plan) -> None:
        """The copies asked for before ``plan`` began are done with (with the message of a
        failure, if any), but those that waited for a slot: the retry answers them."""
        for connection in self._targets(plan.namespace):
            node = connection.node_name
            outcome = plan.outcomes.get(node)
            if node in plan.outcomes and outcome is None:
                continue  # no slot was free: not done yet
            for asked, future in self._wanted.get(plan.key(connection), ()):
                if asked <= plan.now and not future.done():
                    future.set_result(outcome if isinstance(outcome, str) else None)


class Follow:
    """Config maps and secrets that delegates use, copied to their targets."""

    def __init__(self, local: Cluster, lookup: DelegateLookup, *, workers: int = 8) -> None:
        self.local = local
        self.lookup = lookup
        registry = lookup.registry
        events = EventRecorder(local.client, "admiralty-follow")
        self.followers = {
            kind: Follower(kind, local, lookup, events=events, workers=workers) for kind in KINDS
        }
        registry.on_connected(self._connected)
        registry.on_disconnected(self._disconnected)
        registry.on_removed(self._removed)

    @property
    def controllers(self) -> list[Controller]:
        return [f.controller for f in self.followers.values()]

    def _connected(self, connection: TargetConnection) -> None:
        for follower in self.followers.values():
            follower.connected(connection)

    def _disconnected(self, connection: TargetConnection) -> None:
        for follower in self.followers.values():
            follower.disconnected(connection)

    async def _removed(self, connection: TargetConnection) -> None:
        await asyncio.gather(*(f.removed(connection) for f in self.followers.values()))

    async def prepare(self, connection: TargetConnection, delegate: dict) -> None:
        """Have what ``delegate`` uses copied to its target before it is created there, waiting
        ``PREPARE_TIMEOUT`` at most. Never raises: what fails here is retried by the follow
        controllers once the delegate exists."""
        cluster = connection.cluster
        if cluster is None or cluster is self.local:
            return
        namespace = delegate["metadata"]["namespace"]
        # What the proxy pod's own spec uses (its saved manifest is the word of whoever wrote it).
        proxy = self.lookup.proxy(parent_uid(delegate))
        allowed = (proxy or {}).get("references") or ()
        wanted = [
            (kind, name)
            for kind, names in references(delegate.get("spec") or {}).items()
            for name in names
            if reference_key(kind, namespace, name) in allowed
        ]
        if not wanted:
            return
        # The follow controllers write the copies (they alone write copies); this waits for
        # them, a while.
        asked = [self.followers[k].want(connection, namespace, n) for k, n in wanted]
        try:
            done, late = await asyncio.wait(asked, timeout=PREPARE_TIMEOUT)
        finally:
            for (kind, name), future in zip(wanted, asked, strict=True):
                self.followers[kind].forget_wanted(connection, namespace, name, future)
        failed = [f.result() for f in done if isinstance(f.result(), str)]
        if late:
            failed.append(f"not done within {PREPARE_TIMEOUT:g}s")
        if failed:
            log.warning(
                "copies not all made before delegate %s/%s target=%s: %s",
                namespace,
                delegate["metadata"]["name"],
                connection.name,
                "; ".join(failed),
            )

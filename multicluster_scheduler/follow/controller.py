"""The follow controller (source side, leader only): config maps and secrets go where delegates
use them.

For each config map and secret of this cluster, one reconcile decides, target by target, whether
a copy must exist there: yes while a delegate in that target uses it (its volumes, ``env``,
``envFrom`` or image pull secrets), no otherwise. Copies are created, kept equal to their source
and deleted when no longer used; the source object carries our finalizer while it has copies, so
that deleting it deletes them first. Nothing is copied to self targets (the object is there
already). An object of the same name in a target that is not our copy is never overwritten: a
Warning event on the source says so.

The scheduler calls :meth:`Follow.prepare` before it creates a delegate, so that a delegate
normally finds its config maps and secrets in place when it starts; the reconciles triggered
by delegates, copies and sources then keep everything in step. A copy younger than
``GRACE`` seconds is not deleted for want of users: its delegate may not be cached yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time

from multicluster import (
    AlreadyExists,
    ApiError,
    Cluster,
    Controller,
    Informer,
    Invalid,
    NotFound,
    Request,
    Result,
)
from multicluster.events import EventRecorder
from multicluster.gc import has_finalizer, is_deleting
from multicluster.informer import DELETED, MODIFIED
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
from ..targets.registry import TargetConnection, TargetRegistry

log = logging.getLogger(__name__)
GRACE = 30.0
RETRY_CONFLICT = 60.0
RESOURCES: dict[str, Resource] = {CONFIG_MAP: CONFIGMAPS, SECRET: SECRETS}


def _age(obj: dict) -> float:
    created = obj["metadata"].get("creationTimestamp")
    if not created:
        return GRACE
    then = dt.datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    return time.time() - then.timestamp()


class Follower:
    """Copies of one kind (ConfigMap or Secret)."""

    def __init__(
        self,
        kind: str,
        local: Cluster,
        registry: TargetRegistry,
        *,
        cluster_name: str,
        events: EventRecorder,
        workers: int,
    ) -> None:
        self.kind = kind
        self.resource = RESOURCES[kind]
        self.local = local
        self.registry = registry
        self.cluster_name = cluster_name
        self.events = events
        self.controller = Controller(f"follow-{self.resource.plural}", self, workers=workers)
        self.sources = self.controller.watch(
            local, self.resource, transform=slim_followed, predicates=[self._relevant]
        )
        self.copies: dict[str, Informer] = {}  # by virtual node name
        self._handlers: dict[str, list[tuple[Informer, object]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._known: dict[tuple[str, str, str], str] = {}  # (node, ns, name) → hash written

    # -- wiring -------------------------------------------------------------------------------

    def _request(self, namespace: str, name: str) -> Request:
        return Request(self.local.name, namespace, name)

    def _relevant(self, _event: str, obj: dict, _old: dict | None) -> bool:
        """Only objects that have copies or users in a target are reconciled."""
        meta = obj["metadata"]
        if has_finalizer(obj, keys.FINALIZER):
            return True
        ref = reference_key(self.kind, meta.get("namespace") or "", meta["name"])
        return any(c.delegates_using(ref) for c in self._targets(meta.get("namespace") or ""))

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

        def on_copy(event: str, copy: dict, _old: dict | None, initial: bool) -> None:
            meta = copy["metadata"]
            if event == DELETED:
                self._known.pop((node, meta["namespace"], meta["name"]), None)
            if is_copy_of(copy, meta["namespace"], meta["name"], self.cluster_name):
                queue.add(self._request(meta["namespace"], meta["name"]), low_priority=initial)

        connection.delegates.add_handler(on_delegate)
        copies.add_handler(on_copy)
        self.copies[node] = copies
        self._handlers[node] = [(connection.delegates, on_delegate), (copies, on_copy)]

    def disconnected(self, connection: TargetConnection) -> None:
        node = connection.node_name
        for informer, handler in self._handlers.pop(node, ()):
            informer.remove_handler(handler)
        self.copies.pop(node, None)
        for key in [k for k in self._known if k[0] == node]:
            del self._known[key]

    async def removed(self, connection: TargetConnection) -> None:
        """A Target is deleted: our copies there go too (if it can be reached)."""
        copies = self.copies.get(connection.node_name)
        if copies is None or connection.cluster is None:
            return
        for copy in copies.list():
            meta = copy["metadata"]
            if not is_copy_of(copy, meta["namespace"], meta["name"], self.cluster_name):
                continue
            try:
                await self._delete_copy(connection, copy)
            except ApiError as e:
                log.warning(
                    "copy not deleted %s %s/%s target=%s: %s",
                    self.kind,
                    meta["namespace"],
                    meta["name"],
                    connection.node_name,
                    e,
                )
            self.controller.queue.add(self._request(meta["namespace"], meta["name"]))

    def _lock(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _release(self, key: str, lock: asyncio.Lock) -> None:
        if not lock.locked() and self._locks.get(key) is lock:
            del self._locks[key]

    # -- reconcile ----------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Result | None:
        key = f"{request.namespace}/{request.name}"
        lock = self._lock(key)
        try:
            async with lock:
                return await self._reconcile(request.namespace, request.name)
        finally:
            self._release(key, lock)

    async def _reconcile(self, namespace: str, name: str) -> Result | None:
        source = self.sources.get(name, namespace)
        gone = source is None or is_deleting(source)
        ref = reference_key(self.kind, namespace, name)
        full: dict | None = None
        remaining = 0
        requeue: float | None = None
        failures: list[str] = []
        for connection in self._targets(namespace):
            copies = self.copies.get(connection.node_name)
            if copies is None or not copies.has_synced or copies.last_error is not None:
                continue  # not known now; its copies are reconciled when it connects
            copy = copies.get(name, namespace)
            ours = copy is not None and is_copy_of(copy, namespace, name, self.cluster_name)
            needed = not gone and bool(connection.delegates_using(ref))
            if copy is None and (connection.node_name, namespace, name) in self._known:
                # Just written, not cached yet: wait for the cache rather than guess.
                remaining += 1
                requeue = 1.0
                continue
            try:
                if needed:
                    assert source is not None
                    if not is_followed(source):
                        self._refuse(source, connection)
                        continue
                    if ours and copy["hash"] == source["hash"]:
                        remaining += 1
                        continue
                    if copy is not None and not ours:
                        self._conflict(source, connection)
                        requeue = RETRY_CONFLICT
                        continue
                    full = full or await self._source_with_finalizer(namespace, name)
                    if full is None:
                        break  # deleted meanwhile: the next event says so
                    if await self._write(connection, full, copy):
                        remaining += 1
                elif ours:
                    if not gone and _age(copy) < GRACE:
                        remaining += 1
                        requeue = min(requeue or GRACE, GRACE - _age(copy) + 1)
                        continue
                    await self._delete_copy(connection, copy)
            except ApiError as e:
                remaining += 1
                failures.append(f"{connection.name}: {e}")
        if failures:
            raise RuntimeError(f"{self.kind} {namespace}/{name}: " + "; ".join(failures))
        if source is not None and remaining == 0 and has_finalizer(source, keys.FINALIZER):
            await self._remove_finalizer(namespace, name)
        return Result(requeue_after=requeue) if requeue else None

    async def _source_with_finalizer(self, namespace: str, name: str) -> dict | None:
        """The source object, read in full, with our finalizer on it before any copy exists."""
        try:
            source = await self.local.client.get(self.resource, name, namespace)
        except NotFound:
            return None
        if is_deleting(source) or has_finalizer(source, keys.FINALIZER):
            return source
        meta = source["metadata"]
        patch = {
            "metadata": {
                "finalizers": [*(meta.get("finalizers") or ()), keys.FINALIZER],
                "labels": {keys.HAS_FINALIZER: "true"},
                "resourceVersion": meta["resourceVersion"],
            }
        }
        return await self.local.client.patch(self.resource, name, patch, namespace)

    async def _remove_finalizer(self, namespace: str, name: str) -> None:
        try:
            source = await self.local.client.get(self.resource, name, namespace)
        except NotFound:
            return
        meta = source["metadata"]
        if keys.FINALIZER not in (meta.get("finalizers") or ()):
            return
        patch: dict = {
            "metadata": {
                "finalizers": [f for f in meta["finalizers"] if f != keys.FINALIZER],
                "resourceVersion": meta["resourceVersion"],
            }
        }
        if (meta.get("labels") or {}).get(keys.HAS_FINALIZER):
            patch["metadata"]["labels"] = {keys.HAS_FINALIZER: None}
        with contextlib.suppress(NotFound):
            await self.local.client.patch(self.resource, name, patch, namespace)

    async def _write(self, connection: TargetConnection, source: dict, copy: dict | None) -> bool:
        """Create or update the copy in ``connection``'s cluster; False if not ours to write."""
        cluster = connection.cluster
        assert cluster is not None
        meta = source["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        body = desired_copy({**source, "kind": self.kind}, self.cluster_name)
        written_hash = slim_followed(body)["hash"]
        client = cluster.client
        if copy is None:
            try:
                await client.create(self.resource, body, namespace)
                action = "created"
            except AlreadyExists:
                existing = await client.get(self.resource, name, namespace)
                if not is_copy_of(existing, namespace, name, self.cluster_name):
                    self._conflict(source, connection)
                    return False
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                await self._replace(connection, body, existing)
                action = "updated"
        else:
            body["metadata"]["resourceVersion"] = copy["metadata"]["resourceVersion"]
            await self._replace(connection, body, copy)
            action = "updated"
        self._known[(connection.node_name, namespace, name)] = written_hash
        log.info("copy %s %s %s/%s target=%s", action, self.kind, namespace, name, connection.name)
        return True

    async def _replace(self, connection: TargetConnection, body: dict, copy: dict) -> None:
        client = connection.cluster.client  # type: ignore[union-attr]
        try:
            await client.update(self.resource, body)
        except Invalid:
            # An immutable copy (or a secret whose type changed) is replaced, not updated.
            await self._delete_copy(connection, copy)
            body["metadata"].pop("resourceVersion", None)
            await client.create(self.resource, body, body["metadata"]["namespace"])

    async def _delete_copy(self, connection: TargetConnection, copy: dict) -> None:
        meta = copy["metadata"]
        await connection.cluster.client.delete(  # type: ignore[union-attr]
            self.resource,
            meta["name"],
            meta["namespace"],
            preconditions={"uid": meta["uid"]} if meta.get("uid") else None,
            missing_ok=True,
        )
        self._known.pop((connection.node_name, meta["namespace"], meta["name"]), None)
        log.info(
            "copy deleted %s %s/%s target=%s",
            self.kind,
            meta["namespace"],
            meta["name"],
            connection.name,
        )

    def _reference(self, source: dict) -> dict:
        return {"apiVersion": "v1", "kind": self.kind, "metadata": source["metadata"]}

    def _conflict(self, source: dict, connection: TargetConnection) -> None:
        meta = source["metadata"]
        self.events.emit(
            self._reference(source),
            "Warning",
            "CopyConflict",
            f"{self.kind} {meta['namespace']}/{meta['name']} exists in target {connection.name} "
            f"and is not a copy made by this cluster: left as it is, and delegates there use it",
        )

    def _refuse(self, source: dict, connection: TargetConnection) -> None:
        self.events.emit(
            self._reference(source),
            "Warning",
            "NotCopied",
            f"service-account token secrets are not copied (target {connection.name} issues "
            f"its own): delegates there cannot use this one",
        )

    # -- before a delegate is created ---------------------------------------------------------

    async def ensure(self, connection: TargetConnection, namespace: str, name: str) -> None:
        """Make sure the copy of ``namespace/name`` exists in ``connection`` now."""
        source = self.sources.get(name, namespace)
        if source is None or is_deleting(source) or not is_followed(source):
            return
        if self._known.get((connection.node_name, namespace, name)) == source["hash"]:
            return
        copies = self.copies.get(connection.node_name)
        if copies is None or not copies.has_synced:
            return
        key = f"{namespace}/{name}"
        lock = self._lock(key)
        try:
            async with lock:
                copy = copies.get(name, namespace)
                if self._known.get((connection.node_name, namespace, name)) == source["hash"]:
                    return
                if copy is not None:
                    if not is_copy_of(copy, namespace, name, self.cluster_name):
                        self._conflict(source, connection)
                        return
                    if copy["hash"] == source["hash"]:
                        return
                full = await self._source_with_finalizer(namespace, name)
                if full is not None and not is_deleting(full):
                    await self._write(connection, full, copy)
        finally:
            self._release(key, lock)
        self.controller.queue.add(self._request(namespace, name))


class Follow:
    """Config maps and secrets that delegates use, copied to their targets."""

    def __init__(
        self, local: Cluster, registry: TargetRegistry, *, cluster_name: str, workers: int = 8
    ) -> None:
        events = EventRecorder(local.client, "admiralty-follow")
        self.followers = {
            kind: Follower(
                kind, local, registry, cluster_name=cluster_name, events=events, workers=workers
            )
            for kind in KINDS
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
        for follower in self.followers.values():
            await follower.removed(connection)

    async def prepare(self, connection: TargetConnection, delegate: dict) -> None:
        """Copy what ``delegate`` uses to its target before it is created there. Never raises:
        what fails here is retried by the controllers once the delegate exists."""
        cluster = connection.cluster
        if cluster is None or cluster is self.followers[CONFIG_MAP].local:
            return
        namespace = delegate["metadata"]["namespace"]
        for kind, names in references(delegate.get("spec") or {}).items():
            for name in names:
                try:
                    await self.followers[kind].ensure(connection, namespace, name)
                except ApiError as e:
                    log.warning(
                        "copy not made before delegate %s %s/%s target=%s: %s",
                        kind,
                        namespace,
                        name,
                        connection.name,
                        e,
                    )

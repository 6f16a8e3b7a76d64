"""The services controller (source side, leader only): Services reach delegates wherever they run.

Proxy pods never serve traffic. A Service of this cluster whose selector matches a proxy pod of
its namespace is *rerouted*: its selector is rewritten to the prefixed keys delegates carry and
it is made global (:mod:`..api.services` says exactly how). It is looked at again whenever it
changes (``kubectl apply`` of its manifest brings the old selector back: it is rerouted again)
and whenever a proxy pod appears or is relabelled in its namespace.

Only Services of namespaces labelled ``multicluster-scheduler=enabled`` are looked at: in any
other namespace a Service is neither rerouted nor copied (and copies it had are deleted), so
that a tenant of a namespace that never opted in writes nothing into targets through us.

Every global Service (rerouted, or annotated ``multicluster.admiralty.io/global=true`` by its
user) is copied to each connected target that serves its namespace, self targets excepted (the
Service is there already). Copies are kept equal to their original and recreated if deleted; a
Service of the same name that is not our copy is never overwritten (a Warning event on the
original says so). The original carries our finalizer while it is global: when it is deleted,
or stops being global, its copies are deleted from every target that can be reached, then the
finalizer is removed. A copy left meanwhile in a target that could not be reached is deleted
when that target is seen again, since each target's copies are cached and reconciled against
their originals: when the target's informer has synced, when the target becomes ready again,
when that informer recovers from an error, and every five minutes anyway (from the caches, no
API call unless a copy is out of date), so that no copy is orphaned because an event was missed
or a requeue was lost. One reconcile handles one original in all targets at once, each target within
its own time limit, so a slow or broken target never holds back the others.
"""

from __future__ import annotations

import asyncio
import enum
import logging

from multicluster import (
    AlreadyExists,
    ApiError,
    Cluster,
    Conflict,
    Controller,
    EnqueueMapped,
    Informer,
    Invalid,
    NotFound,
    Request,
    Result,
    Unreachable,
    is_deleting,
)
from multicluster.events import EventRecorder
from multicluster.informer import ADDED, DELETED, MODIFIED, strip_managed_fields
from multicluster.resources import PODS, SERVICES

from ..api import keys
from ..api.parents import is_ours
from ..api.proxy import PROXY_FIELD_SELECTOR, slim_proxy
from ..api.services import (
    copy_differs,
    copy_update,
    desired_copy,
    finalizer_patch,
    is_copy,
    is_copy_of,
    is_global,
    must_recreate,
    no_prefix,
    reroute_patch,
    rerouted_selector,
    selects,
    service_reference,
    unprefixed_selector,
)
from ..targets.delegates import enabled_namespaces, is_proxy
from ..targets.registry import TargetConnection, TargetRegistry

log = logging.getLogger(__name__)
NEVER_TOUCHED = ("kube-system",)
TARGET_TIMEOUT = 10.0  # one target's share of a reconcile
REMOVAL_TIMEOUT = 10.0  # deleting copies from a Target being deleted
RECHECK = 10.0  # a target that cannot be read now
RETRY_CONFLICT = 60.0  # a Service of the same name, not ours, may be deleted by its owner
LOOK_AGAIN = 1.0
RESYNC_PERIOD = 300.0  # every copy in a target is looked at again (from the caches)
HEALTH_PERIOD = 10.0  # how often a target's copies informer is checked for a recovery


class Copy(enum.Enum):
    """What one target holds of one original, after a reconcile did its part there."""

    CURRENT = "current"  # an up-to-date copy (possibly just written)
    ABSENT = "absent"  # no copy of ours (possibly just deleted)
    PENDING = "pending"  # a copy is going away or changed meanwhile: look again soon
    UNKNOWN = "unknown"  # the target cannot be read or reached now
    CONFLICT = "conflict"  # a Service of that name there is not ours
    FAILED = "failed"  # the target answered with an error


def _labels_changed(event: str, pod: dict, old: dict | None) -> bool:
    """Proxy pods matter when they appear or are relabelled (their status changes often)."""
    if event == ADDED:
        return True
    return (
        event == MODIFIED
        and old is not None
        and old["metadata"].get("labels") != pod["metadata"].get("labels")
    )


class ServiceSync:
    def __init__(
        self,
        local: Cluster,
        registry: TargetRegistry,
        *,
        cluster_name: str,
        excluded_namespaces: tuple[str, ...] = (),
        workers: int = 8,
    ) -> None:
        self.local = local
        self.registry = registry
        self.cluster_name = cluster_name
        self.excluded = frozenset((*NEVER_TOUCHED, *excluded_namespaces))
        self.events = EventRecorder(local.client, "admiralty-services")
        self.controller = Controller("services", self.reconcile, workers=workers)
        self.services = self.controller.watch(
            local, SERVICES, transform=strip_managed_fields, predicates=[self._eligible]
        )
        # The same informer as the scheduler's and the virtual kubelet's: one watch of proxies.
        self.proxies = self.controller.watch(
            local,
            PODS,
            field_selector=PROXY_FIELD_SELECTOR,
            transform=slim_proxy,
            predicates=[_labels_changed],
            handler=EnqueueMapped(self._services_selecting),
        )
        self.enabled = enabled_namespaces(local)
        self.enabled.add_handler(self._namespace_changed)
        self.copies: dict[str, Informer] = {}  # by virtual node name
        self._handlers: dict[str, tuple[Informer, object]] = {}
        self._watching: dict[str, asyncio.Task] = {}  # by node: resyncs of its copies
        self._ready: dict[str, bool] = {}
        # Warnings said, until the situation changes: (ns, name) → node → reason.
        self._warned: dict[tuple[str, str], dict[str, str]] = {}
        registry.on_connected(self._connected)
        registry.on_disconnected(self._disconnected)
        registry.on_changed(self._changed)
        registry.on_removed(self._removed)

    # -- what is looked at --------------------------------------------------------------------

    def _eligible(self, _event: str, service: dict, _old: dict | None) -> bool:
        return service["metadata"].get("namespace") not in self.excluded and not is_copy(service)

    def _request(self, namespace: str, name: str) -> Request:
        return Request(self.local.name, namespace, name)

    def _namespace_changed(self, event: str, namespace: dict, _old, initial: bool) -> None:
        """A namespace opted in or out: its Services are looked at again."""
        if initial or event not in (ADDED, DELETED):
            return
        name = namespace["metadata"]["name"]
        for service in self.services.list(name):
            self.controller.queue.add(self._request(name, service["metadata"]["name"]))

    def _services_selecting(self, _cluster: str, pod: dict) -> list[Request]:
        meta = pod["metadata"]
        namespace = meta["namespace"]
        if namespace in self.excluded:
            return []
        labels = meta.get("labels") or {}
        return [
            self._request(namespace, service["metadata"]["name"])
            for service in self.services.list(namespace)
            if not is_copy(service)
            and selects(
                unprefixed_selector((service.get("spec") or {}).get("selector") or {}), labels
            )
        ]

    def _targets(self, namespace: str) -> list[TargetConnection]:
        """Connected targets that may hold copies of Services of ``namespace``."""
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
            SERVICES,
            connection.namespace,
            label_selector=keys.PARENT_UID,
            transform=strip_managed_fields,
        )
        queue = self.controller.queue

        def on_copy(_event: str, copy: dict, _old: dict | None, initial: bool) -> None:
            meta = copy["metadata"]
            if is_ours(copy, self.cluster_name):
                queue.add(self._request(meta["namespace"], meta["name"]), low_priority=initial)

        copies.add_handler(on_copy)
        self.copies[node] = copies
        self._handlers[node] = (copies, on_copy)
        self._watching[node] = asyncio.get_running_loop().create_task(
            self._watch_copies(connection, copies), name=f"services-{node}"
        )

    async def _watch_copies(self, connection: TargetConnection, copies: Informer) -> None:
        """While ``connection`` is connected: resync once its copies are cached, whenever its
        informer recovers from an error (a relist or a resumed watch says nothing of copies
        that did not change, and a reconcile may have given up on them meanwhile), and every
        :data:`RESYNC_PERIOD` anyway. All from the caches."""
        node = connection.node_name
        await copies.wait_synced()
        if self.copies.get(node) is not copies:
            return
        self._resync(connection)
        loop = asyncio.get_running_loop()
        last, healthy = loop.time(), copies.healthy
        while True:
            await asyncio.sleep(HEALTH_PERIOD)
            if self.copies.get(node) is not copies:
                return
            was_healthy, healthy = healthy, copies.healthy
            try:
                if healthy and not was_healthy:
                    log.info("service copies informer recovered, resyncing target=%s", node)
                    self._resync(connection)
                    last = loop.time()
                elif loop.time() - last >= RESYNC_PERIOD:
                    self._resync_copies(copies)
                    last = loop.time()
            except Exception:
                log.exception("resync of service copies failed target=%s", node)

    def _resync_copies(self, copies: Informer | None) -> None:
        """Reconcile the original of every copy of ours in a target's cache (gone or not)."""
        queue = self.controller.queue
        for copy in copies.list() if copies is not None else ():
            meta = copy["metadata"]
            if is_ours(copy, self.cluster_name):
                queue.add(self._request(meta["namespace"], meta["name"]), low_priority=True)

    def _resync(self, connection: TargetConnection) -> None:
        """Reconcile every original that has, or should have, a copy in this target."""
        queue = self.controller.queue
        self._resync_copies(self.copies.get(connection.node_name))
        for service in self.services.list():
            meta = service["metadata"]
            if (
                is_global(service)
                and connection.allows(meta["namespace"])
                and self._eligible("", service, None)
            ):
                queue.add(self._request(meta["namespace"], meta["name"]), low_priority=True)

    def _changed(self, connection: TargetConnection) -> None:
        """A target that becomes ready again may hold copies whose original went away."""
        node = connection.node_name
        was_ready = self._ready.get(node, False)
        self._ready[node] = connection.ready
        if connection.ready and not was_ready and node in self.copies:
            self._resync(connection)

    def _disconnected(self, connection: TargetConnection) -> None:
        node = connection.node_name
        entry = self._handlers.pop(node, None)
        if entry is not None:
            entry[0].remove_handler(entry[1])
        self.copies.pop(node, None)
        self._ready.pop(node, None)
        task = self._watching.pop(node, None)
        if task is not None:
            task.cancel()
        for key in list(self._warned):
            self._forget_warning(key[0], key[1], node)

    async def _removed(self, connection: TargetConnection) -> None:
        """A Target is deleted: our copies there go too, if it can be reached."""
        copies = self.copies.get(connection.node_name)
        if copies is None or connection.cluster is None:
            return
        ours = [c for c in copies.list() if is_ours(c, self.cluster_name)]
        if not ours:
            return
        try:
            async with asyncio.timeout(REMOVAL_TIMEOUT):
                results = await asyncio.gather(
                    *(self._delete(connection, c) for c in ours), return_exceptions=True
                )
        except TimeoutError:
            results = [TimeoutError("timed out")]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            log.warning(
                "service copies not all deleted with their target target=%s error=%s",
                connection.node_name,
                errors[0],
            )

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(self, request: Request) -> Result | None:
        try:
            return await self._reconcile(request.namespace, request.name)
        except Conflict:
            # Our cache was behind the Service: the event that says so brings it back here.
            return Result(requeue_after=LOOK_AGAIN)

    async def _reconcile(self, namespace: str, name: str) -> Result | None:
        if namespace in self.excluded:
            return None
        if not (self.services.has_synced and self.enabled.has_synced):
            return Result(requeue_after=LOOK_AGAIN)
        service = self.services.get(name, namespace)
        if service is not None and is_copy(service):
            return None
        enabled = self.enabled.get(namespace) is not None
        if service is not None and enabled and not is_deleting(service):
            service = await self._reroute(service)
            if service is None:
                return None  # deleted meanwhile: its event brings it back here
        original = None  # the Service to copy, if it is to be copied
        live = service is not None and not is_deleting(service)
        if live and enabled and is_global(service):
            original = await self._patch(service, finalizer_patch(service, present=True))
            if original is None:
                return None
        targets = self._targets(namespace)
        outcomes = await asyncio.gather(
            *(self._sync(c, namespace, name, original) for c in targets)
        )
        if Copy.FAILED in outcomes:
            return Result(requeue=True)  # backs off; each failure is logged already
        delays = []
        if Copy.PENDING in outcomes:
            delays.append(LOOK_AGAIN)
        if Copy.UNKNOWN in outcomes:
            delays.append(RECHECK)
        if Copy.CONFLICT in outcomes:
            delays.append(RETRY_CONFLICT)
        if original is None:
            self._warned.pop((namespace, name), None)  # nothing to copy: nothing to warn about
        if original is None and service is not None and Copy.PENDING not in outcomes:
            # Copies in targets not reachable now are deleted when they are seen again.
            await self._patch(service, finalizer_patch(service, present=False))
        return Result(requeue_after=min(delays)) if delays else None

    async def _patch(self, service: dict, patch: dict | None) -> dict | None:
        """Apply a merge patch to the original; the Service as it is now, None if gone."""
        if patch is None:
            return service
        meta = service["metadata"]
        try:
            updated = await self.local.client.patch(
                SERVICES, meta["name"], patch, meta["namespace"]
            )
        except NotFound:
            return None
        return strip_managed_fields(updated)

    async def _reroute(self, service: dict) -> dict | None:
        meta = service["metadata"]
        proxies = [p for p in self.proxies.list(meta["namespace"]) if is_proxy(p)]
        try:
            patch = reroute_patch(service, (p["metadata"].get("labels") or {} for p in proxies))
        except ValueError as e:
            self.events.emit(
                service_reference(service),
                "Warning",
                "InvalidNoPrefixLabelRegexp",
                f"not rerouted: {e}",
            )
            return service
        if patch is None:
            return service
        before = (service.get("spec") or {}).get("selector") or {}
        unprefixed = no_prefix(service)
        updated = await self._patch(service, patch)
        if updated is None:
            return None
        after = rerouted_selector(before, unprefixed)
        log.info(
            "service rerouted namespace=%s name=%s selector=%s rerouted=%s",
            meta["namespace"],
            meta["name"],
            before,
            after,
        )
        self.events.emit(
            service_reference(updated),
            "Normal",
            "Rerouted",
            f"selector {_show(unprefixed_selector(before))} selects proxy pods: rewritten to "
            f"{_show(after)} to select their delegates, and the service made global",
        )
        return updated

    # -- one target ---------------------------------------------------------------------------

    async def _sync(
        self, connection: TargetConnection, namespace: str, name: str, original: dict | None
    ) -> Copy:
        """Make ``connection``'s copy of ``namespace/name`` match ``original`` (None: no copy
        is wanted there)."""
        copies = self.copies.get(connection.node_name)
        copy = copies.get(name, namespace) if copies is not None else None
        ours = copy is not None and is_copy_of(copy, namespace, name, self.cluster_name)
        if copies is None or not copies.has_synced or copies.last_error is not None:
            return Copy.UNKNOWN if original is not None or ours else Copy.ABSENT
        try:
            async with asyncio.timeout(TARGET_TIMEOUT):
                if original is None:
                    return await self._delete(connection, copy) if ours else Copy.ABSENT
                if copy is not None and not ours:
                    return self._conflict(original, connection)
                return await self._write(connection, original, copy)
        except Conflict:
            return Copy.PENDING  # changed meanwhile: its event is on the way
        except (Unreachable, TimeoutError) as e:
            log.info(
                "target not reachable for service copy namespace=%s name=%s target=%s error=%s",
                namespace,
                name,
                connection.node_name,
                str(e) or "timed out",
            )
            return Copy.UNKNOWN
        except ApiError as e:
            log.warning(
                "service copy failed namespace=%s name=%s target=%s error=%s",
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
                    f"the copy of this service in target {connection.name} could not be "
                    f"written: {e.message}",
                )
            return Copy.FAILED

    async def _write(self, connection: TargetConnection, original: dict, copy: dict | None) -> Copy:
        client = connection.cluster.client  # type: ignore[union-attr]
        meta = original["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        desired = desired_copy(original, self.cluster_name)
        if copy is None:
            try:
                await client.create(SERVICES, desired, namespace)
            except AlreadyExists:
                # Not in our cache: not a copy, or one the cache has not seen yet.
                copy = await client.get(SERVICES, name, namespace)
                if not is_copy_of(copy, namespace, name, self.cluster_name):
                    return self._conflict(original, connection)
            else:
                self._log_copy("created", connection, namespace, name)
                return self._resolved(connection, namespace, name)
        if is_deleting(copy):
            return Copy.PENDING
        if must_recreate(desired, copy):
            await self._delete(connection, copy)
            return Copy.PENDING  # created again once it is gone
        if not copy_differs(desired, copy):
            return self._resolved(connection, namespace, name)
        try:
            await client.update(SERVICES, copy_update(desired, copy))
        except Invalid as e:
            log.info(
                "service copy replaced namespace=%s name=%s target=%s reason=%r",
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
        await connection.cluster.client.delete(  # type: ignore[union-attr]
            SERVICES,
            meta["name"],
            meta["namespace"],
            preconditions={"uid": meta["uid"]} if meta.get("uid") else None,
            missing_ok=True,
        )
        self._log_copy("deleted", connection, meta["namespace"], meta["name"])
        self._forget_warning(meta["namespace"], meta["name"], connection.node_name)
        return Copy.ABSENT

    # -- telling users ------------------------------------------------------------------------

    def _log_copy(
        self, action: str, connection: TargetConnection, namespace: str, name: str
    ) -> None:
        log.info(
            "service copy %s namespace=%s name=%s target=%s",
            action,
            namespace,
            name,
            connection.node_name,
        )

    def _resolved(self, connection: TargetConnection, namespace: str, name: str) -> Copy:
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
            f"Service {meta['namespace']}/{meta['name']} exists in target {connection.name} "
            "and is not a copy made by this cluster: it is left as it is, and this service is "
            "not replicated there",
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
            "service not replicated namespace=%s name=%s target=%s reason=%s",
            meta["namespace"],
            meta["name"],
            connection.node_name,
            reason,
        )
        self.events.emit(service_reference(original), "Warning", reason, message)


def _show(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))

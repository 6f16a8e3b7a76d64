"""The pod side of the virtual kubelet (leader only): proxy pods bound to virtual nodes.

A kubelet runs the pods bound to its node and reports their status; ours has a delegate run in
the target and reports the delegate's status on the proxy pod. When the proxy pod is deleted,
the delegate is deleted first and our finalizer removed after it is gone. When the delegate
disappears or is evicted, the proxy pod fails with a reason that says so, so that its owner
replaces it: a proxy pod never "resurrects" as Pending. Delegates whose proxy pod no longer
exists are deleted. A pod that is not a proxy but lands on a virtual node (a DaemonSet pod
that tolerates every taint, say) is refused as a kubelet refuses a pod it cannot run: once,
with a terminal phase and a reason, and never again.

A target that goes away keeps its proxy pods (they may well still run there) unless it has a
failover setting: once it has been away that long, its proxy pods are released (deleted, as the
node lifecycle controller evicts pods from a lost node) so that owners replace them elsewhere,
and their delegates are deleted as orphans when the target is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from itertools import repeat

from multicluster import (
    ApiError,
    Cluster,
    Conflict,
    Controller,
    NotFound,
    Registration,
    Request,
    Result,
    Unreachable,
)
from multicluster.events import EventRecorder
from multicluster.gc import has_finalizer, remove_finalizer
from multicluster.informer import DELETED
from multicluster.resources import PODS

from ..api import keys
from ..api.proxy import (
    DELEGATE_LABEL_SELECTOR,
    PROXY_FIELD_SELECTOR,
    PROXY_UID_INDEX,
    is_deleting,
    is_terminal,
    looks_like_delegate,
    parent_uid,
    pod_reference,
    proxy_uid_index,
    slim_proxy,
)
from ..targets.delegates import DelegateLookup
from ..targets.registry import TargetConnection
from .status import annotation_patch, status_patch

log = logging.getLogger(__name__)
NODE_INDEX = "node"
RECHECK = 5.0
RELEASE_TIMEOUT = 5.0
RELEASE_CONCURRENCY = 32
RELEASE_PER_DELEGATE = 0.05
RELEASE_CEILING = 60.0
RELEASE_LISTED = 5000  # pods listed from a target that goes, beyond twice what its cache holds
VIRTUAL_NODE_PREFIX = "admiralty-"
REFUSED_REASON = "NotProxyPod"
FAILOVER_REASON = "TargetFailover"


class TooMany(Exception):
    """A target listed more pods than it could hold of ours."""


def _node_of(pod: dict) -> list[str]:
    node = pod["spec"].get("nodeName")
    return [node] if node else []


class PodSync:
    """Three controllers: bound proxy pods, orphaned delegates, and pods that are not proxies
    on virtual nodes."""

    def __init__(self, local: Cluster, lookup: DelegateLookup, *, workers: int = 32) -> None:
        self.local = local
        self.lookup = lookup
        self.registry = registry = lookup.registry
        self.cluster_name = lookup.cluster_name
        self.events = EventRecorder(local.client, "admiralty-virtual-kubelet")
        self.proxies_controller = Controller(
            "virtual-kubelet-pods", self.sync_proxy, workers=workers
        )
        self.orphans_controller = Controller("delegate-orphans", self.sync_orphan, workers=4)
        self.foreign_controller = Controller("virtual-node-refusals", self.refuse, workers=2)
        self.proxies = self.proxies_controller.watch(
            local,
            PODS,
            field_selector=PROXY_FIELD_SELECTOR,
            transform=slim_proxy,
            predicates=[lambda _event, pod, _old: bool(pod["spec"].get("nodeName"))],
        )
        self.proxies.add_indexer(PROXY_UID_INDEX, proxy_uid_index)
        self.proxies.add_indexer(NODE_INDEX, _node_of)
        self.proxies.add_handler(self._proxy_event)
        self._delegate_handlers: dict[str, Registration] = {}
        self._foreign: dict[str, Registration] = {}
        self._failovers: dict[str, asyncio.TimerHandle] = {}
        self._away: set[str] = set()
        registry.on_connected(self._connected)
        registry.on_disconnected(self._disconnected)
        registry.on_changed(self._target_changed)

    @property
    def controllers(self) -> list[Controller]:
        return [self.proxies_controller, self.orphans_controller, self.foreign_controller]

    # -- wiring -------------------------------------------------------------------------------

    def _connected(self, connection: TargetConnection) -> None:
        informer = connection.delegates
        if informer is None:
            return
        node = connection.node_name

        def on_delegate(_event: str, delegate: dict, _old: dict | None, initial: bool) -> None:
            uid = parent_uid(delegate)
            proxies = self.proxies.by_index(PROXY_UID_INDEX, uid) if uid else []
            for proxy in proxies:
                if proxy["spec"].get("nodeName"):
                    meta = proxy["metadata"]
                    request = Request(self.local.name, meta["namespace"], meta["name"])
                    self.proxies_controller.queue.add(request, low_priority=initial)
            if not proxies and looks_like_delegate(delegate, self.cluster_name):
                meta = delegate["metadata"]
                request = Request(node, meta["namespace"], meta["name"])
                self.orphans_controller.queue.add(request, low_priority=initial)

        self._delegate_handlers[node] = informer.add_handler(on_delegate)
        # Proxy pods bound there before we connected (an agent restart): a delegate that went
        # away meanwhile sends no event.
        for proxy in self.proxies.by_index(NODE_INDEX, node):
            meta = proxy["metadata"]
            self.proxies_controller.queue.add(
                Request(self.local.name, meta["namespace"], meta["name"]), low_priority=True
            )

    def _proxy_event(self, event: str, proxy: dict, _old: dict | None, _initial: bool) -> None:
        """A proxy pod gone without its delegates (let go while its target went, say) leaves
        them orphaned in whichever targets have them: they send no event of their own."""
        if event != DELETED:
            return
        uid = proxy["metadata"]["uid"]
        for connection in list(self.registry.connections.values()):
            for delegate in connection.delegates_of(uid):
                meta = delegate["metadata"]
                self.orphans_controller.queue.add(
                    Request(connection.node_name, meta["namespace"], meta["name"])
                )

    def _disconnected(self, connection: TargetConnection) -> None:
        registration = self._delegate_handlers.pop(connection.node_name, None)
        if registration is not None:
            registration.remove()

    def _target_changed(self, connection: TargetConnection) -> None:
        node = connection.node_name
        timer = self._failovers.pop(node, None)
        if timer is not None:
            timer.cancel()
        if connection.ready:
            if node in self._away:
                self._away.discard(node)
                self._check_delegates(connection)
            return
        self._away.add(node)
        due = connection.failover_in()
        if due is not None:
            self._failovers[node] = asyncio.get_running_loop().call_later(
                due, self._enqueue_node, node
            )

    def _enqueue_node(self, node: str) -> None:
        self._failovers.pop(node, None)
        for proxy in self.proxies.by_index(NODE_INDEX, node):
            meta = proxy["metadata"]
            self.proxies_controller.queue.add(
                Request(self.local.name, meta["namespace"], meta["name"])
            )

    def _check_delegates(self, connection: TargetConnection) -> None:
        """The target is back: proxy pods may have gone meanwhile (released, or deleted by
        hand), and a watch that resumes sends no event for delegates that did not change."""
        if connection.delegates is None:
            return
        for delegate in connection.delegates.list():
            meta = delegate["metadata"]
            self.orphans_controller.queue.add(
                Request(connection.node_name, meta["namespace"], meta["name"]), low_priority=True
            )

    def watch_node(self, node: str) -> None:
        """Refuse pods that are not proxies but land on ``node``."""
        if node in self._foreign:
            return
        informer = self.local.informer(
            PODS,
            field_selector=f"spec.nodeName={node},spec.schedulerName!={keys.PROXY_SCHEDULER_NAME}",
        )
        queue = self.foreign_controller.queue

        def on_pod(_event: str, pod: dict, _old: dict | None, _initial: bool) -> None:
            if not is_terminal(pod) and not is_deleting(pod):
                meta = pod["metadata"]
                queue.add(Request(node, meta["namespace"], meta["name"]))

        self._foreign[node] = informer.add_handler(on_pod)

    async def unwatch_node(self, node: str) -> None:
        registration = self._foreign.pop(node, None)
        if registration is not None:
            registration.remove()
            await self.local.remove_informer(registration.informer)

    # -- proxy pods bound to virtual nodes ----------------------------------------------------

    async def sync_proxy(self, request: Request) -> Result | None:
        proxy = self.proxies.get(request.name, request.namespace)
        if proxy is None:
            return None
        node = proxy["spec"].get("nodeName")
        connection = self.registry.by_node(node)
        if connection is None:
            if node in self.registry.removing:
                return Result(requeue_after=RECHECK)  # its release deletes delegates first
            targets = self.registry.target_nodes()
            # Its Target is gone (the release when it went failed, or nobody led then).
            gone = (
                targets is not None
                and node not in targets
                and node.startswith(VIRTUAL_NODE_PREFIX)
                and has_finalizer(proxy, keys.FINALIZER)
            )
            if gone and not await self._let_go(proxy):
                return Result(requeue_after=RECHECK)
            return None
        here = self.lookup.in_target(proxy, connection)
        elsewhere = await self._delete_duplicates(proxy, connection)
        result = await self._sync_bound(proxy, connection, here)
        if elsewhere is not None:
            raise elsewhere  # retried with backoff, once this pod's own target is served
        return result

    async def _delete_duplicates(
        self, proxy: dict, connection: TargetConnection
    ) -> Exception | None:
        """Delete the delegates of ``proxy`` in targets other than the one it is bound to. A
        target that cannot be reached does not hold the pod: its error is returned for a retry
        after the pod is served, and one away past its failover setting is left alone (the
        registry deletes the duplicate, its proxy pod being bound elsewhere, once it is back)."""
        namespace = proxy["metadata"]["namespace"]
        failed: Exception | None = None
        for other in self.registry.connections.values():
            if other is connection or other.same_place(connection, namespace):
                continue  # another Target of the same cluster and namespace sees the same pods
            for delegate in self.lookup.in_target(proxy, other):  # duplicates: it is bound here
                if is_deleting(delegate):
                    continue
                try:
                    await other.delete_delegate(
                        delegate, "its proxy pod is bound to another target"
                    )
                except Unreachable as e:
                    if other.failover_in() != 0:
                        failed = failed or e
                except ApiError as e:
                    failed = failed or e
        return failed

    async def _sync_bound(
        self, proxy: dict, connection: TargetConnection, here: list[dict]
    ) -> Result | None:
        if connection.failover_in() == 0 and (is_deleting(proxy) or not is_terminal(proxy)):
            return (
                None if await self._fail_over(proxy, connection) else Result(requeue_after=RECHECK)
            )
        if is_deleting(proxy):
            return await self._finalize(proxy, connection, here)
        if not connection.delegates_synced:
            return Result(requeue_after=RECHECK)  # cannot tell: wait for the target
        delegate = next((d for d in here if not is_deleting(d)), None)
        if delegate is None:
            if not here and not is_terminal(proxy):
                await self._lost(proxy, connection)
            return None
        await self._mirror(proxy, connection, delegate)
        return None

    async def _finalize(
        self, proxy: dict, connection: TargetConnection, here: list[dict]
    ) -> Result | None:
        for delegate in here:
            if not is_deleting(delegate):
                await connection.delete_delegate(delegate, "its proxy pod is deleted")
        if here:
            return Result(requeue_after=RECHECK)  # the delete events requeue it sooner
        if not connection.delegates_synced:
            return Result(requeue_after=RECHECK)  # a delegate may still run there
        await remove_finalizer(self.local.client, PODS, proxy, keys.FINALIZER)
        return None

    async def _mirror(self, proxy: dict, connection: TargetConnection, delegate: dict) -> None:
        meta = proxy["metadata"]
        annotations = annotation_patch(proxy, delegate)
        if annotations:
            await self.local.client.patch(
                PODS, meta["name"], {"metadata": {"annotations": annotations}}, meta["namespace"]
            )
        if is_terminal(proxy):
            return  # a terminal phase is final
        patch = status_patch(proxy, delegate)
        if not patch:
            return
        await self.local.client.patch(
            PODS, meta["name"], {"status": patch}, meta["namespace"], subresource="status"
        )
        status = delegate.get("status") or {}
        if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
            self.events.emit(
                pod_reference(proxy),
                "Warning",
                "DelegateEvicted",
                f"delegate {delegate['metadata']['name']} was evicted from target "
                f"{connection.name}: {status.get('message') or 'no reason given'}",
            )

    async def _lost(self, proxy: dict, connection: TargetConnection) -> None:
        """Its delegate was deleted in the target (by hand, a drain there, its garbage
        collector): the proxy pod is deleted, as Admiralty does, so that its owner replaces it
        and no Failed pod is left behind. Its finalizer goes on the next pass (no delegate)."""
        meta = proxy["metadata"]
        message = (
            f"the delegate of this pod in target {connection.name} was deleted outside "
            "multicluster-scheduler; this pod is deleted so that its owner replaces it"
        )
        self.events.emit(pod_reference(proxy), "Warning", "DelegateLost", message)
        try:
            await self.local.client.delete(
                PODS, meta["name"], meta["namespace"], preconditions={"uid": meta["uid"]}
            )
        except (NotFound, Conflict):
            return  # gone already, or another pod of that name now
        log.info(
            "delegate lost, proxy pod deleted namespace=%s proxy=%s target=%s",
            meta["namespace"],
            meta["name"],
            connection.node_name,
        )

    async def _fail_over(self, proxy: dict, connection: TargetConnection) -> bool:
        """Release ``proxy`` from a target away past its failover setting; whether done."""
        meta = proxy["metadata"]
        message = (
            f"target {connection.name} has not been Ready for {connection.failover_after:g}s "
            f"(its failoverAfterSeconds) ({connection.reason}: {connection.message}); this pod "
            "is released so that its owner replaces it elsewhere; its delegate there is "
            "deleted when the target is back"
        )
        if not is_deleting(proxy):
            self.events.emit(pod_reference(proxy), "Warning", FAILOVER_REASON, message)
        if connection.delegates_synced:  # reachable but not Ready (a summary missing, say)
            with contextlib.suppress(ApiError, TimeoutError):
                async with asyncio.timeout(RELEASE_TIMEOUT):
                    for delegate in self.lookup.in_target(proxy, connection):
                        await connection.delete_delegate(delegate, "its target failed over")
        if not await self._let_go(proxy):
            return False
        log.info(
            "proxy pod released namespace=%s name=%s target=%s reason=failover",
            meta["namespace"],
            meta["name"],
            connection.node_name,
        )
        return True

    # -- delegates whose proxy pod is gone ----------------------------------------------------

    async def sync_orphan(self, request: Request) -> Result | None:
        connection = self.registry.by_node(request.cluster)
        if connection is None or connection.delegates is None:
            return None
        delegate = connection.delegates.get(request.name, request.namespace)
        if delegate is None or is_deleting(delegate):
            return None
        if not looks_like_delegate(delegate, self.cluster_name):
            return None  # not ours, whatever its labels say
        if not connection.delegates_synced:
            return Result(requeue_after=RECHECK)  # the target is away: delete it when back
        if not self.proxies.has_synced:
            return Result(requeue_after=1.0)
        uid = parent_uid(delegate)
        if uid and self.proxies.by_index(PROXY_UID_INDEX, uid):
            return None
        await connection.delete_delegate(delegate, "its proxy pod no longer exists")
        return None

    # -- pods that are not proxies ------------------------------------------------------------

    async def refuse(self, request: Request) -> Result | None:
        registration = self._foreign.get(request.cluster)
        if registration is None:
            return None
        pod = registration.informer.get(request.name, request.namespace)
        if pod is None or is_terminal(pod) or is_deleting(pod):
            return None
        message = (
            f"Pod was rejected: {request.cluster} is a virtual node of multicluster-scheduler; "
            f"it runs only proxy pods (elected pods, scheduler {keys.PROXY_SCHEDULER_NAME})"
        )
        try:
            await self.local.client.patch(
                PODS,
                request.name,
                {"status": {"phase": "Failed", "reason": REFUSED_REASON, "message": message}},
                request.namespace,
                subresource="status",
            )
        except NotFound:
            return None
        self.events.emit(pod_reference(pod), "Warning", REFUSED_REASON, message)
        return None

    # -- a target goes away -------------------------------------------------------------------

    async def release(self, connection: TargetConnection) -> None:
        """The target is deleted: delete its delegates while we still can (all at once, within
        ``RELEASE_TIMEOUT``), and let go of the proxy pods bound to its node (finalizer
        removed, pod deleted) so owners replace them."""
        proxies = self.proxies.by_index(NODE_INDEX, connection.node_name)
        delegates = await self._left_in(connection)
        limit = asyncio.Semaphore(RELEASE_CONCURRENCY)

        async def delete(delegate: dict) -> None:
            async with limit:
                await connection.delete_delegate(delegate, "its target is deleted")

        try:
            # Enough time for the work (a target may hold thousands), not forever if it is away.
            # ... and a ceiling: a hostile target's answers must not hold the removal for hours.
            async with asyncio.timeout(
                min(RELEASE_TIMEOUT + RELEASE_PER_DELEGATE * len(delegates), RELEASE_CEILING)
            ):
                results = await asyncio.gather(
                    *(delete(d) for d in delegates), return_exceptions=True
                )
        except TimeoutError as e:
            results = [e]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.warning(
                "delegates not all deleted with their target target=%s failed=%d error=%s",
                connection.node_name,
                len(failed),
                failed[0],
            )
        for proxy in proxies:
            await self._let_go(proxy)

    async def _left_in(self, connection: TargetConnection) -> list[dict]:
        """Our delegates in a target that goes, but those of proxy pods placed in another Target
        of the same place. They are listed from its API server: the cache may not have seen the
        last ones created (the scheduler has waited for its creates under way to end). What a
        target answers is not trusted: pages are read one at a time, only the names of what
        qualifies are kept, and past a count the cache can explain, the cache is used."""
        if connection.cluster is None:
            return []
        cached = connection.delegates.list() if connection.delegates is not None else []
        most = RELEASE_LISTED + 2 * len(cached)
        left: list[dict] = []
        seen = 0
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT):
                async for page in connection.cluster.client.list_pages(
                    PODS, connection.namespace, label_selector=DELEGATE_LABEL_SELECTOR
                ):
                    items = page.get("items") or ()
                    seen += len(items)
                    if seen > most:
                        raise TooMany(f"over {most} pods listed")
                    left.extend(d for d in map(self._leftover, items, repeat(connection)) if d)
                    del page, items
        except (ApiError, TimeoutError, TooMany) as e:  # away, paused, or not an API server
            log.warning(
                "delegates of a removed target not listed, using the cache target=%s error=%s",
                connection.node_name,
                e or "no answer",
            )
            left = [d for d in map(self._leftover, cached, repeat(connection)) if d]
        return left

    def _leftover(self, pod: object, connection: TargetConnection) -> dict | None:
        """The name and uid of ``pod`` if it is a delegate of ours to delete with its target."""
        meta = pod.get("metadata") if type(pod) is dict else None
        if type(meta) is not dict:
            return None
        try:
            namespace = meta.get("namespace") or ""
            if (
                meta.get("deletionTimestamp")
                or not connection.allows(namespace)
                or not looks_like_delegate(pod, self.cluster_name)  # type: ignore[arg-type]
            ):
                return None
            proxy = self.lookup.proxy(parent_uid(pod))  # type: ignore[arg-type]
        except (AttributeError, TypeError):
            return None  # fields of the wrong types: not ours
        home = self.lookup.home(proxy) if proxy is not None else None
        if home is not None and home.same_place(connection, namespace):
            return None  # seen through another Target of that cluster, where it stays
        return {"metadata": {"name": meta["name"], "namespace": namespace, "uid": meta.get("uid")}}

    async def release_node(self, node: str) -> None:
        """The node of a target deleted while no agent led: its delegates cannot be found any
        more (nothing says where it was); let go of its proxy pods so owners replace them."""
        await self.proxies.wait_synced()
        for proxy in self.proxies.by_index(NODE_INDEX, node):
            await self._let_go(proxy)

    async def _let_go(self, proxy: dict) -> bool:
        """Remove our finalizer and delete the proxy pod (a fresh copy is read once when the
        cached one is behind); whether it is done. Not done, the caller's reconcile is retried:
        retries belong to the controller's queue."""
        meta = proxy["metadata"]
        for _ in range(2):
            try:
                if await remove_finalizer(self.local.client, PODS, proxy, keys.FINALIZER) is None:
                    return True  # gone
                await self.local.client.delete(
                    PODS,
                    meta["name"],
                    meta["namespace"],
                    missing_ok=True,
                    grace_period_seconds=0,
                    preconditions={"uid": meta["uid"]},
                )
                return True
            except Conflict:
                try:
                    proxy = await self.local.client.get(PODS, meta["name"], meta["namespace"])
                except NotFound:
                    return True
                if proxy["metadata"].get("uid") != meta["uid"]:
                    return True  # a namesake
            except ApiError as e:
                log.warning(
                    "proxy pod not released namespace=%s name=%s: %s",
                    meta["namespace"],
                    meta["name"],
                    e,
                )
                return False
        return False

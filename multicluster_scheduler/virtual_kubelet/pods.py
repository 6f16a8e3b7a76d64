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

An Argo workflow step's task result (its outputs) is brought back from the target before its
proxy pod is shown finished (:mod:`.argo`).

Annotations the target adds to a delegate are mirrored on its proxy pod (:mod:`.status`): the
first writes at once, each further one of the same proxy pod later and later (1 s, 2 s, 4 s…
up to 5 minutes, :class:`~multicluster.ratelimit.RepeatBackoff`), so that whoever may annotate
pods in a target's namespace does not make this cluster rewrite a proxy pod (its saved manifest
with it) at their pace. Its status is mirrored at once, always.
"""

from __future__ import annotations

import asyncio
import logging

from multicluster import (
    Cluster,
    Controller,
    Invalid,
    NotFound,
    Registration,
    Request,
    Result,
    by_namespace,
)
from multicluster.events import EventRecorder
from multicluster.gc import has_finalizer
from multicluster.informer import DELETED
from multicluster.ratelimit import RepeatBackoff
from multicluster.resources import PODS

from ..api import keys
from ..api.proxy import (
    PROXY_FIELD_SELECTOR,
    PROXY_UID_INDEX,
    is_deleting,
    is_terminal,
    looks_like_delegate,
    parent_uid,
    pod_reference,
    slim_proxy,
)
from ..targets.delegates import DelegateLookup
from ..targets.registry import TargetConnection
from ..targets.release import RECHECK, ProxyRelease
from .argo import NOT_COPIED, TaskResults
from .status import annotation_patch, status_patch

log = logging.getLogger(__name__)
ANNOTATIONS_BACKOFF = 1.0  # then doubling, per proxy pod
ANNOTATIONS_BACKOFF_CAP = 300.0
NODE_INDEX = "node"
VIRTUAL_NODE_PREFIX = "admiralty-"
REFUSED_REASON = "NotProxyPod"


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
        self.ending = ProxyRelease(local, lookup, self.events)
        self.task_results = TaskResults(local, self.events)
        # Pods that are not proxies, by the virtual node they are bound to.
        self.foreign: dict[str, Registration] = {}
        self.proxies = lookup.proxies  # the shared cache of proxy pods, indexed by uid
        self.proxies.add_indexer(NODE_INDEX, _node_of)
        # Status mirrored namespace by namespace in turn: one namespace's burst does not hold
        # up another's first pods (docs/scheduling.md, "Sharing the scheduler").
        self.proxies_controller = Controller(
            "virtual-kubelet-pods", BoundProxies(self), workers=workers, flow=by_namespace
        )
        self.proxies_controller.watch(
            local,
            PODS,
            field_selector=PROXY_FIELD_SELECTOR,
            transform=slim_proxy,
            predicates=[lambda _event, pod, _old: bool(pod["spec"].get("nodeName"))],
        )
        self.proxies.add_handler(self._proxy_event)
        self.orphans_controller = Controller("delegate-orphans", OrphanDelegates(self), workers=4)
        self.foreign_controller = Controller("virtual-node-refusals", Refusals(self), workers=2)
        self._delegate_handlers: dict[str, Registration] = {}
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
        if node in self.foreign:
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

        self.foreign[node] = informer.add_handler(on_pod)

    async def unwatch_node(self, node: str) -> None:
        registration = self.foreign.pop(node, None)
        if registration is not None:
            registration.remove()
            await self.local.remove_informer(registration.informer)

    # -- a target goes away -------------------------------------------------------------------

    async def release(self, connection: TargetConnection) -> None:
        """The target is deleted: its delegates are deleted while they can be, and the proxy
        pods bound to its node are let go so that owners replace them."""
        proxies = self.proxies.by_index(NODE_INDEX, connection.node_name)
        await self.ending.release_target(connection, proxies)

    async def release_node(self, node: str) -> None:
        """The node of a target deleted while no agent led: its delegates cannot be found any
        more (nothing says where it was); let go of its proxy pods so owners replace them."""
        await self.proxies.wait_synced()
        await self.ending.let_go_all(self.proxies.by_index(NODE_INDEX, node))


class BoundProxies:
    """The reconciler of proxy pods bound to virtual nodes: the delegate's status mirrored on
    the proxy pod, duplicates deleted, and how the pod ends (:mod:`..targets.release`)."""

    def __init__(self, pods: PodSync) -> None:
        self.pods = pods
        self.proxies = pods.proxies
        self.registry = pods.registry
        self.lookup = pods.lookup
        self.ending = pods.ending
        self.local = pods.local
        self.events = pods.events
        self.task_results = pods.task_results
        # Writes of mirrored annotations, by proxy pod uid.
        self.annotation_writes: RepeatBackoff[str] = RepeatBackoff(
            ANNOTATIONS_BACKOFF, ANNOTATIONS_BACKOFF_CAP
        )

    async def reconcile(self, request: Request) -> Result | None:
        proxy = self.proxies.get(request.name, request.namespace)
        if proxy is None:
            return None
        node = proxy["spec"].get("nodeName")
        connection = self.registry.by_node(node)
        if connection is None:
            return await self._without_target(proxy, node)
        here = self.lookup.in_target(proxy, connection)
        elsewhere = await self.ending.delete_duplicates(proxy, connection)
        result = await self._sync_bound(proxy, connection, here)
        if elsewhere is not None:
            raise elsewhere  # retried with backoff, once this pod's own target is served
        return result

    async def _without_target(self, proxy: dict, node: str) -> Result | None:
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
        if gone and not await self.ending.let_go(proxy):
            return Result(requeue_after=RECHECK)
        return None

    async def _sync_bound(
        self, proxy: dict, connection: TargetConnection, here: list[dict]
    ) -> Result | None:
        if connection.failover_in() == 0 and (is_deleting(proxy) or not is_terminal(proxy)):
            done = await self.ending.fail_over(proxy, connection)
            return None if done else Result(requeue_after=RECHECK)
        if is_deleting(proxy):
            found = [(connection, delegate) for delegate in here]
            return await self.ending.finalize(proxy, found, watched=connection)
        if not connection.delegates_synced:
            return Result(requeue_after=RECHECK)  # cannot tell: wait for the target
        delegate = next((d for d in here if not is_deleting(d)), None)
        if delegate is None:
            if not here and not is_terminal(proxy):
                await self.ending.lost(proxy, connection)
            return None
        return await self._mirror(proxy, connection, delegate)

    async def _mirror(
        self, proxy: dict, connection: TargetConnection, delegate: dict
    ) -> Result | None:
        meta = proxy["metadata"]
        annotations = annotation_patch(proxy, delegate)
        later = self.annotation_writes.wait(meta["uid"]) if annotations else 0.0
        if annotations and not later:
            self.annotation_writes.happened(meta["uid"])
            try:
                await self.local.client.patch(
                    PODS,
                    meta["name"],
                    {"metadata": {"annotations": annotations}},
                    meta["namespace"],
                )
            except Invalid as error:  # what the target added does not fit here: its status does
                self.events.emit(
                    pod_reference(proxy),
                    "Warning",
                    "AnnotationsNotCopied",
                    f"annotations of delegate {delegate['metadata']['name']} in target "
                    f"{connection.name} were refused here: {error}",
                )
        result = Result(requeue_after=later) if later else None
        if is_terminal(proxy):
            return result  # a terminal phase is final
        patch = status_patch(proxy, delegate)
        if not patch:
            return result
        if is_terminal(delegate):  # Argo reads a step's outputs when it sees its pod finished
            problem = await self.task_results.carry(proxy, connection)
            if problem:
                patch |= {"phase": "Failed", "reason": NOT_COPIED, "message": problem}
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
        return result


class OrphanDelegates:
    """The reconciler of delegates whose proxy pod no longer exists: they are deleted."""

    def __init__(self, pods: PodSync) -> None:
        self.proxies = pods.proxies
        self.registry = pods.registry
        self.cluster_name = pods.cluster_name

    async def reconcile(self, request: Request) -> Result | None:
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


class Refusals:
    """The reconciler of pods that are not proxies but are bound to a virtual node: refused
    once, as a kubelet refuses a pod it cannot run."""

    def __init__(self, pods: PodSync) -> None:
        self.watched = pods.foreign
        self.local = pods.local
        self.events = pods.events

    async def reconcile(self, request: Request) -> Result | None:
        registration = self.watched.get(request.cluster)
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

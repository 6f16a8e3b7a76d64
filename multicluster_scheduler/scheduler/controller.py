"""The proxy scheduler (leader only): places unbound proxy pods in targets, many at once.

For each unbound proxy pod: filter and score the targets on their summaries (no API call), create
the delegate in the best one, and let that target's own scheduler decide. ``PodScheduled=True``
there binds the proxy pod to the target's virtual node; ``Unschedulable`` there, or no decision
within ``verify_timeout``, deletes the delegate and tries the next target. When nothing fits,
the proxy pod stays Pending with ``PodScheduled=False/Unschedulable`` and a message in
kube-scheduler's style, and is tried again when a target or its summary changes.

One invariant above all: at most one live delegate per proxy pod. Delegates are found by their
``parent-uid`` label in every target's cache before any is created; the delegate's name is
derived from the proxy's uid, so a retry in the same target collides instead of duplicating;
and any extra delegate found (after a crash, say) is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from fractions import Fraction

from multicluster import (
    AlreadyExists,
    ApiError,
    Cluster,
    Conflict,
    Controller,
    Informer,
    NotFound,
    Registration,
    Request,
    Result,
    by_namespace,
)
from multicluster.events import EventRecorder
from multicluster.informer import ADDED, DELETED
from multicluster.kubetime import format_time, parse_time
from multicluster.resources import NODES, PODS

from ..api import keys
from ..api.constraints import delegate_constraints
from ..api.manifest_mac import ManifestKey
from ..api.proxy import (
    PROXY_FIELD_SELECTOR,
    PROXY_UID_INDEX,
    InvalidManifest,
    controller_uid,
    delegate_pod,
    is_deleting,
    is_terminal,
    no_prefix_regexp,
    not_made_by_webhook,
    pod_condition,
    pod_reference,
    proxy_uid_index,
    slim_proxy,
    source_manifest,
    untrusted_manifest,
)
from ..api.summary import slim_node
from ..targets.delegates import ENABLED_NAMESPACES, DelegateLookup, Placement, enabled_namespaces
from ..targets.registry import TargetConnection
from ..targets.release import ProxyRelease, delete_delegate
from .fit import (
    Candidate,
    Constraints,
    ProxyConstraints,
    choose,
    constraints,
    proxy_constraints,
    unschedulable_message,
    virtual_node_refusal,
)
from .throttle import CreateSlots

log = logging.getLogger(__name__)
ASSUME_GRACE = 3.0  # summaries are written at most once a second; then watched
EXCLUSION_TTL = 60.0
RETRY_UNSCHEDULABLE = 60.0
RETRY_DEBOUNCE = 0.5
# A delegate placed at once is told by one Scheduled event; one that waits longer in its
# target's scheduler gets a DelegateCreated event first.
ANNOUNCE_AFTER = 2.0
REJECTED = "target(s) rejected the delegate"
# A target that is slow to create delegates (or never answers) holds at most this many creates
# at once, each at most this long, per namespace of its Targets (or ClusterTarget): other
# tenants' pods are placed meanwhile. A ClusterTarget serves every namespace: one namespace holds
# at most MAX_CREATES_PER_NAMESPACE of its slots, and waiting pods go namespace by namespace.
MAX_CREATES_PER_OWNER = 10
MAX_CREATES_PER_NAMESPACE = 8
CREATE_TIMEOUT = 20.0
WAKE_RECHECK = 1.0  # pods waiting for an owner's creates: its free slots looked at again
RELEASE_RECHECK = 2.0  # a deleted pod's delegates still there: looked at again (events sooner)


# Called with the target and the delegate just before the delegate is created there (the follow
# controller copies the config maps and secrets it uses).
Prepare = Callable[[TargetConnection, dict], Awaitable[None]]
# Called with the target and its answer once it created a delegate, before the proxy pod can be
# bound (the source's heartbeat there lists it, so that it is kept alive while this cluster is
# away: docs/scheduling.md).
Created = Callable[[TargetConnection, dict], Awaitable[None]]


def proxy_informer(local: Cluster) -> Informer:
    """The cache of proxy pods, shared with the virtual kubelet (same selector and transform)."""
    informer = local.informer(PODS, field_selector=PROXY_FIELD_SELECTOR, transform=slim_proxy)
    informer.add_indexer(PROXY_UID_INDEX, proxy_uid_index)
    return informer


def runs_as_identity(manifest: dict, connection: TargetConnection, namespace: str) -> str | None:
    """Why the pod may not go to ``connection``: its delegate would run as the service account
    this cluster itself uses there (with all it may do: every pod and Secret of the namespace);
    None when it may."""
    identity = connection.identity or ""
    parts = identity.split(":")
    if len(parts) != 4 or parts[:2] != ["system", "serviceaccount"] or parts[2] != namespace:
        return None
    spec = manifest.get("spec") or {}
    account = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    if account != parts[3]:
        return None
    return (
        f"{connection.name}: the delegate would run as the service account this cluster uses "
        f"there ({namespace}/{account})"
    )


def _owner_of(connection: TargetConnection) -> str:
    """Whose targets these are: a namespace's Targets together, or one ClusterTarget."""
    if connection.namespace:
        return f"namespace/{connection.namespace}"
    return f"clustertarget/{connection.name}"


def _parse_time(text: str | None) -> float:
    if not text:
        return time.time()
    parsed = parse_time(text)
    return parsed.timestamp() if parsed is not None else time.time()


def _now() -> str:
    return format_time()


class SpreadLedger:
    """How many pods of each owner are placed (bound or in flight) on each target."""

    def __init__(self) -> None:
        self._where: dict[str, tuple[str, str]] = {}
        self._counts: dict[str, Counter[str]] = {}

    def set(self, uid: str, owner: str | None, node: str | None) -> None:
        old = self._where.pop(uid, None)
        if old is not None:
            counts = self._counts[old[0]]
            counts[old[1]] -= 1
            if counts[old[1]] <= 0:
                del counts[old[1]]
            if not counts:
                del self._counts[old[0]]
        if owner and node:
            self._where[uid] = (owner, node)
            self._counts.setdefault(owner, Counter())[node] += 1

    def count(self, owner: str | None, node: str) -> int:
        counts = self._counts.get(owner) if owner else None
        return counts[node] if counts is not None else 0


class Scheduler:
    def __init__(
        self,
        local: Cluster,
        lookup: DelegateLookup,
        *,
        verify_timeout: float = 30.0,
        workers: int = 64,
        prepare: Prepare | None = None,
        manifest_key: ManifestKey,
        created: Created | None = None,
    ) -> None:
        self.local = local
        self.prepare = prepare
        self.manifest_key = manifest_key  # a delegate is built only from a manifest it verifies
        self.created = created
        self.lookup = lookup
        self.registry = registry = lookup.registry
        self.cluster_name = lookup.cluster_name
        self.verify_timeout = verify_timeout
        self.events = EventRecorder(local.client, "admiralty-proxy-scheduler")
        self.ending = ProxyRelease(local, lookup, self.events)
        self.placements = lookup.placements  # shared with the lookup; written here only
        self.exclusions: dict[str, dict[str, tuple[str, float]]] = {}
        self.unschedulable: set[Request] = set()
        self.spread = SpreadLedger()
        self._assumed: dict[str, tuple[str, dict[str, Fraction]]] = {}
        self._assumed_totals: dict[str, dict[str, Fraction]] = {}
        self._constraints: dict[str, Constraints] = {}
        self._delegate_handlers: dict[str, Registration] = {}
        self._retry_pending = False
        # Delegates being created, by whoever owns the targets (a namespace, a ClusterTarget),
        # and the pods waiting for one of those creates to end.
        self._slots: CreateSlots[Request] = CreateSlots(
            MAX_CREATES_PER_OWNER, MAX_CREATES_PER_NAMESPACE
        )
        self._wake_timers: dict[str, asyncio.TimerHandle] = {}
        # Creates and bindings under way, by virtual node: a target that goes waits for them.
        self._in_flight: Counter[str] = Counter()
        self._landed = asyncio.Condition()
        # Pods bound that the cache does not show bound yet: not bound again meanwhile (a
        # delegate's events would have each bound twice, the second refused with a Conflict).
        self._bound: set[str] = set()
        self.proxies = proxy_informer(local)
        self.proxies.add_handler(self._track_spread)
        # Namespaces that opted in: only their proxy pods are placed.
        self.enabled = enabled_namespaces(local)
        self.enabled.add_handler(self._namespace_enabled)
        # Virtual nodes an admin cordons or taints take no new pods (the summary controller's
        # informer of the same cluster: no second watch).
        self.nodes = local.informer(NODES, transform=slim_node)
        self.nodes.add_handler(self._node_changed)
        # Pods of a namespace's burst delay another namespace's next pod by one turn, not by
        # the burst (docs/scheduling.md, "Sharing the scheduler").
        self.controller = Controller("scheduler", self, workers=workers, flow=by_namespace)
        self.controller.watch(
            local,
            PODS,
            field_selector=PROXY_FIELD_SELECTOR,
            transform=slim_proxy,
            predicates=[lambda _event, pod, _old: not pod["spec"].get("nodeName")],
        )
        registry.on_connected(self._connected)
        registry.on_disconnected(self._disconnected)
        registry.on_changed(self._target_changed)
        registry.on_removing(self._target_removing)

    # -- event wiring -------------------------------------------------------------------------

    def _request(self, pod: dict) -> Request:
        meta = pod["metadata"]
        return Request(self.local.name, meta["namespace"], meta["name"])

    def _track_spread(self, event: str, pod: dict, _old: dict | None, _initial: bool) -> None:
        uid = pod["metadata"]["uid"]
        if event == DELETED or is_terminal(pod):
            self._bound.discard(uid)
            self.spread.set(uid, None, None)
            return
        node = pod["spec"].get("nodeName")
        if node is not None:
            self._bound.discard(uid)
        if node is None and (placement := self.placements.get(uid)) is not None:
            node = placement.node
        self.spread.set(uid, controller_uid(pod), node)

    def _namespace_enabled(
        self, event: str, namespace: dict, _old: dict | None, initial: bool
    ) -> None:
        if event != ADDED or initial:
            return
        name = namespace["metadata"]["name"]
        for request in self.unschedulable:
            if request.namespace == name:
                self.controller.queue.add(request)

    def _node_changed(self, event: str, node: dict, old: dict | None, initial: bool) -> None:
        if initial or event == DELETED or old is None:
            return
        if node["spec"] != old["spec"] and self.registry.by_node(node["metadata"]["name"]):
            self._retry_unschedulable()  # uncordoned, or a taint removed

    def _connected(self, connection: TargetConnection) -> None:
        informer = connection.delegates
        if informer is None:
            return

        def on_delegate(_event: str, delegate: dict, _old: dict | None, initial: bool) -> None:
            uid = (delegate["metadata"].get("labels") or {}).get(keys.PARENT_UID)
            for proxy in self.proxies.by_index(PROXY_UID_INDEX, uid) if uid else ():
                if not proxy["spec"].get("nodeName"):
                    self.controller.queue.add(self._request(proxy), low_priority=initial)

        self._delegate_handlers[connection.node_name] = informer.add_handler(on_delegate)
        self._target_changed(connection)

    def _disconnected(self, connection: TargetConnection) -> None:
        registration = self._delegate_handlers.pop(connection.node_name, None)
        if registration is not None:
            registration.remove()

    def _target_changed(self, _connection: TargetConnection) -> None:
        self._retry_unschedulable()

    @contextlib.asynccontextmanager
    async def _flight(self, node: str) -> AsyncIterator[None]:
        """Count a create or binding towards ``node`` while it is under way."""
        self._in_flight[node] += 1
        try:
            yield
        finally:
            self._in_flight[node] -= 1
            if not self._in_flight[node]:
                del self._in_flight[node]
                async with self._landed:
                    self._landed.notify_all()

    async def _target_removing(self, connection: TargetConnection) -> None:
        """The target goes (it is out of the registry: nothing new is placed there): wait for
        the delegates being created there and the proxy pods being bound to it, so that its
        release finds every delegate that will ever be there; then let the pods placed there
        and still unbound be placed again."""
        node = connection.node_name
        try:
            async with asyncio.timeout(CREATE_TIMEOUT + 5.0), self._landed:
                await self._landed.wait_for(lambda: not self._in_flight[node])
        except TimeoutError:
            log.warning("work on a removed target still under way node=%s", node)
        for uid, placement in list(self.placements.items()):
            if placement.node == node:
                proxy = self.lookup.proxy(uid)
                if proxy is not None:
                    self.controller.queue.add(self._request(proxy))

    def _retry_unschedulable(self) -> None:
        """Try unschedulable pods again soon (once for a burst of changes)."""
        if self._retry_pending or not self.unschedulable:
            return
        self._retry_pending = True

        def retry() -> None:
            self._retry_pending = False
            for request in self.unschedulable:
                self.controller.queue.add(request)

        asyncio.get_running_loop().call_later(RETRY_DEBOUNCE, retry)

    # -- bookkeeping --------------------------------------------------------------------------

    def _wake(self, owner_key: str) -> None:
        """Queue as many pods waiting for ``owner_key``'s creates as it has slots free,
        namespaces in turn. A pod woken may go to another owner's target, leaving its slot
        unused: while pods wait, this looks again every ``WAKE_RECHECK`` seconds, so none waits
        for a create that never ends."""
        for request in self._slots.wake(owner_key):
            self.controller.queue.add(request)
        if self._slots.waiting(owner_key) and owner_key not in self._wake_timers:
            self._wake_timers[owner_key] = asyncio.get_running_loop().call_later(
                WAKE_RECHECK, self._wake_again, owner_key
            )

    def _wake_again(self, owner_key: str) -> None:
        del self._wake_timers[owner_key]
        self._wake(owner_key)

    def _assume(self, uid: str, node: str, requests: dict[str, Fraction]) -> None:
        self._unassume(uid)
        self._assumed[uid] = (node, requests)
        total = self._assumed_totals.setdefault(node, {})
        for name, amount in requests.items():
            total[name] = total.get(name, Fraction(0)) + amount

    def _unassume(self, uid: str) -> None:
        entry = self._assumed.pop(uid, None)
        if entry is None:
            return
        node, requests = entry
        total = self._assumed_totals.get(node, {})
        for name, amount in requests.items():
            total[name] = total.get(name, Fraction(0)) - amount
            if total[name] <= 0:
                del total[name]
        self._retry_unschedulable()  # room may have been freed

    def _settle(self, uid: str) -> None:
        """The pod is bound (or gone): forget what was in flight; keep its resources assumed
        until the target's summary has had time to count them."""
        self.placements.pop(uid, None)
        self.exclusions.pop(uid, None)
        self._constraints.pop(uid, None)
        if uid in self._assumed:
            asyncio.get_running_loop().call_later(ASSUME_GRACE, self._unassume, uid)

    def _forget(self, uid: str) -> None:
        self._settle(uid)
        self._unassume(uid)

    def _exclude(self, uid: str, node: str, why: str) -> None:
        self.exclusions.setdefault(uid, {})[node] = (why, time.monotonic() + EXCLUSION_TTL)
        placement = self.placements.get(uid)
        if placement is not None and placement.node == node:
            del self.placements[uid]
            self._unassume(uid)

    def _excluded(self, uid: str) -> dict[str, str]:
        entries = self.exclusions.get(uid)
        if not entries:
            return {}
        now = time.monotonic()
        for node in [n for n, (_, until) in entries.items() if until <= now]:
            del entries[node]
        return {node: why for node, (why, _) in entries.items()}

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile(self, request: Request) -> Result | None:
        proxy = self.proxies.get(request.name, request.namespace)
        if proxy is None:
            self.unschedulable.discard(request)
            return None
        uid = proxy["metadata"]["uid"]
        # A terminal pod is placed no more; one being deleted is still released (the pod
        # garbage collector marks an unscheduled pod being deleted Failed, maybe before we see
        # it deleted: our finalizer would stay for ever).
        if proxy["spec"].get("nodeName") or (is_terminal(proxy) and not is_deleting(proxy)):
            self.unschedulable.discard(request)
            self._settle(uid)
            return None
        if uid in self._bound and not is_deleting(proxy):
            return None  # bound: its cache shows it soon
        if not (
            self.proxies.has_synced
            and self.enabled.has_synced
            and self.nodes.has_synced
            and self.registry.settled()
        ):
            return Result(requeue_after=1.0)
        placement = self.placements.get(uid)
        found = self.lookup.everywhere(proxy, placement.node if placement else None)
        if is_deleting(proxy):
            return await self._release(request, proxy, found)
        live = [(c, d) for c, d in found if not is_deleting(d)]
        if placement is not None:
            home = self.registry.by_node(placement.node)
            mine, extra = [], []
            for c, d in live:
                if c.node_name == placement.node:
                    mine.append((c, d))
                elif home is not None and c.same_place(home, request.namespace):
                    mine.append((home, d))  # seen first through a Target of the same place
                else:
                    extra.append((c, d))
        else:
            live.sort(key=lambda cd: (not _scheduled(cd[1]), cd[1]["metadata"]["name"]))
            mine, extra = live[:1], live[1:]
        for connection, delegate in extra:
            await delete_delegate(connection, delegate, "an extra delegate of this pod")
        if mine:
            return await self._verify(proxy, *mine[0])
        if placement is not None:
            chosen = self.registry.by_node(placement.node)
            waited = time.time() - placement.started
            if chosen is not None and chosen.cluster is not None:
                if waited < self.verify_timeout:
                    return Result(requeue_after=self.verify_timeout - waited)
                await delete_delegate(chosen, _named(proxy, placement.delegate), "never seen")
            self._exclude(uid, placement.node, "the delegate never appeared in the target")
        return await self._place(request, proxy)

    async def _verify(
        self, proxy: dict, connection: TargetConnection, delegate: dict
    ) -> Result | None:
        uid = proxy["metadata"]["uid"]
        if _scheduled(delegate):
            await self._bind(proxy, connection, delegate)
            return None
        condition = pod_condition(delegate, "PodScheduled") or {}
        placement = self.placements.get(uid)
        if placement is None:  # found after a restart: its age counts from its creation
            started = _parse_time(delegate["metadata"].get("creationTimestamp"))
            placement = Placement(connection.node_name, delegate["metadata"]["name"], started)
            self.placements[uid] = placement
        if condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
            why = f"{connection.name}: {condition.get('message') or 'unschedulable'}"
        else:
            waited = time.time() - placement.started
            if waited < self.verify_timeout:
                announce = min(ANNOUNCE_AFTER, self.verify_timeout)
                if waited < announce:
                    return Result(requeue_after=announce - waited)
                if not placement.announced:
                    placement.announced = True
                    self.events.emit(
                        pod_reference(proxy),
                        "Normal",
                        "DelegateCreated",
                        f"created delegate {delegate['metadata']['name']} in target "
                        f"{connection.name}; waiting for its scheduler",
                    )
                return Result(requeue_after=self.verify_timeout - waited)
            why = f"{connection.name}: no scheduling decision within {self.verify_timeout:g}s"
        await delete_delegate(connection, delegate, "its target could not schedule it")
        self._exclude(uid, connection.node_name, why)
        self.events.emit(
            pod_reference(proxy),
            "Warning",
            "DelegateUnschedulable",
            f"target {connection.name} could not schedule delegate "
            f"{delegate['metadata']['name']} ({why}); trying another target",
        )
        return await self._place(self._request(proxy), proxy)

    def _refusal(self, proxy: dict) -> str | None:
        """Why ``proxy`` is not ours to place, if it is not: whoever may create pods can set
        ``schedulerName: admiralty-proxy``, in any namespace."""
        namespace = proxy["metadata"]["namespace"]
        if self.enabled.get(namespace) is None:
            return (
                f"namespace {namespace} is not enabled for multicluster-scheduler: its pods are "
                f"placed once it is labelled {ENABLED_NAMESPACES}"
            )
        lacks = not_made_by_webhook(proxy)
        if lacks is not None:
            return (
                f"not a proxy pod made by the webhook (it has {lacks}): create the pod with the "
                f"{keys.ELECT} annotation in an enabled namespace instead"
            )
        untrusted = untrusted_manifest(proxy, self.manifest_key)
        if untrusted is not None:
            return (
                f"its {keys.SOURCEPOD_MANIFEST} annotation is not the one multicluster-scheduler "
                f"saved when the pod was created ({untrusted}): a delegate runs only what this "
                "cluster's admission saw, so none is made from it; delete the pod (its owner, if "
                "it has one, makes it again)"
            )
        return None

    async def _place(self, request: Request, proxy: dict) -> Result | None:
        """Choose a target for ``proxy`` and create its delegate there, or say why none fits."""
        uid = proxy["metadata"]["uid"]
        refusal = self._refusal(proxy)
        if refusal is not None:
            await self._report_unschedulable(request, proxy, refusal)
            return None
        try:
            manifest = source_manifest(proxy)
            wants = self._constraints.get(uid)
            if wants is None:
                wants = self._constraints[uid] = constraints(delegate_constraints(manifest))
            asks = proxy_constraints(proxy["spec"])
            no_prefix_regexp((manifest.get("metadata") or {}).get("annotations"))
        except (InvalidManifest, ValueError) as e:
            await self._report_unschedulable(request, proxy, f"invalid proxy pod: {e}")
            return None
        owner = controller_uid(proxy)
        excluded = self._excluded(uid)
        namespace = proxy["metadata"]["namespace"]
        for connection in self.registry.connections.values():
            if not connection.allows(namespace):
                continue
            why = runs_as_identity(manifest, connection, namespace)
            if why is not None:
                excluded = {**excluded, connection.node_name: why}
        candidates, refused, allowed = self._candidates(proxy, asks, owner, excluded)
        feasible, reasons = choose(wants, candidates)
        if not feasible:
            message = unschedulable_message(
                allowed, [*reasons.values(), *refused, *(REJECTED for _ in excluded)]
            )
            if excluded:
                message += " " + "; ".join(sorted(excluded.values()))
            await self._report_unschedulable(request, proxy, message)
            retry = RETRY_UNSCHEDULABLE
            if excluded:
                retry = min(retry, EXCLUSION_TTL)
            return Result(requeue_after=retry)
        connection = self.registry.connections[feasible[0].name]
        delegate = delegate_pod(proxy, manifest, self.cluster_name)
        return await self._create(request, proxy, connection, delegate, wants)

    def _candidates(
        self, proxy: dict, asks: ProxyConstraints, owner: str | None, excluded: dict[str, str]
    ) -> tuple[list[Candidate], list[str], int]:
        """The targets ``proxy`` may go to, each with what the filter and score need; why its
        virtual node refuses it, for the others; and how many targets serve its namespace."""
        namespace = proxy["metadata"]["namespace"]
        candidates = []
        refused: list[str] = []
        allowed = 0
        for connection in self.registry.connections.values():
            if not connection.allows(namespace):
                continue
            allowed += 1
            if connection.node_name in excluded:
                continue
            refusal = virtual_node_refusal(self.nodes.get(connection.node_name), asks)
            if refusal is not None:
                refused.append(refusal)
                continue
            candidates.append(
                Candidate(
                    name=connection.node_name,
                    summary=connection.summary(),
                    ready=connection.ready and connection.delegates_synced,
                    assumed=self._assumed_totals.get(connection.node_name, {}),
                    siblings=self.spread.count(owner, connection.node_name),
                )
            )
        return candidates, refused, allowed

    async def _create(
        self,
        request: Request,
        proxy: dict,
        connection: TargetConnection,
        delegate: dict,
        wants: Constraints,
    ) -> Result | None:
        """Create ``delegate`` in the chosen target (at most ``MAX_CREATES_PER_OWNER`` at once
        per owner of targets, ``MAX_CREATES_PER_NAMESPACE`` of them for one namespace's pods,
        each within ``CREATE_TIMEOUT``)."""
        meta = proxy["metadata"]
        uid, namespace = meta["uid"], meta["namespace"]
        owner_key = _owner_of(connection)
        if not self._slots.take(owner_key, namespace):
            # No worker waits: the pod is tried again as soon as one of these creates ends (the
            # requeue is a backstop, for a create that never returns its slot).
            self._slots.wait(owner_key, namespace, request)
            return Result(requeue_after=CREATE_TIMEOUT)
        owner = controller_uid(proxy)
        self.placements[uid] = Placement(
            connection.node_name, delegate["metadata"]["name"], time.time()
        )
        self._assume(uid, connection.node_name, wants.requests)
        self.spread.set(uid, owner, connection.node_name)
        self.unschedulable.discard(request)
        made: dict | None = None
        try:
            async with asyncio.timeout(CREATE_TIMEOUT), self._flight(connection.node_name):
                if self.prepare is not None:
                    await self.prepare(connection, delegate)
                made = await connection.client.create(PODS, delegate, namespace)
        except AlreadyExists:
            pass
        except (ApiError, TimeoutError) as e:
            self._not_created(proxy, connection, e)
            return Result(requeue=True)
        finally:
            self._slots.give_back(owner_key, namespace)
            self._wake(owner_key)
        if made is not None and self.created is not None:
            await self.created(connection, made)  # (this pod is bound by a later reconcile)
        log.debug(
            "delegate created namespace=%s proxy=%s target=%s",
            namespace,
            meta["name"],
            connection.node_name,
        )
        return Result(requeue_after=min(ANNOUNCE_AFTER, self.verify_timeout))

    def _not_created(
        self, proxy: dict, connection: TargetConnection, error: ApiError | TimeoutError
    ) -> None:
        """The target refused the delegate, or did not answer: it is excluded for a while."""
        meta = proxy["metadata"]
        message = (
            error.message if isinstance(error, ApiError) else f"no answer in {CREATE_TIMEOUT:.0f}s"
        )
        why = f"{connection.name}: cannot create the delegate: {message}"
        self._exclude(meta["uid"], connection.node_name, why)
        self.spread.set(meta["uid"], controller_uid(proxy), None)
        self.events.emit(pod_reference(proxy), "Warning", "FailedCreateDelegate", why)
        log.warning(
            "delegate not created namespace=%s proxy=%s target=%s error=%s",
            meta["namespace"],
            meta["name"],
            connection.node_name,
            error,
        )

    async def _bind(self, proxy: dict, connection: TargetConnection, delegate: dict) -> None:
        meta = proxy["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": connection.node_name},
        }
        try:
            async with self._flight(connection.node_name):
                await self.local.client.create(
                    PODS, binding, meta["namespace"], subresource="binding", name=meta["name"]
                )
        except (NotFound, Conflict) as e:  # gone, or bound meanwhile: the cache will tell
            log.info("proxy not bound namespace=%s name=%s: %s", meta["namespace"], meta["name"], e)
            return
        cached = self.proxies.get(meta["name"], meta["namespace"])
        if (
            cached is not None
            and cached["metadata"]["uid"] == meta["uid"]
            and not cached["spec"].get("nodeName")
        ):
            self._bound.add(meta["uid"])  # (its event may have come before the answer)
        self._settle(meta["uid"])
        where = delegate["spec"].get("nodeName")
        self.events.emit(
            pod_reference(proxy),
            "Normal",
            "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to "
            f"{connection.node_name}: delegate {delegate['metadata']['name']} created in target "
            f"{connection.name}" + (f" and scheduled on its node {where}" if where else ""),
        )

    async def _report_unschedulable(self, request: Request, proxy: dict, message: str) -> None:
        self.unschedulable.add(request)
        current = pod_condition(proxy, "PodScheduled") or {}
        if (
            current.get("status") == "False"
            and current.get("reason") == "Unschedulable"
            and current.get("message") == message
        ):
            return
        meta = proxy["metadata"]
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": current.get("lastTransitionTime")
            if current.get("status") == "False"
            else _now(),
        }
        try:
            await self.local.client.patch(
                PODS,
                meta["name"],
                {"status": {"conditions": [condition]}},
                meta["namespace"],
                patch_type="strategic",
                subresource="status",
            )
        except NotFound:
            return
        self.events.emit(pod_reference(proxy), "Warning", "FailedScheduling", message)

    async def _release(
        self, request: Request, proxy: dict, found: list[tuple[TargetConnection, dict]]
    ) -> Result | None:
        """An unbound proxy pod is being deleted (:meth:`ProxyRelease.finalize`); a delegate
        created for it and not seen yet goes too."""
        uid = proxy["metadata"]["uid"]
        placement = self.placements.get(uid)
        if placement is not None and not any(d for c, d in found if c.node_name == placement.node):
            connection = self.registry.by_node(placement.node)
            if connection is not None and connection.cluster is not None:
                named = _named(proxy, placement.delegate)
                await delete_delegate(connection, named, "never seen")
        result = await self.ending.finalize(proxy, found, recheck=RELEASE_RECHECK)
        if result is None:
            self.unschedulable.discard(request)
            self._forget(uid)
        return result


def _named(proxy: dict, name: str) -> dict:
    """A delegate known only by its name (created, never seen in the cache)."""
    return {"metadata": {"name": name, "namespace": proxy["metadata"]["namespace"]}}


def _scheduled(delegate: dict) -> bool:
    if delegate["spec"].get("nodeName"):
        return True
    condition = pod_condition(delegate, "PodScheduled")
    return bool(condition and condition.get("status") == "True")

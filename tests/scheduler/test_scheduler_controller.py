"""The proxy scheduler, by behaviour, on the in-memory API server of :mod:`multicluster.testing`.

A source cluster and its targets are fake API servers; the scheduler's informers and the
targets' caches are the real ones, fed by their watches. Proxy pods are made the way the webhook
makes them (its mutation applied to an elected pod), target clusters publish a ClusterSummary
computed from their nodes, and what each target's own scheduler decides is written to the
delegate there by the test. Each test reconciles a proxy pod (or runs the workers) and reads
the outcome where users and targets see it: pods, bindings, conditions and Events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

import orjson
import pytest

from multicluster import Request, Result
from multicluster.errors import ApiError, Forbidden
from multicluster.resources import EVENTS, NAMESPACES, PODS
from multicluster.testing import Action, FakeCluster, FakeServer
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.manifest_mac import ManifestKey
from multicluster_scheduler.api.proxy import (
    delegate_name,
    delegate_pod,
    pod_condition,
    source_manifest,
)
from multicluster_scheduler.api.resources import CLUSTER_SUMMARIES
from multicluster_scheduler.scheduler.controller import Scheduler, proxy_informer
from multicluster_scheduler.summary.compute import summarize
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import (
    TargetConnection,
    TargetRegistry,
)
from multicluster_scheduler.webhook.mutation import mutation_patch
from tests.webhook.json_patch import apply_patch
from tests.webhook.sealing import KEY, sealer
from tests.worlds import attach

NS = "team-a"
ME = "source-1"  # this cluster's name on the delegates it makes
LOCAL = "local"


async def until(condition: Callable[[], object], timeout: float = 2.0) -> None:
    """Wait for ``condition`` to hold (the caches follow the fake servers' watches)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "not in time"
        await asyncio.sleep(0.002)


# -- what the clusters hold -----------------------------------------------------------------------


def node(name: str, cpu: str = "4", memory: str = "16Gi", **labels: str) -> dict:
    resources = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def cluster_summary(*nodes: dict) -> dict:
    """The ClusterSummary a target's agent publishes for these nodes (none of them busy)."""
    return {"metadata": {"name": keys.CLUSTER_SUMMARY_NAME}, **summarize(list(nodes), [])}


def namespace(name: str, enabled: bool = True) -> dict:
    labels = {keys.NAMESPACE_ENABLED_LABEL: keys.NAMESPACE_ENABLED_VALUE} if enabled else {}
    return {"metadata": {"name": name, "labels": labels}}


def elected(
    name: str,
    ns: str = NS,
    *,
    cpu: str = "100m",
    node_selector: dict | None = None,
    service_account: str | None = None,
) -> dict:
    """A pod as its owner creates it, elected for multicluster scheduling."""
    spec: dict = {
        "containers": [
            {
                "name": "app",
                "image": "nginx",
                "resources": {"requests": {"cpu": cpu, "memory": "32Mi"}},
            }
        ]
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if service_account:
        spec["serviceAccountName"] = service_account
    meta = {"name": name, "namespace": ns, "labels": {"app": "web"}}
    return {"metadata": {**meta, "annotations": {keys.ELECT: ""}}, "spec": spec}


def proxied(pod: dict) -> dict:
    """The pod as the API server stores it once the webhook mutated it: a proxy pod."""
    return apply_patch(pod, mutation_patch(pod, sealer(pod["metadata"]["namespace"])))


# -- a source cluster, its scheduler and its targets ----------------------------------------------


class World:
    """This cluster (``local``) with its proxy scheduler, and target clusters connected as the
    targets controller connects them."""

    def __init__(
        self,
        *,
        verify_timeout: float = 30.0,
        workers: int = 16,
        namespaces: tuple[str, ...] = (NS,),
        manifest_key: ManifestKey = KEY,
    ) -> None:
        self.local = FakeCluster(LOCAL)
        self.local.server.add(NAMESPACES, *map(namespace, namespaces))
        self.registry = TargetRegistry()
        self.lookup = DelegateLookup(self.registry, proxy_informer(self.local), ME)
        self.scheduler = Scheduler(
            self.local,
            self.lookup,
            verify_timeout=verify_timeout,
            workers=workers,
            manifest_key=manifest_key,
        )
        self.targets: dict[str, FakeCluster] = {}
        self.connections: dict[str, TargetConnection] = {}
        self._workers: asyncio.Task | None = None

    async def start(self) -> None:
        self.local.start()
        assert await self.local.wait_synced(2)

    async def connect(
        self,
        name: str,
        *nodes: dict,
        ns: str | None = NS,
        identity: str | None = None,
        cluster: FakeCluster | None = None,
    ) -> TargetConnection:
        """A Target ``name`` in ``ns`` (a ClusterTarget when ``ns`` is None) whose cluster has
        ``nodes``, attached as ``TargetsReconciler._attach`` does: its summary and delegates
        cached (the same informers, indexers and transform), then the registry told."""
        target = cluster or FakeCluster(name, FakeServer(name=name))
        target.server.add(CLUSTER_SUMMARIES, cluster_summary(*nodes))
        connection = TargetConnection("Target" if ns else "ClusterTarget", name, ns)
        connection.identity = identity
        await attach(self.registry, connection, target)
        self.targets[name], self.connections[name] = target, connection
        return connection

    def run_workers(self) -> None:
        self._workers = asyncio.create_task(self.scheduler.controller.run())

    async def stop(self) -> None:
        if self._workers is not None:
            self._workers.cancel()
            await asyncio.gather(self._workers, return_exceptions=True)
        self.scheduler.controller.queue.shut_down()  # its timers too
        for cluster in (self.local, *self.targets.values()):
            await cluster.stop()

    # -- acting as users, the webhook and the targets' schedulers --

    async def submit(self, pod: dict, *, webhook: bool = True) -> dict:
        """Create ``pod`` (mutated by the webhook, unless not) and wait for the scheduler's
        cache to hold it."""
        meta = pod["metadata"]
        made = await self.local.client.create(PODS, proxied(pod) if webhook else pod)
        await until(lambda: self.proxy(meta["name"], meta["namespace"]) is not None)
        return made

    def proxy(self, name: str, ns: str = NS) -> dict | None:
        """The proxy pod as the scheduler's cache holds it."""
        return self.scheduler.proxies.get(name, ns)

    async def reconcile(self, name: str, ns: str = NS) -> Result | None:
        return await self.scheduler.reconcile(Request(LOCAL, ns, name))

    def stored(self, name: str, ns: str = NS) -> dict | None:
        """The proxy pod as the local API server holds it."""
        found = [p for p in self.local.server.objects(PODS, ns) if p["metadata"]["name"] == name]
        return found[0] if found else None

    def bound_to(self, name: str, ns: str = NS) -> str | None:
        """The node the proxy pod is bound to, as the local API server holds it."""
        proxy = self.stored(name, ns)
        assert proxy is not None
        return proxy["spec"].get("nodeName")

    def delegates(self, target: str, ns: str = NS) -> list[dict]:
        """The pods in a target's API server."""
        return self.targets[target].server.objects(PODS, ns)

    def placed(self, ns: str = NS) -> dict[str, list[str]]:
        """The names of the pods in each target that holds any."""
        return {
            name: [p["metadata"]["name"] for p in pods]
            for name in self.targets
            if (pods := self.delegates(name, ns))
        }

    async def seen(self, target: str, name: str, check: Callable[[dict], object] = bool) -> None:
        """Wait for ``target``'s cache of delegates to hold ``name`` as ``check`` wants it."""
        informer = self.connections[target].delegates
        assert informer is not None

        def holds() -> object:
            delegate = informer.get(name, NS)
            return delegate is not None and check(delegate)

        await until(holds)

    async def gone(self, target: str, name: str) -> None:
        informer = self.connections[target].delegates
        assert informer is not None
        await until(lambda: informer.get(name, NS) is None)

    async def decide(self, target: str, name: str, condition: dict) -> None:
        """The target's scheduler writes its PodScheduled condition on the delegate."""
        patch = {"status": {"conditions": [{"type": "PodScheduled", **condition}]}}
        client = self.targets[target].client
        await client.patch(PODS, name, patch, NS, patch_type="strategic", subresource="status")
        await self.seen(target, name, lambda d: pod_condition(d, "PodScheduled"))

    async def bind_in_target(self, target: str, name: str, node_name: str) -> None:
        """The target's scheduler binds the delegate to one of its nodes."""
        binding = {"metadata": {"name": name, "namespace": NS}, "target": {"name": node_name}}
        client = self.targets[target].client
        await client.create(PODS, binding, NS, subresource="binding", name=name)
        await self.seen(target, name, lambda d: d["spec"].get("nodeName"))

    def events(self, reason: str) -> list[dict]:
        return [e for e in self.local.server.objects(EVENTS, NS) if e["reason"] == reason]

    def status_writes(self) -> list[Action]:
        return [
            a for a in self.local.server.writes if a.resource == PODS and a.subresource == "status"
        ]


@pytest.fixture
async def make_world() -> AsyncGenerator[Callable[..., Awaitable[World]], None]:
    made: list[World] = []

    async def make(**options: object) -> World:
        world = World(**options)  # type: ignore[arg-type]
        made.append(world)
        await world.start()
        return world

    yield make
    for world in made:
        await world.stop()


@pytest.fixture
async def world(make_world: Callable[..., Awaitable[World]]) -> World:
    """Two targets of namespace team-a: ``us`` (4 CPUs a node) and ``eu`` (16)."""
    made = await make_world()
    await made.connect("us", node("us-1", region="us"), node("us-2", region="us"))
    await made.connect("eu", node("eu-1", cpu="16", region="eu"))
    return made


def uid_of(proxy: dict | None) -> str:
    assert proxy is not None
    return proxy["metadata"]["uid"]


def delegate_of(world: World, name: str) -> str:
    """The name the delegate of proxy pod ``name`` has."""
    return delegate_name(name, uid_of(world.proxy(name)))


async def condition_seen(world: World, name: str, ns: str = NS) -> dict:
    """The proxy pod's PodScheduled condition, once the cache shows one: Unschedulable."""
    await until(lambda: pod_condition(world.proxy(name, ns) or {}, "PodScheduled"))
    condition = pod_condition(world.proxy(name, ns) or {}, "PodScheduled")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    return condition


# -- placement ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "fits"),
    [
        pytest.param(elected("web", node_selector={"region": "eu"}), "eu", id="selector-eu"),
        pytest.param(elected("web", node_selector={"region": "us"}), "us", id="selector-us"),
        pytest.param(elected("web", cpu="8"), "eu", id="cpu"),
    ],
)
async def test_an_unbound_proxy_gets_one_delegate_in_the_target_that_fits(
    world: World, pod: dict, fits: str
) -> None:
    await world.submit(pod)
    result = await world.reconcile("web")
    assert result is not None
    assert result.requeue_after > 0, "its target's scheduler is waited for"
    proxy = world.proxy("web")
    uid = uid_of(proxy)
    assert world.placed() == {fits: [delegate_name("web", uid)]}, "the other gets nothing"
    (delegate,) = world.delegates(fits)
    meta = delegate["metadata"]
    assert meta["labels"][keys.PARENT_UID] == uid
    assert meta["annotations"][keys.PARENT_CLUSTER_NAME] == ME
    assert meta["annotations"][keys.PARENT_NAME] == "web"
    assert delegate["spec"]["containers"] == pod["spec"]["containers"], "the spec as written"
    assert delegate["spec"].get("schedulerName") != keys.PROXY_SCHEDULER_NAME
    assert world.bound_to("web") is None, "bound only once its target schedules it"


# -- binding --------------------------------------------------------------------------------------


async def scheduled_by_binding(world: World, target: str, name: str) -> None:
    await world.bind_in_target(target, name, f"{target}-1")


async def scheduled_by_condition(world: World, target: str, name: str) -> None:
    await world.decide(target, name, {"status": "True"})


@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param(scheduled_by_binding, id="nodeName"),
        pytest.param(scheduled_by_condition, id="PodScheduled=True"),
    ],
)
async def test_a_delegate_scheduled_in_its_target_binds_the_proxy_to_its_virtual_node(
    world: World, schedule: Callable[[World, str, str], Awaitable[None]]
) -> None:
    await world.submit(elected("web", node_selector={"region": "eu"}))
    await world.reconcile("web")
    delegate = delegate_of(world, "web")
    await world.seen("eu", delegate)
    assert await world.reconcile("web") is not None, "not scheduled there yet: not bound"
    assert world.bound_to("web") is None
    await schedule(world, "eu", delegate)
    assert await world.reconcile("web") is None
    node_name = world.connections["eu"].node_name
    assert world.bound_to("web") == node_name
    bindings = [a for a in world.local.server.writes if a.subresource == "binding"]
    assert [(a.verb, a.name, a.namespace) for a in bindings] == [("create", "web", NS)]
    await until(lambda: world.events("Scheduled"))
    (event,) = world.events("Scheduled")
    assert event["type"] == "Normal"
    assert event["involvedObject"]["name"] == "web"
    assert event["message"].startswith(f"Successfully assigned {NS}/web to {node_name}: ")
    assert delegate in event["message"]
    assert world.delegates("eu")[0]["metadata"]["name"] == delegate, "the delegate stays"


async def test_a_proxy_is_bound_once_though_its_cache_shows_the_binding_late(
    world: World,
) -> None:
    """Each event of its delegate (the target's kubelet writes several) reconciles the proxy
    again; until the binding's own event arrives, the cache still shows it unbound, and it is
    not bound again (the API server would refuse: one more request, a Conflict, for nothing)."""
    await world.submit(elected("web", node_selector={"region": "eu"}))
    await world.reconcile("web")
    delegate = delegate_of(world, "web")
    await world.seen("eu", delegate)
    await world.bind_in_target("eu", delegate, "eu-1")
    assert await world.reconcile("web") is None
    proxy = world.proxy("web")
    assert proxy is not None
    assert proxy["spec"].get("nodeName") is None, "the cache has not seen the binding yet"
    assert await world.reconcile("web") is None
    bindings = [a for a in world.local.server.actions if a.subresource == "binding"]
    assert [(a.verb, a.name) for a in bindings] == [("create", "web")]
    await until(lambda: (world.proxy("web") or {})["spec"].get("nodeName"))
    assert world.scheduler._bound == set(), "forgotten once the cache shows it bound"


async def test_workers_bind_the_proxy_as_soon_as_its_target_schedules_the_delegate(
    world: World,
) -> None:
    """Told by the target's cache of delegates, not by a timer."""
    world.run_workers()
    await world.submit(elected("web", node_selector={"region": "eu"}))
    await until(lambda: world.placed())
    await world.bind_in_target("eu", delegate_of(world, "web"), "eu-1")
    node_name = world.connections["eu"].node_name
    await until(lambda: world.bound_to("web") == node_name, timeout=1.0)


# -- nothing fits ---------------------------------------------------------------------------------


async def test_a_pod_nothing_fits_is_unschedulable_once_with_a_scheduler_style_message(
    world: World,
) -> None:
    await world.submit(elected("big", cpu="64"))
    result = await world.reconcile("big")
    assert result is not None
    assert result.requeue_after > 0, "tried again later (and when a target changes)"
    assert world.placed() == {}
    condition = await condition_seen(world, "big")
    assert condition["message"] == "0/2 targets are available: 2 Insufficient cpu."
    await until(lambda: world.events("FailedScheduling"))
    assert len(world.status_writes()) == 1
    await world.reconcile("big")  # the same verdict: nothing is written again
    await asyncio.sleep(0.02)  # an event would be recorded by now
    assert len(world.status_writes()) == 1
    (event,) = world.events("FailedScheduling")
    assert (event["type"], event["count"]) == ("Warning", 1)
    assert event["message"] == condition["message"]


async def test_workers_place_an_unschedulable_pod_once_a_target_that_fits_connects(
    world: World,
) -> None:
    world.run_workers()
    await world.submit(elected("big", cpu="64"))
    await condition_seen(world, "big")
    await world.connect("huge", node("huge-1", cpu="96"))
    await until(lambda: world.placed() == {"huge": [delegate_of(world, "big")]})


async def test_the_message_counts_each_reason_of_each_target(world: World) -> None:
    await world.submit(elected("gpu", cpu="8", node_selector={"region": "us"}))
    await world.reconcile("gpu")
    condition = await condition_seen(world, "gpu")
    assert condition["message"] == (
        "0/2 targets are available: 1 Insufficient cpu, "
        "1 target(s) had no node matching Pod's node affinity/selector."
    )


# -- the target's scheduler has the last word -----------------------------------------------------


def where(world: World) -> str:
    """The one target that holds a delegate."""
    placed = world.placed()
    assert len(placed) == 1, placed
    return next(iter(placed))


async def test_a_delegate_its_target_finds_unschedulable_is_deleted_and_the_next_target_tried(
    world: World,
) -> None:
    await world.submit(elected("web"))
    await world.reconcile("web")
    first = where(world)
    other = next(name for name in world.targets if name != first)
    delegate = delegate_of(world, "web")
    await world.seen(first, delegate)
    refusal = {"status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available"}
    await world.decide(first, delegate, refusal)
    await world.reconcile("web")
    assert world.placed() == {other: [delegate]}, "deleted there, created in the next"
    await until(lambda: world.events("DelegateUnschedulable"))
    (event,) = world.events("DelegateUnschedulable")
    assert f"target {first} could not schedule delegate {delegate}" in event["message"]
    assert "0/2 nodes are available" in event["message"]
    await world.gone(first, delegate)
    await world.seen(other, delegate)
    await world.reconcile("web")
    assert world.placed() == {other: [delegate]}, "the first target is not tried again"


async def test_a_pod_every_target_refuses_is_unschedulable_with_their_reasons(world: World) -> None:
    await world.submit(elected("web"))
    refusal = {"status": "False", "reason": "Unschedulable", "message": "0/2 nodes are available"}
    tried = []
    for _ in world.targets:
        await world.reconcile("web")
        target = where(world)
        tried.append(target)
        delegate = delegate_of(world, "web")
        await world.seen(target, delegate)
        await world.decide(target, delegate, refusal)
    await world.reconcile("web")
    assert sorted(tried) == sorted(world.targets), "each tried once"
    assert world.placed() == {}
    condition = await condition_seen(world, "web")
    assert condition["message"] == (
        "0/2 targets are available: 2 target(s) rejected the delegate. "
        "eu: 0/2 nodes are available; us: 0/2 nodes are available"
    )


TIMEOUT = 1.0


async def test_a_delegate_without_a_decision_in_time_is_deleted_and_the_next_target_tried(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    """(A timeout of a second: placing and seeing the delegate must take less, also on a
    loaded machine.)"""
    world = await make_world(verify_timeout=TIMEOUT)
    await world.connect("us", node("us-1"))
    await world.connect("eu", node("eu-1"))
    await world.submit(elected("web"))
    started = time.monotonic()
    await world.reconcile("web")
    placed = time.monotonic()  # the placement's clock started before this
    first = where(world)
    other = next(name for name in world.targets if name != first)
    delegate = delegate_of(world, "web")
    await world.seen(first, delegate)
    assert time.monotonic() - started < TIMEOUT, "the machine is too slow for this test"
    result = await world.reconcile("web")
    assert result is not None
    assert result.requeue_after > 0
    assert world.placed() == {first: [delegate]}, "waited for while it has time"
    await asyncio.sleep(max(0.0, placed + TIMEOUT - time.monotonic()))
    await world.reconcile("web")
    assert world.placed() == {other: [delegate]}
    await until(lambda: world.events("DelegateUnschedulable"))
    (event,) = world.events("DelegateUnschedulable")
    assert f"{first}: no scheduling decision within 1s" in event["message"]


async def test_workers_try_the_next_target_when_the_verify_timeout_is_up(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    world = await make_world(verify_timeout=0.1)
    await world.connect("us", node("us-1"))
    await world.connect("eu", node("eu-1"))
    world.run_workers()
    await world.submit(elected("web"))
    await until(lambda: world.placed())
    first = where(world)
    other = next(name for name in world.targets if name != first)
    await until(lambda: other in world.placed(), timeout=0.6)


# -- a target that refuses the create -------------------------------------------------------------

QUOTA = 'pods "web" is forbidden: exceeded quota: compute, requested: cpu=100m, limited: cpu=4'


async def test_a_create_the_target_refuses_excludes_it_and_is_retried_elsewhere(
    world: World,
) -> None:
    refused: list[str] = []

    def refuse_the_first(action: Action) -> ApiError | None:
        """Whichever target is asked first refuses (quota), once."""
        if refused:
            return None
        refused.append(action.client)
        return action.error(403, QUOTA)

    for target in world.targets.values():
        target.server.prepend_reactor("create", PODS, refuse_the_first)
    await world.submit(elected("web"))
    result = await world.reconcile("web")
    assert result == Result(requeue=True), "tried again with backoff"
    (first,) = refused
    assert world.placed() == {}
    await until(lambda: world.events("FailedCreateDelegate"))
    (event,) = world.events("FailedCreateDelegate")
    assert event["type"] == "Warning"
    assert event["message"] == f"{first}: cannot create the delegate: {QUOTA}"
    await world.reconcile("web")
    other = next(name for name in world.targets if name != first)
    assert world.placed() == {other: [delegate_of(world, "web")]}
    creates = [a for a in world.targets[first].server.writes if a.verb == "create"]
    assert len(creates) == 1, "the refusing target is not asked again"


async def test_a_pod_whose_only_target_refuses_says_why(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    world = await make_world()
    connection = await world.connect("eu", node("eu-1"))
    world.targets["eu"].server.fail_next("create", PODS, Forbidden(QUOTA))
    await world.submit(elected("web"))
    assert await world.reconcile("web") == Result(requeue=True)
    await world.reconcile("web")
    assert world.placed() == {}
    condition = await condition_seen(world, "web")
    assert condition["message"] == (
        f"0/1 targets are available: 1 target(s) rejected the delegate. "
        f"{connection.name}: cannot create the delegate: {QUOTA}"
    )


# -- at most one delegate -------------------------------------------------------------------------


async def test_an_extra_delegate_found_after_a_crash_is_deleted_and_one_kept(
    world: World,
) -> None:
    """Delegates made before a restart, in both targets (the scheduler remembers none): the one
    its target scheduled is kept and the proxy bound there; the other is deleted."""
    await world.submit(elected("web"))
    proxy = world.stored("web")
    assert proxy is not None
    delegate = delegate_pod(proxy, source_manifest(proxy), ME)
    name = delegate["metadata"]["name"]
    world.targets["us"].server.add(PODS, delegate)
    world.targets["eu"].server.add(
        PODS, {**delegate, "spec": {**delegate["spec"], "nodeName": "eu-1"}}
    )
    await world.seen("us", name)
    await world.seen("eu", name)
    assert await world.reconcile("web") is None
    assert world.placed() == {"eu": [name]}
    assert world.bound_to("web") == world.connections["eu"].node_name
    creates = [a for t in world.targets.values() for a in t.server.writes if a.verb == "create"]
    assert creates == [], "nothing new is created"


async def test_of_two_unscheduled_delegates_after_a_crash_exactly_one_is_kept(
    world: World,
) -> None:
    await world.submit(elected("web"))
    proxy = world.stored("web")
    assert proxy is not None
    delegate = delegate_pod(proxy, source_manifest(proxy), ME)
    name = delegate["metadata"]["name"]
    for target in world.targets:
        world.targets[target].server.add(PODS, delegate)
        await world.seen(target, name)
    result = await world.reconcile("web")
    assert result is not None
    assert result.requeue_after > 0, "the one kept is waited for"
    (kept,) = world.placed().values()
    assert kept == [name]
    kept_in = where(world)
    await world.gone(next(t for t in world.targets if t != kept_in), name)
    await world.reconcile("web")
    assert world.placed() == {kept_in: [name]}, "and stays the one"
    creates = [a for t in world.targets.values() for a in t.server.writes if a.verb == "create"]
    assert creates == []


async def test_a_delegate_in_another_target_than_the_one_placed_in_is_deleted(
    world: World,
) -> None:
    await world.submit(elected("web", node_selector={"region": "eu"}))
    await world.reconcile("web")
    name = delegate_of(world, "web")
    await world.seen("eu", name)
    proxy = world.stored("web")
    assert proxy is not None
    world.targets["us"].server.add(PODS, delegate_pod(proxy, source_manifest(proxy), ME))
    await world.seen("us", name)
    await world.reconcile("web")
    assert world.placed() == {"eu": [name]}


# -- a proxy pod deleted before it is bound -------------------------------------------------------


def record(log: list[str], what: str) -> Callable[[Action], None]:
    def reaction(action: Action) -> None:
        log.append(f"{what} {action.verb} {action.name}")

    return reaction


async def test_an_unbound_proxy_being_deleted_loses_its_delegates_then_its_finalizer(
    world: World,
) -> None:
    await world.submit(elected("web"))
    await world.reconcile("web")
    target = where(world)
    delegate = delegate_of(world, "web")
    await world.seen(target, delegate)
    calls: list[str] = []
    world.targets[target].server.prepend_reactor("delete", PODS, record(calls, target))
    world.local.server.prepend_reactor("patch", PODS, record(calls, "local"))
    await world.local.client.delete(PODS, "web", NS)
    assert world.stored("web") is not None, "its finalizer holds it"
    await until(lambda: (world.proxy("web") or {})["metadata"].get("deletionTimestamp"))
    result = await world.reconcile("web")
    assert result is not None
    assert result.requeue_after > 0, "the finalizer stays until its cache shows them gone"
    assert world.placed() == {}
    assert calls == [f"{target} delete {delegate}"]
    assert world.stored("web") is not None
    await world.gone(target, delegate)
    assert await world.reconcile("web") is None
    assert world.stored("web") is None, "gone once the finalizer is"
    assert calls[0] == f"{target} delete {delegate}"
    assert calls[-1] == "local patch web", "then the finalizer, once"
    assert calls.count("local patch web") == 1


async def test_an_unbound_proxy_failed_by_the_pod_gc_before_it_is_released_still_goes(
    world: World,
) -> None:
    """Kubernetes' pod garbage collector marks an unscheduled pod being deleted Failed (every
    20 s): a proxy pod it reached first, terminal, kept our finalizer for ever."""
    await world.submit(elected("web"))
    await world.local.client.patch(
        PODS, "web", {"status": {"phase": "Failed"}}, NS, subresource="status"
    )
    await world.local.client.delete(PODS, "web", NS)
    await until(lambda: (world.proxy("web") or {})["metadata"].get("deletionTimestamp"))
    await until(lambda: (world.proxy("web") or {}).get("status", {}).get("phase") == "Failed")
    assert await world.reconcile("web") is None
    assert world.placed() == {}
    assert world.stored("web") is None, "our finalizer removed"


async def test_a_delegate_not_seen_yet_goes_with_its_deleted_proxy(world: World) -> None:
    """The delegate was created, but the target's cache is behind: it is deleted by name."""
    for connection in world.connections.values():
        assert connection.delegates is not None
        await connection.delegates.stop()  # their watches fall behind
    await world.submit(elected("web"))
    await world.reconcile("web")
    assert len(world.placed()) == 1
    await world.local.client.delete(PODS, "web", NS)
    await until(lambda: (world.proxy("web") or {})["metadata"].get("deletionTimestamp"))
    assert await world.reconcile("web") is None
    assert world.placed() == {}
    assert world.stored("web") is None


# -- pods that are not ours to place --------------------------------------------------------------


async def test_a_pod_of_a_namespace_not_enabled_is_not_placed_until_it_is(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    world = await make_world()
    await world.local.client.create(NAMESPACES, namespace("other", enabled=False))
    await world.connect("all", node("n-1"), ns=None)  # a ClusterTarget: every namespace
    await world.submit(elected("web", "other"))
    await world.reconcile("web", "other")
    assert world.placed("other") == {}
    condition = await condition_seen(world, "web", "other")
    assert condition["message"] == (
        "namespace other is not enabled for multicluster-scheduler: its pods are placed once "
        "it is labelled multicluster-scheduler=enabled"
    )
    labels = {"metadata": {"labels": {keys.NAMESPACE_ENABLED_LABEL: "enabled"}}}
    await world.local.client.patch(NAMESPACES, "other", labels)
    await until(lambda: world.scheduler.enabled.get("other"))
    await world.reconcile("web", "other")
    assert world.placed("other") == {
        "all": [delegate_name("web", uid_of(world.proxy("web", "other")))]
    }


def hand_made(pod: dict) -> dict:
    """Someone names the proxy scheduler on a pod of their own."""
    return {**pod, "spec": {**pod["spec"], "schedulerName": keys.PROXY_SCHEDULER_NAME}}


def finalizer_removed(pod: dict) -> dict:
    """A proxy pod whose finalizer someone took off (deleting it would leave its delegate)."""
    proxy = proxied(pod)
    proxy["metadata"]["finalizers"] = []
    return proxy


@pytest.mark.parametrize(
    ("make", "lacks"),
    [
        pytest.param(
            hand_made,
            f"no {keys.SOURCEPOD_MANIFEST} annotation and no {keys.FINALIZER} finalizer",
            id="hand-made",
        ),
        pytest.param(finalizer_removed, f"no {keys.FINALIZER} finalizer", id="no-finalizer"),
    ],
)
async def test_a_pod_not_made_by_the_webhook_is_not_placed(
    world: World, make: Callable[[dict], dict], lacks: str
) -> None:
    await world.submit(make(elected("web")), webhook=False)
    await world.reconcile("web")
    assert world.placed() == {}
    condition = await condition_seen(world, "web")
    assert condition["message"] == (
        f"not a proxy pod made by the webhook (it has {lacks}): create the pod with the "
        f"{keys.ELECT} annotation in an enabled namespace instead"
    )


# -- a manifest changed after admission ----------------------------------------------------------

PRIVILEGED = {
    "hostNetwork": True,
    "hostPID": True,
    "serviceAccountName": "admin",
    "containers": [
        {
            "name": "root",
            "image": "busybox",
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "host", "mountPath": "/host"}],
        }
    ],
    "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
}


def rewritten(pod: dict) -> dict:
    """A proxy pod whose manifest its tenant replaced with a spec of their own (kubectl
    annotate --overwrite): the MAC stays."""
    proxy = proxied(pod)
    manifest = orjson.loads(proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST])
    manifest["spec"] = PRIVILEGED
    proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] = orjson.dumps(manifest).decode()
    return proxy


def mac_removed(pod: dict) -> dict:
    """The same, its MAC taken off too."""
    proxy = rewritten(pod)
    del proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST_MAC]
    return proxy


def sealed_elsewhere(pod: dict) -> dict:
    """A manifest and MAC the webhook wrote for a pod of the same name in another namespace."""
    other = proxied({**pod, "metadata": {**pod["metadata"], "namespace": "team-b"}})
    proxy = proxied(pod)
    for key in (keys.SOURCEPOD_MANIFEST, keys.SOURCEPOD_MANIFEST_MAC):
        proxy["metadata"]["annotations"][key] = other["metadata"]["annotations"][key]
    return proxy


def another_pods(pod: dict) -> dict:
    """The manifest and MAC of another pod of the namespace, copied onto this one."""
    other = proxied(elected("admin-debug"))
    proxy = proxied(pod)
    for key in (keys.SOURCEPOD_MANIFEST, keys.SOURCEPOD_MANIFEST_MAC):
        proxy["metadata"]["annotations"][key] = other["metadata"]["annotations"][key]
    return proxy


@pytest.mark.parametrize(
    ("make", "why"),
    [
        pytest.param(
            rewritten,
            f"its {keys.SOURCEPOD_MANIFEST_MAC}: it does not verify for this manifest in this "
            "namespace",
            id="rewritten",
        ),
        pytest.param(
            mac_removed,
            f"it has no {keys.SOURCEPOD_MANIFEST_MAC}, and the pod was made after the key that "
            "seals manifests: by hand, or admitted by the webhook of an earlier release while "
            "this one rolled out",
            id="mac-removed",
        ),
        pytest.param(
            sealed_elsewhere,
            f"its {keys.SOURCEPOD_MANIFEST_MAC}: it does not verify for this manifest in this "
            "namespace",
            id="another-namespace",
        ),
        pytest.param(another_pods, "it was saved for pod 'admin-debug'", id="another-pod"),
    ],
)
async def test_a_manifest_the_webhook_did_not_save_for_the_pod_is_never_placed(
    world: World, make: Callable[[dict], dict], why: str
) -> None:
    await world.submit(make(elected("web")), webhook=False)
    await world.reconcile("web")
    assert world.placed() == {}
    condition = await condition_seen(world, "web")
    assert condition["message"] == (
        f"its {keys.SOURCEPOD_MANIFEST} annotation is not the one multicluster-scheduler saved "
        f"when the pod was created ({why}): a delegate runs only what this cluster's admission "
        "saw, so none is made from it; delete the pod (its owner, if it has one, makes it again)"
    )
    await until(lambda: world.events("FailedScheduling"))
    (event,) = world.events("FailedScheduling")
    assert (event["type"], event["message"]) == ("Warning", condition["message"])
    assert event["involvedObject"]["name"] == "web"


async def test_a_manifest_changed_while_the_pod_waits_is_never_placed(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    """The tenant's pod waits (no target has its region), the tenant rewrites its manifest,
    then room is made: nothing is placed."""
    world = await make_world()
    await world.connect("eu", node("eu-1", region="eu"))
    await world.submit(elected("web", node_selector={"region": "us"}))
    await world.reconcile("web")
    assert "node affinity/selector" in (await condition_seen(world, "web"))["message"]
    saved = world.proxy("web")["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST]
    forged = orjson.dumps({**orjson.loads(saved), "spec": PRIVILEGED}).decode()
    patch = {"metadata": {"annotations": {keys.SOURCEPOD_MANIFEST: forged}}}
    await world.local.client.patch(PODS, "web", patch, NS)
    await until(
        lambda: world.proxy("web")["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] == forged
    )
    await world.connect("us", node("us-1", region="us"))
    await world.reconcile("web")
    assert world.placed() == {}
    await until(
        lambda: "does not verify" in pod_condition(world.proxy("web"), "PodScheduled")["message"]
    )


async def test_a_proxy_pod_made_before_the_key_is_placed_without_a_mac(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    """An earlier release's webhook wrote no MAC: its pods, made before the key, still go."""
    later = ManifestKey(KEY.secret, created=time.time() + 3600)
    world = await make_world(manifest_key=later)
    await world.connect("c1", node("n-1"))
    legacy = proxied(elected("old"))
    del legacy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST_MAC]
    await world.submit(legacy, webhook=False)
    await world.reconcile("old")
    assert world.placed() == {"c1": [delegate_of(world, "old")]}


# -- the agent's own identity in a target ---------------------------------------------------------


async def test_a_target_where_the_delegate_would_run_as_the_agent_is_excluded(
    make_world: Callable[..., Awaitable[World]],
) -> None:
    world = await make_world()
    await world.connect("big", node("big-1", cpu="16"), identity=f"system:serviceaccount:{NS}:c1")
    await world.connect("small", node("small-1", cpu="1"))
    await world.submit(elected("web", cpu="2", service_account="web"))
    await world.reconcile("web")
    assert world.placed() == {"big": [delegate_of(world, "web")]}, "another account may go"
    await world.submit(elected("sneaky", cpu="2", service_account="c1"))
    await world.reconcile("sneaky")
    assert world.placed() == {"big": [delegate_of(world, "web")]}, "nothing for it"
    condition = await condition_seen(world, "sneaky")
    assert condition["message"] == (
        "0/2 targets are available: 1 Insufficient cpu, 1 target(s) rejected the delegate. "
        f"big: the delegate would run as the service account this cluster uses there ({NS}/c1)"
    )

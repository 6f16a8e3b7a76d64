"""The pod side of the virtual kubelet (:mod:`multicluster_scheduler.virtual_kubelet.pods`) and
how a proxy pod ends (:mod:`multicluster_scheduler.targets.release`), over in-memory API servers:
the source cluster and each target are :class:`~multicluster.testing.FakeCluster` s with real
informers, proxy pods are made by the webhook's mutation, delegates by the scheduler's rule, and
targets are attached as the targets controller attaches them. The three controllers of
:class:`PodSync` run; what a test checks is what the servers hold."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest

from multicluster import ClusterConfig, Request, Resource, Result, Unreachable
from multicluster.errors import ServerError
from multicluster.resources import EVENTS, PODS
from multicluster.testing import FakeCluster, FakeServer
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import (
    delegate_pod,
    source_manifest,
)
from multicluster_scheduler.scheduler.controller import proxy_informer
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import (
    TargetConnection,
    TargetRegistry,
)
from multicluster_scheduler.virtual_kubelet.pods import REFUSED_REASON, PodSync
from multicluster_scheduler.webhook.mutation import mutation_patch
from tests.webhook.json_patch import apply_patch
from tests.webhook.sealing import SEAL
from tests.worlds import attach

ME = "cluster-1"  # this cluster's name, on the delegates it makes
NS = "team-a"
SUMMARY = {
    "metadata": {"name": keys.CLUSTER_SUMMARY_NAME},
    "capacity": {"cpu": "8", "memory": "32Gi", "pods": "220"},
    "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "220"},
}
STARTED = "2026-01-01T00:00:05Z"
RUNNING: dict[str, Any] = {
    "phase": "Running",
    "conditions": [
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "True"},
        {"type": "ContainersReady", "status": "True"},
        {"type": "PodScheduled", "status": "True"},
    ],
    "containerStatuses": [
        {
            "name": "web",
            "image": "nginx",
            "ready": True,
            "restartCount": 0,
            "started": True,
            "state": {"running": {"startedAt": STARTED}},
        }
    ],
    "hostIP": "10.0.0.2",
    "podIP": "10.244.1.7",
    "startTime": STARTED,
}


# -- the world: a source cluster and its targets, in memory ---------------------------------


class Place(FakeCluster):
    """A target's cluster. Every FakeCluster has the same address, and two targets at one address
    are one place (they see the same pods): this one has its server's own address."""

    def __init__(self, name: str, server: FakeServer | None = None, address: str = "") -> None:
        super().__init__(name, server)
        self.config = ClusterConfig(address or f"https://{self.server.name}.invalid:6443", None)


def elected(name: str) -> dict:
    """A pod as its owner writes it, elected."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app": "web"},
            "annotations": {keys.ELECT: ""},
        },
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }


def named(server: FakeServer, name: str, resource: Resource = PODS) -> dict | None:
    return next((o for o in server.objects(resource) if o["metadata"]["name"] == name), None)


def events(server: FakeServer, reason: str) -> list[dict]:
    return [e for e in server.objects(EVENTS) if e.get("reason") == reason]


def deletes(server: FakeServer) -> list[str]:
    """The names the server was asked to delete, in order."""
    return [a.name or "" for a in server.writes if a.verb == "delete" and a.resource == PODS]


async def until(condition: Callable[[], object], timeout: float = 5.0, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"not in time: {what}"
        await asyncio.sleep(0.01)


async def settle() -> None:
    """Time for the controllers to act on what they were told, when nothing is to happen."""
    await asyncio.sleep(0.2)


class World:
    """The source cluster with the virtual kubelet's pod controllers, and its targets."""

    def __init__(self) -> None:
        self.local = FakeCluster("local")
        self.api = self.local.server
        self.client = self.local.client
        self.registry = TargetRegistry()
        self.lookup = DelegateLookup(self.registry, proxy_informer(self.local), ME)
        self.pods = PodSync(self.local, self.lookup, workers=4)
        self.places: list[FakeCluster] = []
        self.tasks: list[asyncio.Task] = []

    async def start(self, *, run: bool = True) -> None:
        self.local.start()
        assert await self.local.wait_synced(3)
        if run:
            self.tasks += [asyncio.create_task(c.run()) for c in self.pods.controllers]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(c.stop() for c in (*self.places, self.local)))

    async def connect(
        self, name: str, place: FakeCluster | None = None, *, synced: bool = True
    ) -> TargetConnection:
        """A Target of namespace NS, attached as the targets controller attaches one: its
        summary and delegates cached, the registry told, its node watched for pods that are not
        proxies (as the virtual kubelet does when a target is added); then Ready."""
        place = place or Place(name)
        self.places.append(place)
        connection = TargetConnection("Target", name, NS)
        await attach(self.registry, connection, place, synced=synced)
        assert connection.summaries is not None
        connection.summaries.add_handler(lambda *_: self.registry.changed(connection))
        self.pods.watch_node(connection.node_name)
        return connection

    async def proxy(self, name: str) -> dict:
        """An elected pod, created as the webhook mutates it."""
        pod = elected(name)
        return await self.client.create(PODS, apply_patch(pod, mutation_patch(pod, SEAL)), NS)

    async def place(self, proxy: dict, connection: TargetConnection, *, bind: bool = True) -> dict:
        """What the scheduler does: the delegate created in the target (where its scheduler puts
        it on a node), then the proxy pod bound to the target's virtual node."""
        target = there(connection).client
        delegate = await target.create(PODS, delegate_pod(proxy, source_manifest(proxy), ME), NS)
        name = delegate["metadata"]["name"]
        await target.create(PODS, binding(name, "node-1"), NS, subresource="binding", name=name)
        if bind:
            meta = proxy["metadata"]
            await self.client.create(
                PODS,
                binding(meta["name"], connection.node_name, meta["uid"]),
                NS,
                subresource="binding",
                name=meta["name"],
            )
        return await target.get(PODS, name, NS)

    async def run_delegate(
        self, connection: TargetConnection, delegate: dict, status: dict
    ) -> None:
        """The target's kubelet reports the delegate's status."""
        await there(connection).client.patch(
            PODS, delegate["metadata"]["name"], {"status": status}, NS, subresource="status"
        )

    def proxy_status(self, name: str) -> dict:
        return (named(self.api, name) or {}).get("status") or {}


def there(connection: TargetConnection) -> FakeCluster:
    """The target's cluster, in memory."""
    assert isinstance(connection.cluster, FakeCluster)
    return connection.cluster


def binding(name: str, node: str, uid: str | None = None) -> dict:
    meta = {"name": name, "namespace": NS, **({"uid": uid} if uid else {})}
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": {"name": node}}


async def finish(connection: TargetConnection, name: str) -> None:
    """The target's kubelet ends a pod being deleted (the last, immediate deletion)."""
    await there(connection).client.delete(PODS, name, NS, grace_period_seconds=0, missing_ok=True)


@pytest.fixture
async def world() -> AsyncGenerator[World, None]:
    made = World()
    try:
        yield made
    finally:
        await made.stop()


# -- status ---------------------------------------------------------------------------------


async def test_a_bound_proxy_shows_its_delegates_phase_conditions_and_container_statuses(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    status = world.proxy_status("web-1")
    for field in ("conditions", "containerStatuses", "podIP", "hostIP", "startTime"):
        assert status[field] == RUNNING[field], field
    # The container restarts there: the proxy pod says so too.
    restarted = [{**RUNNING["containerStatuses"][0], "restartCount": 1}]
    await world.run_delegate(c2, delegate, {"containerStatuses": restarted})
    await until(
        lambda: world.proxy_status("web-1")["containerStatuses"] == restarted, what="restart"
    )


async def test_a_target_changing_a_delegates_annotation_again_and_again_is_mirrored_later_and_later(
    world: World,
) -> None:
    """Whoever may annotate pods in the target's namespace changes an annotation of a real
    delegate 30 times in 0.6 s: each change made the proxy pod be written here (the whole pod,
    its saved manifest with it), at their pace. The first changes are mirrored at once, the next
    after 1 s, 2 s…; the last value arrives; the status is mirrored at once meanwhile."""
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    name = delegate["metadata"]["name"]
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")

    def annotation() -> str | None:
        return ((named(world.api, "web-1") or {})["metadata"].get("annotations") or {}).get("note")

    def writes() -> int:
        return sum(
            1
            for w in world.api.writes
            if w.verb == "patch" and w.name == "web-1" and w.subresource is None
        )

    before = writes()
    target = there(c2).client
    await target.patch(PODS, name, {"metadata": {"annotations": {"note": "0"}}}, NS)
    await until(lambda: annotation() == "0", what="the first change at once")
    for i in range(1, 30):
        await target.patch(PODS, name, {"metadata": {"annotations": {"note": str(i)}}}, NS)
        await asyncio.sleep(0.02)
    restarted = [{**RUNNING["containerStatuses"][0], "restartCount": 1}]
    await world.run_delegate(c2, delegate, {"containerStatuses": restarted})
    await until(
        lambda: world.proxy_status("web-1")["containerStatuses"] == restarted, what="status"
    )
    assert writes() - before <= 3, "not one write per change"
    await until(lambda: annotation() == "29", timeout=5.0, what="the last value")
    assert writes() - before <= 5


async def test_an_evicted_delegate_fails_its_proxy_pod_with_a_delegate_evicted_event(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    evicted = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
        "containerStatuses": None,
    }
    await world.run_delegate(c2, delegate, evicted)
    await until(lambda: events(world.api, "DelegateEvicted"), what="a DelegateEvicted event")
    status = world.proxy_status("web-1")
    assert (status["phase"], status["reason"]) == ("Failed", "Evicted")
    (event,) = events(world.api, "DelegateEvicted")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "web-1"
    assert "c2" in event["message"]
    assert "low on resource: memory" in event["message"]


# -- how a proxy pod ends -------------------------------------------------------------------


async def test_a_delegate_deleted_in_its_target_deletes_its_proxy_pod_with_delegate_lost(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    await finish(c2, delegate["metadata"]["name"])  # deleted there: a drain, by hand
    await until(lambda: named(world.api, "web-1") is None, what="the proxy pod gone")
    (event,) = events(world.api, "DelegateLost")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "web-1"
    assert "was deleted outside" in event["message"]


async def test_a_deleted_proxy_pod_keeps_its_finalizer_until_its_delegate_is_gone(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    name = delegate["metadata"]["name"]
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    await world.client.delete(PODS, "web-1", NS)  # its owner scales down
    target = there(c2).server
    await until(
        lambda: (named(target, name) or {}).get("metadata", {}).get("deletionTimestamp"),
        what="the delegate deleted first",
    )
    await settle()  # it takes its time to end there (a grace period)
    left = named(world.api, "web-1")
    assert left is not None, "the proxy pod waits for its delegate"
    assert keys.FINALIZER in left["metadata"]["finalizers"]
    await finish(c2, name)
    await until(lambda: named(world.api, "web-1") is None, what="the proxy pod gone")
    assert deletes(target) == [name, name]  # ours, then the kubelet's


async def running_job_pod(world: World, target) -> dict:
    """Proxy pod ``work-1``, held as the Job controller holds its pods (a finalizer of its own),
    Running through its delegate in ``target``; that delegate."""
    pod = elected("work-1")
    pod["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    proxy = await world.client.create(PODS, apply_patch(pod, mutation_patch(pod, SEAL)), NS)
    delegate = await world.place(proxy, target)
    await world.run_delegate(target, delegate, RUNNING)
    await until(lambda: world.proxy_status("work-1").get("phase") == "Running", what="Running")
    return delegate


async def test_a_deleted_proxy_pod_that_others_hold_ends_failed_when_its_delegate_is_gone(
    world: World,
) -> None:
    """The Job controller holds its pods with a finalizer of its own until it sees them end
    (with a pod failure policy, it waits for the Failed phase): a deleted proxy pod ends as a
    pod its kubelet stopped, once its delegate is gone and before our finalizer goes."""
    await world.start()
    c2 = await world.connect("c2")
    delegate = await running_job_pod(world, c2)
    name = delegate["metadata"]["name"]
    await world.client.delete(PODS, "work-1", NS)  # evicted, say
    await until(
        lambda: (named(there(c2).server, name) or {}).get("metadata", {}).get("deletionTimestamp"),
        what="the delegate deleted first",
    )
    await settle()
    assert world.proxy_status("work-1")["phase"] == "Running", "its delegate still ends there"
    await finish(c2, name)

    def ours_gone() -> bool:
        return keys.FINALIZER not in (named(world.api, "work-1") or {})["metadata"]["finalizers"]

    await until(ours_gone, what="our finalizer removed")
    left = named(world.api, "work-1")
    assert left is not None
    assert left["metadata"]["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    assert left["status"]["phase"] == "Failed"
    conditions = {c["type"]: c["status"] for c in left["status"]["conditions"]}
    assert conditions == {
        "Initialized": "True",
        "Ready": "False",
        "ContainersReady": "False",
        "PodScheduled": "True",
    }


async def test_a_deleted_proxy_pod_that_nobody_else_holds_goes_without_a_status_write(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    written = len(world.api.writes)
    await world.client.delete(PODS, "web-1", NS)
    await finish(c2, delegate["metadata"]["name"])
    await until(lambda: named(world.api, "web-1") is None, what="the proxy pod gone")
    assert not [a for a in world.api.writes[written:] if a.subresource == "status"]


async def test_the_finalizer_stays_until_the_targets_cache_is_synced(world: World) -> None:
    """A delegate the target's cache has not listed yet is not taken for none."""
    await world.start(run=False)
    place = Place("c2")
    broken = place.server.fail_next("list", PODS, ServerError("etcd timeout", status=500), None)
    c2 = await world.connect("c2", place, synced=False)
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await world.client.delete(PODS, "web-1", NS)
    pods = world.pods.proxies_controller.reconciler
    request = Request("local", NS, "web-1")
    cached = world.pods.proxies
    await until(lambda: (cached.get("web-1", NS) or {})["metadata"].get("deletionTimestamp"))
    assert await pods.reconcile(request) == Result(requeue_after=5.0)
    assert keys.FINALIZER in (named(world.api, "web-1") or {})["metadata"]["finalizers"]
    assert deletes(place.server) == []
    place.server.remove_reactor(broken)  # the target answers again
    assert c2.delegates is not None
    assert await c2.delegates.wait_synced(5)
    await pods.reconcile(request)  # its delegate is deleted first, now that it is seen
    assert deletes(place.server) == [delegate["metadata"]["name"]]
    assert keys.FINALIZER in (named(world.api, "web-1") or {})["metadata"]["finalizers"]
    await finish(c2, delegate["metadata"]["name"])
    await until(lambda: not c2.delegates_of(proxy["metadata"]["uid"]))
    assert await pods.reconcile(request) is None
    assert named(world.api, "web-1") is None


# -- delegates that should not be there -----------------------------------------------------


@pytest.mark.parametrize(
    "same_address",
    [pytest.param(True, id="same address"), pytest.param(False, id="same summary")],
)
async def test_a_duplicate_in_another_cluster_is_deleted_one_in_the_same_cluster_is_not(
    world: World, same_address: bool
) -> None:
    """Two Targets of one cluster (the same address, or the same ClusterSummary behind two
    addresses) see the same delegate: it is no duplicate of itself."""
    await world.start()
    c2 = await world.connect("c2")
    home = there(c2).server
    address = "" if same_address else "https://c2-by-another-name.invalid:6443"
    await world.connect("c2-bis", Place("c2-bis", home, address))
    c3 = await world.connect("c3")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    name = delegate["metadata"]["name"]
    await world.run_delegate(c2, delegate, RUNNING)
    # A second delegate, in another cluster (an agent restarted while placing it, say).
    await there(c3).client.create(PODS, delegate_pod(proxy, source_manifest(proxy), ME), NS)
    await until(lambda: named(there(c3).server, name) is None, what="the duplicate deleted")
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="mirrored")
    await settle()
    assert named(home, name) is not None
    assert deletes(home) == []


def lookalike(proxy: dict, *, name: str = "", **annotations: str | None) -> dict:
    """A pod with a delegate's labels that this cluster would not have made as it is."""
    pod = delegate_pod(proxy, source_manifest(proxy), ME)
    if name:
        pod["metadata"]["name"] = name
    for key, value in annotations.items():
        if value is None:
            del pod["metadata"]["annotations"][key]
        else:
            pod["metadata"]["annotations"][key] = value
    return pod


async def test_a_delegate_whose_proxy_pod_is_gone_is_deleted_and_a_lookalike_is_not(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    target = there(c2).server
    gone = {**elected("gone"), "metadata": {**elected("gone")["metadata"], "uid": "uid-gone"}}
    gone["metadata"]["annotations"] = {keys.SOURCEPOD_MANIFEST: '{"spec": {"containers": [{}]}}'}
    orphan = delegate_pod(gone, source_manifest(gone), ME)
    others = {
        "renamed": lookalike(gone, name="someone-elses"),
        "no parent name": lookalike(gone, name="x-1", **{keys.PARENT_NAME: None}),
        "another source": lookalike(gone, name="x-2", **{keys.PARENT_CLUSTER_NAME: "cluster-2"}),
        "another namespace": lookalike(gone, name="x-3", **{keys.PARENT_NAMESPACE: "team-b"}),
    }
    target.add(PODS, *others.values(), orphan)
    await until(lambda: named(target, orphan["metadata"]["name"]) is None, what="orphan deleted")
    orphans = world.pods.orphans_controller.reconciler
    for why, pod in others.items():
        request = Request(c2.node_name, NS, pod["metadata"]["name"])
        assert await orphans.reconcile(request) is None, why
    assert deletes(target) == [orphan["metadata"]["name"]]
    assert len(target.objects(PODS)) == len(others)


async def test_a_proxy_pod_gone_without_its_finalizer_leaves_no_delegate(world: World) -> None:
    """Whoever removes our finalizer and deletes a proxy pod orphans its delegate: the delegate
    sends no event, yet is deleted."""
    await world.start()
    c2 = await world.connect("c2")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    name = delegate["metadata"]["name"]
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    unstuck = [{"op": "remove", "path": "/metadata/finalizers"}]
    await world.client.patch(PODS, "web-1", unstuck, NS, patch_type="json")
    await world.client.delete(PODS, "web-1", NS, grace_period_seconds=0)
    await until(lambda: deletes(there(c2).server) == [name], what="the delegate deleted")


# -- pods that are not proxies --------------------------------------------------------------


async def test_a_pod_that_is_no_proxy_on_a_virtual_node_is_refused_once(world: World) -> None:
    await world.start()
    c2 = await world.connect("c2")
    daemon: dict[str, Any] = {
        "metadata": {"name": "agent-x", "namespace": NS, "labels": {"app": "agent"}},
        "spec": {"nodeName": c2.node_name, "containers": [{"name": "agent", "image": "a"}]},
    }
    elsewhere = {**daemon, "metadata": {"name": "agent-y", "namespace": NS}}
    elsewhere["spec"] = {**daemon["spec"], "nodeName": "node-1"}
    world.api.add(PODS, elsewhere, daemon)
    await until(lambda: world.proxy_status("agent-x").get("phase") == "Failed", what="refused")
    status = world.proxy_status("agent-x")
    assert status["reason"] == REFUSED_REASON
    assert c2.node_name in status["message"]
    await until(lambda: events(world.api, REFUSED_REASON), what="an event")
    (event,) = events(world.api, REFUSED_REASON)
    assert (event["type"], event["involvedObject"]["name"]) == ("Warning", "agent-x")
    # Once: a change of the pod, or another pass, writes nothing more.
    await world.client.patch(PODS, "agent-x", {"metadata": {"labels": {"x": "y"}}}, NS)
    seen = world.pods.foreign[c2.node_name].informer
    await until(lambda: "x" in (seen.get("agent-x", NS) or {}).get("metadata", {})["labels"])
    refusals = world.pods.foreign_controller.reconciler
    assert await refusals.reconcile(Request(c2.node_name, NS, "agent-x")) is None
    await settle()
    status_writes = [
        a for a in world.api.writes if a.subresource == "status" and a.resource == PODS
    ]
    assert [a.name for a in status_writes] == ["agent-x"]
    assert world.proxy_status("agent-y") == {}, "a pod of a real node is none of ours"


# -- a target away, a target removed --------------------------------------------------------


async def test_a_target_not_ready_past_its_failover_setting_releases_its_proxy_pods(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    c2.failover_after = 0.3  # spec.failoverAfterSeconds, as the targets controller reads it
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    c2.set_ready(False, "SummaryMissing", "the target has no ClusterSummary")
    world.registry.changed(c2)
    await settle()
    assert named(world.api, "web-1") is not None, "not before its time"
    await until(lambda: named(world.api, "web-1") is None, what="the proxy pod released")
    (event,) = events(world.api, "TargetFailover")
    assert event["involvedObject"]["name"] == "web-1"
    assert "SummaryMissing" in event["message"]
    # Reachable, the target had its delegate deleted at once.
    assert set(deletes(there(c2).server)) == {delegate["metadata"]["name"]}


async def test_a_released_proxy_pod_that_others_hold_ends_failed(world: World) -> None:
    """A Job's pod (the Job controller's finalizer) on a target away past its failover: the Job
    judges and replaces it once it has failed."""
    await world.start()
    c2 = await world.connect("c2")
    c2.failover_after = 0.2
    await running_job_pod(world, c2)
    c2.set_ready(False, "SummaryMissing", "the target has no ClusterSummary")
    world.registry.changed(c2)

    def released() -> bool:
        left = named(world.api, "work-1") or {}
        return keys.FINALIZER not in (left.get("metadata") or {}).get(
            "finalizers", [keys.FINALIZER]
        )

    await until(released, what="the proxy pod released")
    left = named(world.api, "work-1")
    assert left is not None
    assert left["metadata"]["deletionTimestamp"]
    assert left["metadata"]["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    assert left["status"]["phase"] == "Failed"
    assert {c["type"]: c["status"] for c in left["status"]["conditions"]}["Ready"] == "False"


async def test_a_target_unreachable_past_its_failover_has_its_delegate_deleted_when_back(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    target = there(c2).server
    c2.failover_after = 0.2
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    name = delegate["metadata"]["name"]
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: world.proxy_status("web-1").get("phase") == "Running", what="Running")
    away = target.fail_next("*", None, Unreachable("connection refused"), None)
    target.drop_watches()
    await until(lambda: not c2.delegates_synced, what="the target's cache broken")
    c2.set_ready(False, "Unreachable", "connection refused")
    world.registry.changed(c2)
    await until(lambda: named(world.api, "web-1") is None, what="the proxy pod released")
    assert events(world.api, "TargetFailover")
    assert named(target, name) is not None, "left there while away"
    target.remove_reactor(away)

    def back() -> bool:
        # A watch cut short stays an error until something comes through it: a real server
        # sends a bookmark every minute or so, the fake one when told.
        target.bookmark()
        return c2.delegates_synced

    await until(back, what="the target's cache back")
    c2.set_ready(True, "Ready", "the target's ClusterSummary is current")
    world.registry.changed(c2)
    # At once: not when the orphan's retry comes round (RECHECK, 5 s).
    await until(lambda: name in deletes(target), timeout=2.5, what="the delegate deleted when back")


async def removed(world: World, connection: TargetConnection) -> None:
    """The target is deleted: the registry's removal, with the pods released (as the virtual
    kubelet releases them)."""
    world.registry.on_removed(world.pods.release)
    await asyncio.wait_for(world.registry.remove(connection.node_name), 10)


async def test_a_removed_target_has_its_delegates_deleted_and_its_proxy_pods_let_go(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    assert c2.delegates is not None
    target = there(c2).server
    placed = [await world.place(await world.proxy(f"web-{i}"), c2) for i in range(2)]
    await until(lambda: len(c2.delegates.list()) == 2)  # type: ignore[union-attr]
    # Its cache is behind: the last delegate created (the scheduler's, for a pod it is placing
    # there now) is not in it.
    await c2.delegates.stop()
    late = await world.place(await world.proxy("web-2"), c2, bind=False)
    stranger = lookalike(await world.proxy("web-3"), name="not-ours")
    target.add(PODS, stranger)
    await until(lambda: len(world.pods.proxies.list()) == 4, what="the proxy pods cached")
    await removed(world, c2)
    expected = sorted(d["metadata"]["name"] for d in (*placed, late))
    assert sorted(deletes(target)) == expected
    left = [p["metadata"]["name"] for p in world.api.objects(PODS)]
    assert left == ["web-2", "web-3"], "those bound to its node are let go"
    assert named(target, "not-ours") is not None


async def test_a_removed_target_whose_list_fails_is_released_from_its_cache(
    world: World,
) -> None:
    await world.start()
    c2 = await world.connect("c2")
    assert c2.delegates is not None
    target = there(c2).server
    cached = await world.place(await world.proxy("web-0"), c2)
    await until(lambda: c2.delegates.list())  # type: ignore[union-attr]
    await c2.delegates.stop()
    late = await world.place(await world.proxy("web-1"), c2, bind=False)
    target.fail_next("list", PODS, Unreachable("connection reset"), None)
    await until(lambda: len(world.pods.proxies.list()) == 2, what="the proxy pods cached")
    await removed(world, c2)
    assert deletes(target) == [cached["metadata"]["name"]]
    assert named(target, late["metadata"]["name"]) is not None
    left = [p["metadata"]["name"] for p in world.api.objects(PODS)]
    assert left == ["web-1"], "the proxy pod bound there let go all the same"

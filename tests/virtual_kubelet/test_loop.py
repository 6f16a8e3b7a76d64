"""Virtual nodes (:mod:`multicluster_scheduler.virtual_kubelet.loop` and ``node``), over
in-memory API servers: a target added gets its node (labels, taint, capacity from its summary)
and a Lease kept renewed, the node's readiness follows the target's, a target removed has its
proxy pods released and its node deleted, and the sweep removes the nodes of targets that went
while no agent led, never another installation's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from multicluster.resources import LEASES, NODES, PODS
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.naming import virtual_node_name
from multicluster_scheduler.api.resources import CLUSTER_SUMMARIES
from multicluster_scheduler.api.summary import slim_node
from multicluster_scheduler.summary.compute import summarize
from multicluster_scheduler.targets.registry import TargetConnection
from multicluster_scheduler.virtual_kubelet.loop import (
    CLUSTER_ROLES,
    LEASE_NAMESPACE,
    NodeLoop,
    NodeSettings,
    VirtualKubelet,
    release_owner,
)
from tests.virtual_kubelet.test_pods import (
    NS,
    RUNNING,
    Place,
    World,
    binding,
    deletes,
    named,
    there,
    until,
)

RELEASE = "multicluster-scheduler"
ADDRESS = "10.1.2.3"
PORT = 10250
REGION = "topology.kubernetes.io/region"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def real_node(name: str, region: str = "eu", cpu: str = "4") -> dict:
    """A node of the target, as its kubelet reports it."""
    return {
        "metadata": {
            "name": name,
            "labels": {
                REGION: region,
                "kubernetes.io/hostname": name,
                CONTROL_PLANE: "",  # every node: still no label a summary may set
                "example.com/pool": "general",
            },
        },
        "status": {
            "capacity": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"},
        },
    }


def summary_of(*nodes: dict) -> dict:
    """The target's ClusterSummary, as its summary controller computes it."""
    return {"metadata": {"name": keys.CLUSTER_SUMMARY_NAME}, **summarize(list(nodes), [])}


class Kubelets(World):
    """The source cluster with its virtual kubelet: a node loop per target."""

    def __init__(self) -> None:
        super().__init__()
        (role,) = self.api.add(CLUSTER_ROLES, {"metadata": {"name": RELEASE}})
        self.role_uid = role["metadata"]["uid"]
        self.kubelet: VirtualKubelet | None = None

    async def start(self, *, run: bool = False) -> None:
        await super().start(run=run)
        owner = await release_owner(self.client, RELEASE)
        settings = NodeSettings(ADDRESS, PORT, owner)
        nodes = self.local.informer(NODES, transform=slim_node)
        self.kubelet = VirtualKubelet(
            self.client, self.registry, settings, pods=self.pods, nodes=nodes
        )

    async def stop(self) -> None:
        if self.kubelet is not None:
            await self.kubelet.stop()
        await super().stop()

    def node(self, connection: TargetConnection) -> dict | None:
        return named(self.api, connection.node_name, NODES)

    def ready(self, connection: TargetConnection) -> dict:
        status = (self.node(connection) or {}).get("status") or {}
        return next((c for c in status.get("conditions") or () if c["type"] == "Ready"), {})


@pytest.fixture
async def world() -> AsyncGenerator[Kubelets, None]:
    made = Kubelets()
    try:
        await made.start()
        yield made
    finally:
        await made.stop()


async def target(world: Kubelets, name: str, *nodes: dict) -> TargetConnection:
    place = Place(name)
    place.server.add(CLUSTER_SUMMARIES, summary_of(*nodes))
    return await world.connect(name, place)


async def test_a_target_added_gets_a_virtual_node_that_says_what_it_offers(
    world: Kubelets,
) -> None:
    c2 = await target(world, "c2", real_node("n1", cpu="4"), real_node("n2", cpu="8"))
    await until(lambda: world.ready(c2).get("status") == "True", what="a Ready node")
    node = world.node(c2)
    assert node is not None
    assert node["metadata"]["labels"] == {
        "type": "virtual-kubelet",
        "kubernetes.io/role": "cluster",
        "node.kubernetes.io/exclude-from-external-load-balancers": "",
        keys.PROVIDER_KEY: keys.PROVIDER,
        "kubernetes.io/hostname": c2.node_name,
        keys.TARGET_NAMESPACE_LABEL: NS,
        keys.TARGET_NAME_LABEL: "c2",
        REGION: "eu",  # what all its nodes share
        "example.com/pool": "general",
    }, "no reserved label of the summary (control-plane), no label of one node (hostname)"
    assert node["spec"]["taints"] == [
        {"key": keys.PROVIDER_KEY, "value": keys.PROVIDER, "effect": "NoSchedule"}
    ]
    assert node["metadata"]["ownerReferences"] == [
        {
            "apiVersion": CLUSTER_ROLES.api_version,
            "kind": "ClusterRole",
            "name": RELEASE,
            "uid": world.role_uid,
        }
    ]
    status = node["status"]
    assert status["capacity"] == {"cpu": "12", "memory": "32Gi", "pods": "220"}
    assert status["allocatable"] == status["capacity"]
    assert status["addresses"] == [{"type": "InternalIP", "address": ADDRESS}]
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": PORT}}
    assert world.ready(c2)["reason"] == "TargetReady"
    lease = named(world.api, c2.node_name, LEASES)
    assert lease is not None
    assert lease["metadata"]["namespace"] == LEASE_NAMESPACE
    assert lease["spec"]["holderIdentity"] == c2.node_name
    (owner,) = lease["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("Node", node["metadata"]["uid"])


async def test_the_node_follows_its_targets_summary(world: Kubelets) -> None:
    c2 = await target(world, "c2", real_node("n1", "eu"))
    await until(lambda: (world.node(c2) or {}).get("metadata", {}).get("labels", {}).get(REGION))
    # The target's nodes move to another region and grow: its summary says so.
    changed = summary_of(real_node("n1", "us", cpu="16"))
    summary = named(there(c2).server, keys.CLUSTER_SUMMARY_NAME, CLUSTER_SUMMARIES)
    assert summary is not None
    await there(c2).client.update(
        CLUSTER_SUMMARIES, {**summary, **changed, "metadata": summary["metadata"]}
    )

    def moved() -> bool:
        node = world.node(c2) or {}
        labels = node.get("metadata", {}).get("labels", {})
        return labels.get(REGION) == "us" and node["status"]["capacity"].get("cpu") == "16"

    await until(moved, what="the node's labels and capacity updated")


async def test_the_node_is_ready_as_its_target_is(world: Kubelets) -> None:
    c2 = await target(world, "c2", real_node("n1"))
    await until(lambda: world.ready(c2).get("status") == "True", what="Ready")
    c2.set_ready(False, "Unreachable", "dial tcp 10.0.0.2:6443: connection refused")
    world.registry.changed(c2)
    await until(lambda: world.ready(c2).get("status") == "False", what="NotReady")
    condition = world.ready(c2)
    assert condition["reason"] == "TargetUnreachable"
    assert condition["message"] == "dial tcp 10.0.0.2:6443: connection refused"
    c2.set_ready(True, "Ready", "the target's ClusterSummary is current")
    world.registry.changed(c2)
    await until(lambda: world.ready(c2).get("status") == "True", what="Ready again")
    assert world.ready(c2)["reason"] == "TargetReady"


class Loop:
    """A node loop of its own, with short intervals."""

    def __init__(
        self, world: Kubelets, lease_interval: float, status_interval: float = 60.0
    ) -> None:
        self.world = world
        self.connection = TargetConnection("Target", "c9", NS)
        self.name = self.connection.node_name
        loop = NodeLoop(
            world.client,
            self.connection,
            NodeSettings(ADDRESS, PORT),
            nodes=world.local.informer(NODES, transform=slim_node),
            lease_interval=lease_interval,
            status_interval=status_interval,
        )
        self.task = asyncio.create_task(loop.run())

    def node(self) -> dict | None:
        return named(self.world.api, self.name, NODES)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_the_lease_is_renewed_unasked(world: Kubelets) -> None:
    loop = Loop(world, lease_interval=0.05)
    try:
        renewals: set[str] = set()

        def renewed(times: int) -> bool:
            lease = named(world.api, loop.name, LEASES)
            if lease is not None:
                renewals.add(lease["spec"]["renewTime"])
            return len(renewals) >= times

        await until(lambda: renewed(4), what="the lease renewed, unasked")
    finally:
        await loop.stop()


async def test_a_change_of_the_target_renews_no_lease_that_is_not_due(world: Kubelets) -> None:
    """With dozens of Targets reaching one cluster, each change of its summary would otherwise
    be a Lease write per Target."""
    loop = Loop(world, lease_interval=30.0)
    try:
        await until(lambda: named(world.api, loop.name, LEASES) is not None, what="a Lease")
        first = named(world.api, loop.name, LEASES)
        assert first is not None
        for _ in range(10):
            loop.connection.changed.set()
            await asyncio.sleep(0.02)
        lease = named(world.api, loop.name, LEASES)
        assert lease is not None
        assert lease["spec"]["renewTime"] == first["spec"]["renewTime"]
        assert lease["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    finally:
        await loop.stop()


@pytest.mark.parametrize(
    "status_interval",
    [
        pytest.param(0.2, id="at its next status write"),
        pytest.param(60.0, id="from the cache of nodes, long before a status write"),
    ],
)
async def test_a_node_deleted_behind_its_back_comes_back(
    world: Kubelets, status_interval: float
) -> None:
    loop = Loop(world, lease_interval=0.05, status_interval=status_interval)
    try:
        await until(loop.node, what="the node")
        first = loop.node()
        assert first is not None
        await world.client.delete(NODES, loop.name)
        await until(loop.node, timeout=2, what="the node created again")
        again = loop.node()
        assert again is not None
        assert again["metadata"]["uid"] != first["metadata"]["uid"]
    finally:
        await loop.stop()


async def test_a_target_removed_has_its_proxy_pods_released_and_its_node_deleted(
    world: Kubelets,
) -> None:
    c2 = await target(world, "c2", real_node("n1"))
    await until(lambda: world.node(c2), what="the node")
    proxy = await world.proxy("web-1")
    delegate = await world.place(proxy, c2)
    await world.run_delegate(c2, delegate, RUNNING)
    await until(lambda: len(world.pods.proxies.list()) == 1, what="the proxy pod cached")
    await asyncio.wait_for(world.registry.remove(c2.node_name), 10)
    assert world.node(c2) is None
    assert named(world.api, "web-1") is None, "its proxy pod let go"
    assert deletes(there(c2).server) == [delegate["metadata"]["name"]]
    assert c2.node_name not in world.pods.foreign, "its pods are no longer watched"
    # Its node loop is over: nothing writes the node again.
    world.registry.changed(c2)
    await asyncio.sleep(0.1)
    assert world.node(c2) is None


def virtual_node(name: str, owner_uid: str | None) -> dict:
    owners = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "name": RELEASE, "uid": owner_uid}] if owner_uid else []  # fmt: skip
    return {
        "metadata": {
            "name": name,
            "labels": {keys.PROVIDER_KEY: keys.PROVIDER},
            "ownerReferences": owners,
        }
    }


async def test_the_sweep_deletes_our_nodes_of_targets_gone_and_leaves_others(
    world: Kubelets,
) -> None:
    assert world.kubelet is not None
    c2 = await target(world, "c2", real_node("n1"))
    await until(lambda: world.node(c2), what="the node of a target there is")
    gone = virtual_node_name("gone", NS)
    theirs = virtual_node_name("theirs", NS)
    orphaned = virtual_node_name("orphaned", NS)
    world.api.add(
        NODES,
        virtual_node(gone, world.role_uid),  # ours, its Target deleted while nobody led
        virtual_node(theirs, "uid-of-another-installation"),
        virtual_node(orphaned, None),  # no owner: not known to be ours
    )
    proxy = await world.proxy("web-1")
    meta = proxy["metadata"]
    await world.client.create(
        PODS, binding("web-1", gone, meta["uid"]), NS, subresource="binding", name="web-1"
    )
    await until(lambda: len(world.pods.proxies.list()) == 1, what="the proxy pod cached")
    world.registry.target_nodes = lambda: {c2.node_name}  # as the Targets are listed
    await asyncio.wait_for(world.kubelet.sweep(), 5)
    nodes = {n["metadata"]["name"] for n in world.api.objects(NODES)}
    assert nodes == {c2.node_name, theirs, orphaned}
    assert named(world.api, "web-1") is None, "the proxy pod of a node swept is let go"


async def test_without_the_releases_cluster_role_nodes_have_no_owner_and_none_is_swept(
    world: Kubelets,
) -> None:
    await world.client.delete(CLUSTER_ROLES, RELEASE)
    assert await release_owner(world.client, RELEASE) is None
    kubelet = VirtualKubelet(world.client, world.registry, NodeSettings(ADDRESS, PORT))
    stale: dict[str, Any] = virtual_node(virtual_node_name("gone", NS), world.role_uid)
    world.api.add(NODES, stale)
    world.registry.target_nodes = set
    await asyncio.wait_for(kubelet.sweep(), 5)
    assert [n["metadata"]["name"] for n in world.api.objects(NODES)] == [stale["metadata"]["name"]]

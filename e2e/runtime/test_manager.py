"""Controllers and the Manager across real clusters: retries, dedup, unreachable clusters,
clusters added and removed at run time, leader failover."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter

import aiohttp
import pytest

from multicluster import (
    Cluster,
    ClusterConfig,
    Controller,
    Func,
    LeaderElectionConfig,
    Manager,
    Request,
    Result,
)
from multicluster.resources import CONFIGMAPS
from testbed import TestBed
from testbed.netproxy import TcpProxy


def configmap(name: str, namespace: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"n": "0"},
    }


async def eventually(check, timeout: float = 20.0, interval: float = 0.05):
    async with asyncio.timeout(timeout):
        while not (value := check()):
            await asyncio.sleep(interval)
        return value


@contextlib.asynccontextmanager
async def running(manager: Manager):
    task = asyncio.create_task(manager.run())
    try:
        yield task
    finally:
        manager.stop()
        await asyncio.wait_for(task, 20)


async def test_failures_back_off_and_events_on_one_object_collapse(connect, namespace: str):
    cluster = connect("cluster1")
    calls: Counter[str] = Counter()
    times: list[float] = []
    active: set[Request] = set()
    overlaps = 0

    async def reconcile(request: Request) -> Result | None:
        nonlocal overlaps
        if request.namespace != namespace:
            return None
        if request in active:
            overlaps += 1
        active.add(request)
        try:
            calls[request.name] += 1
            if request.name == "flaky":
                times.append(time.monotonic())
                if calls["flaky"] <= 4:
                    raise RuntimeError("not yet")
            await asyncio.sleep(0.01)
        finally:
            active.discard(request)
        return None

    controller = Controller("flaky", Func(reconcile), workers=4)
    controller.queue.base_delay = 0.05
    controller.watch(cluster, CONFIGMAPS, namespace=namespace)
    manager = Manager()
    manager.add_cluster(cluster)
    manager.add_controller(controller)
    async with running(manager):
        client = cluster.client
        await client.create(CONFIGMAPS, configmap("flaky", namespace))
        await eventually(lambda: calls["flaky"] == 5)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        for expected, gap in zip([0.05, 0.1, 0.2, 0.4], gaps, strict=True):
            assert expected * 0.8 <= gap < expected + 0.25, gaps

        await client.create(CONFIGMAPS, configmap("busy", namespace))
        for n in range(30):
            await client.patch(CONFIGMAPS, "busy", {"data": {"n": str(n)}}, namespace)
        await eventually(
            lambda: controller.informers[0].get("busy", namespace)["data"]["n"] == "29"
        )
        await asyncio.sleep(0.3)
        assert 1 <= calls["busy"] < 31, "31 events, fewer reconciles"
        assert overlaps == 0
        assert len(controller.queue) == 0


async def test_an_unreachable_cluster_never_holds_back_the_others(
    testbed: TestBed, connect, namespace: str
):
    proxy = TcpProxy(testbed["cluster2"].apiserver_port)
    reachable = connect("cluster1")
    # cluster2 through a proxy that is not listening yet: unreachable at start.
    config = ClusterConfig.from_kubeconfig(str(testbed.kubeconfig), "cluster2")
    config.server = f"https://127.0.0.1:{proxy.port}"
    late = Cluster("cluster2", config)
    seen: set[Request] = set()

    async def reconcile(request: Request) -> None:
        if request.namespace == namespace:
            seen.add(request)

    controller = Controller("both", Func(reconcile))
    for cluster in (reachable, late):
        controller.watch(cluster, CONFIGMAPS, namespace=namespace)
    manager = Manager(sync_timeout=2, health_port=0, health_host="127.0.0.1")
    manager.add_cluster(reachable)
    manager.add_cluster(late)
    manager.add_controller(controller)
    started = time.monotonic()
    try:
        async with running(manager):
            await reachable.client.create(CONFIGMAPS, configmap("one", namespace))
            await eventually(lambda: Request("cluster1", namespace, "one") in seen)
            assert time.monotonic() - started < 10
            assert not late.has_synced
            assert late.last_error() is not None
            host, port = manager.health_address  # clusters given at start gate readiness
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://{host}:{port}/readyz") as resp,
            ):
                assert (resp.status, await resp.text()) == (503, "caches not synced: cluster2")

            await proxy.start()
            await eventually(lambda: late.has_synced, timeout=60)
            writer = connect("cluster2", "cluster2-writer").client
            await writer.create(CONFIGMAPS, configmap("two", namespace))
            await eventually(lambda: Request("cluster2", namespace, "two") in seen)
    finally:
        await late.stop()
        await proxy.stop()


async def test_clusters_added_and_removed_while_running(testbed: TestBed, connect, namespace: str):
    first = connect("cluster1")
    seen: list[Request] = []

    async def reconcile(request: Request) -> None:
        if request.namespace == namespace:
            seen.append(request)

    controller = Controller("dynamic", Func(reconcile))
    controller.watch(first, CONFIGMAPS, namespace=namespace)
    manager = Manager(sync_timeout=5, health_port=0, health_host="127.0.0.1")
    manager.add_cluster(first)
    manager.add_controller(controller)
    async with running(manager):
        await eventually(lambda: manager.health_address)
        second = connect("cluster2")
        writer = connect("cluster2", "cluster2-writer")
        manager.add_cluster(second)
        controller.watch(second, CONFIGMAPS, namespace=namespace)
        await writer.client.create(CONFIGMAPS, configmap("added", namespace))
        await eventually(lambda: Request("cluster2", namespace, "added") in seen)

        # A cluster added at run time that cannot be reached does not make the process unready
        # (an unreachable target must not take the webhook out of its Service).
        dead = ClusterConfig.from_kubeconfig(str(testbed.kubeconfig), "cluster2")
        dead.server = "https://127.0.0.1:9"
        unreachable = Cluster("unreachable", dead)
        manager.add_cluster(unreachable)
        host, port = manager.health_address
        serving = False
        manager.add_readiness_check(lambda: None if serving else "the webhook is not serving yet")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://{host}:{port}/readyz") as resp:
                assert (resp.status, await resp.text()) == (503, "the webhook is not serving yet")
            serving = True
            async with http.get(f"http://{host}:{port}/readyz") as resp:
                assert (resp.status, await resp.text()) == (200, "ok")
            await manager.remove_cluster("unreachable")
            async with http.get(f"http://{host}:{port}/metrics") as resp:
                text = await resp.text()
                assert 'controller_runtime_reconcile_total{controller="dynamic"' in text
                assert 'workqueue_depth{name="dynamic"}' in text

        await manager.remove_cluster("cluster2")
        assert "cluster2" not in manager.clusters
        assert controller.clusters() == ["cluster1"]
        before = len(seen)
        await writer.client.create(CONFIGMAPS, configmap("after-removal", namespace))
        await first.client.create(CONFIGMAPS, configmap("still-watched", namespace))
        await eventually(lambda: Request("cluster1", namespace, "still-watched") in seen)
        assert Request("cluster2", namespace, "after-removal") not in seen[before:]


@pytest.mark.parametrize("crash", [True, False], ids=["crash", "graceful"])
async def test_leader_failover(connect, namespace: str, crash: bool):
    """Two managers share a Lease; only the leader reconciles. When the leader dies, the other
    takes over once the lease expires (15 s); on a graceful stop, at once."""
    reconciled: dict[str, set[str]] = {"a": set(), "b": set()}
    managers: dict[str, Manager] = {}
    tasks: dict[str, asyncio.Task] = {}
    for identity in ("a", "b"):
        cluster = connect("cluster1", f"cluster1-{identity}")

        async def reconcile(request: Request, identity: str = identity) -> None:
            if request.namespace == namespace:
                reconciled[identity].add(request.name)

        controller = Controller("elected", Func(reconcile))
        controller.watch(cluster, CONFIGMAPS, namespace=namespace)
        election = LeaderElectionConfig(
            namespace=namespace, name="elected", identity=identity, release_on_cancel=not crash
        )
        manager = Manager(leader_election=election)
        manager.add_cluster(cluster)
        manager.add_controller(controller)
        managers[identity] = manager
        tasks[identity] = asyncio.create_task(manager.run())
        if identity == "a":
            await eventually(lambda: managers["a"].is_leader)
    writer = connect("cluster1", "writer").client
    try:
        await writer.create(CONFIGMAPS, configmap("first", namespace))
        await eventually(lambda: "first" in reconciled["a"])
        await asyncio.sleep(1)
        assert "first" not in reconciled["b"], "a follower does not reconcile"

        stopped = time.monotonic()
        if crash:
            tasks["a"].cancel()  # the process dies: nothing is released
        else:
            managers["a"].stop()
        await asyncio.gather(tasks["a"], return_exceptions=True)
        await eventually(lambda: managers["b"].is_leader, timeout=25)
        failover = time.monotonic() - stopped
        print(f"failover ({'crash' if crash else 'graceful'}) in {failover:.1f}s")
        assert failover < (17 if crash else 4)
        if crash:
            assert failover > 10, "the lease is respected until it expires"
        await writer.create(CONFIGMAPS, configmap("second", namespace))
        await eventually(lambda: "second" in reconciled["b"])
        assert "first" in reconciled["b"], "the new leader resyncs from its warm cache"
    finally:
        for identity, manager in managers.items():
            manager.stop()
            tasks[identity].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)

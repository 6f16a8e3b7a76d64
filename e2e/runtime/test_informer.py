"""Informers against a real API server: sync, events, bookmarks, 410 relists, restarts."""

from __future__ import annotations

import asyncio

from multicluster import Cluster, ClusterConfig, Informer, index_by_label, metrics
from multicluster.informer import ADDED, DELETED, MODIFIED
from multicluster.resources import CONFIGMAPS
from testbed import TestBed
from testbed.netproxy import TcpProxy


def configmap(name: str, namespace: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"k": "v"},
    }


class Recorder:
    """Collects (event, name) pairs and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, bool]] = []
        self._changed = asyncio.Event()

    def __call__(self, event: str, obj: dict, old: dict | None, initial: bool) -> None:
        self.events.append((event, obj["metadata"]["name"], initial))
        self._changed.set()

    def seen(self, event: str, name: str) -> bool:
        return any(e == event and n == name for e, n, _ in self.events)

    async def wait(self, event: str, name: str, timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            while not self.seen(event, name):
                self._changed.clear()
                await self._changed.wait()


async def test_sync_events_indexes_and_transform(connect, namespace: str):
    cluster = connect("cluster1")
    client = cluster.client
    await client.create(CONFIGMAPS, configmap("before", namespace, app="web"))

    def slim(obj: dict) -> dict:
        meta = obj["metadata"]
        return {
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "resourceVersion", "labels") if k in meta
            }
        }

    informer = cluster.informer(CONFIGMAPS, namespace, transform=slim)
    informer.add_indexer("app", index_by_label("app"))
    recorder = Recorder()
    informer.add_handler(recorder)
    cluster.start()
    assert await informer.wait_synced(10)
    assert ("ADDED", "before", True) in recorder.events
    assert informer.get("before", namespace) == {
        "metadata": {
            "name": "before",
            "namespace": namespace,
            "resourceVersion": informer.get("before", namespace)["metadata"]["resourceVersion"],
            "labels": {"app": "web"},
        }
    }

    await client.create(CONFIGMAPS, configmap("after", namespace, app="web"))
    await recorder.wait(ADDED, "after")
    assert ("ADDED", "after", False) in recorder.events
    assert {o["metadata"]["name"] for o in informer.by_index("app", "web")} == {"before", "after"}
    await client.patch(CONFIGMAPS, "after", {"metadata": {"labels": {"app": "db"}}}, namespace)
    await recorder.wait(MODIFIED, "after")
    assert [o["metadata"]["name"] for o in informer.by_index("app", "db")] == ["after"]
    await client.delete(CONFIGMAPS, "before", namespace)
    await recorder.wait(DELETED, "before")
    assert informer.get("before", namespace) is None

    late = Recorder()
    registration = informer.add_handler(late)
    assert {(e, n) for e, n, _ in late.events} == {(ADDED, "after"), (ADDED, "kube-root-ca.crt")}
    # Removed, a handler hears nothing more; the others still do.
    registration.remove()
    await client.create(CONFIGMAPS, configmap("last", namespace))
    await recorder.wait(ADDED, "last")
    assert not late.seen(ADDED, "last")


async def test_bookmarks_advance_an_idle_informer(connect, namespace: str):
    """The API server sends a bookmark about once a minute: an informer whose namespace is
    quiet still moves its resourceVersion forward, so a reconnect does not hit 410."""
    cluster = connect("cluster1")
    informer = cluster.informer(CONFIGMAPS, namespace)
    cluster.start()
    assert await informer.wait_synced(10)
    seen = informer.resource_version
    other = await cluster.client.create(CONFIGMAPS, configmap("elsewhere", "default"))
    try:
        async with asyncio.timeout(75):
            while int(informer.resource_version) <= int(seen):
                await asyncio.sleep(0.5)
        assert int(informer.resource_version) >= int(other["metadata"]["resourceVersion"])
        assert informer.list(namespace) == [informer.get("kube-root-ca.crt", namespace)]
    finally:
        await cluster.client.delete(CONFIGMAPS, "elsewhere", "default")


async def test_relist_after_410_emits_deletes_for_what_vanished(
    testbed: TestBed, connect, namespace: str
):
    bed_cluster = testbed["cluster2"]
    cluster = connect("cluster2")
    client = cluster.client
    for name in ("keep", "doomed"):
        await client.create(CONFIGMAPS, configmap(name, namespace))
    informer = Informer(client, CONFIGMAPS, namespace, cluster="cluster2")
    recorder = Recorder()
    informer.add_handler(recorder)
    informer.start()
    assert await informer.wait_synced(10)
    await informer.stop()  # the informer is away while the world changes
    stale_version = informer.resource_version

    await client.delete(CONFIGMAPS, "doomed", namespace)
    await client.create(CONFIGMAPS, configmap("newcomer", namespace))
    # History before now is compacted, and a restarted API server's watch cache starts now:
    # nothing can replay the deletion, the server must answer 410 Gone.
    await asyncio.to_thread(bed_cluster.compact_etcd)
    bed_cluster.stop("kube-apiserver")
    bed_cluster.start("kube-apiserver")
    await asyncio.to_thread(bed_cluster.wait_settled)

    gone = metrics.WATCH_RESTARTS.labels("cluster2", "configmaps", "gone")
    gone_before = gone._value.get()
    informer.start()
    await recorder.wait(DELETED, "doomed", timeout=30)
    assert gone._value.get() == gone_before + 1, "the server answered 410 and we relisted"
    await recorder.wait(ADDED, "newcomer")
    assert informer.get("doomed", namespace) is None
    assert informer.get("keep", namespace) is not None
    assert int(informer.resource_version) > int(stale_version)
    await informer.stop()


async def test_informer_reconnects_after_the_api_server_restarts(
    testbed: TestBed, connect, namespace: str
):
    bed_cluster = testbed["cluster2"]
    cluster = connect("cluster2")
    informer = cluster.informer(CONFIGMAPS, namespace)
    recorder = Recorder()
    informer.add_handler(recorder)
    cluster.start()
    assert await informer.wait_synced(10)

    bed_cluster.stop("kube-apiserver")
    await asyncio.sleep(1)
    bed_cluster.start("kube-apiserver")
    await asyncio.to_thread(bed_cluster.wait_settled)
    await cluster.client.create(CONFIGMAPS, configmap("after-restart", namespace))
    await recorder.wait(ADDED, "after-restart", timeout=40)
    assert informer.running


async def test_a_silent_watch_is_reopened(testbed: TestBed, connect, namespace: str):
    """A connection that goes quiet without closing (a half-open connection) would starve the
    informer until the server's watch timeout, minutes later; the watchdog reopens it."""
    proxy = TcpProxy(testbed["cluster1"].apiserver_port)
    await proxy.start()
    config = ClusterConfig.from_kubeconfig(str(testbed.kubeconfig), "cluster1")
    config.server = f"https://127.0.0.1:{proxy.port}"
    cluster = Cluster("cluster1", config, idle_timeout=3)
    writer = connect("cluster1", "writer").client
    try:
        informer = cluster.informer(CONFIGMAPS, namespace)
        recorder = Recorder()
        informer.add_handler(recorder)
        cluster.start()
        assert await informer.wait_synced(10)
        # The watch is open (it has its own connection, opened after the list's) before the
        # connections go quiet.
        await writer.create(CONFIGMAPS, configmap("before-silence", namespace))
        await recorder.wait(ADDED, "before-silence", timeout=15)
        idle = metrics.WATCH_RESTARTS.labels("cluster1", "configmaps", "unreachable")
        idle_before = idle._value.get()
        assert proxy.stall_existing() >= 1
        await writer.create(CONFIGMAPS, configmap("during-silence", namespace))
        await recorder.wait(ADDED, "during-silence", timeout=15)
        assert idle._value.get() > idle_before
    finally:
        await cluster.stop()
        await proxy.stop()


async def test_cached_objects_count_every_informer_of_a_cluster_as_it_changes(
    connect, namespace: str
):
    cluster = connect("cluster1", name="metrics-probe")
    client = cluster.client
    await client.create(CONFIGMAPS, configmap("web", namespace, app="web"))
    await client.create(CONFIGMAPS, configmap("db", namespace, app="db"))
    labels = {"cluster": "metrics-probe", "resource": str(CONFIGMAPS)}

    def cached() -> float | None:
        return metrics.REGISTRY.get_sample_value("informer_cached_objects", labels)

    web = cluster.informer(CONFIGMAPS, namespace, label_selector="app=web")
    db = cluster.informer(CONFIGMAPS, namespace, label_selector="app=db")
    recorder = Recorder()
    web.add_handler(recorder)
    cluster.start()
    assert await web.wait_synced(10)
    assert await db.wait_synced(10)
    assert cached() == 2, "both informers' objects, not the last one to report"
    await client.create(CONFIGMAPS, configmap("web2", namespace, app="web"))
    await recorder.wait(ADDED, "web2")
    assert cached() == 3, "current while the watch goes on, not only when it ends"
    await cluster.stop()
    assert cached() is None, "stopped informers are not counted"


async def test_resyncs_and_healthy_handlers(testbed: TestBed, connect, namespace: str):
    """A handler with a resync period gets every cached object again (MODIFIED, old the object
    itself); healthy handlers hear of the first sync and of each recovery, never while the
    informer fails."""
    proxy = TcpProxy(testbed["cluster1"].apiserver_port)
    await proxy.start()
    config = ClusterConfig.from_kubeconfig(str(testbed.kubeconfig), "cluster1")
    config.server = f"https://127.0.0.1:{proxy.port}"
    cluster = Cluster("cluster1", config, idle_timeout=2)
    writer = connect("cluster1", "writer").client
    await writer.create(CONFIGMAPS, configmap("kept", namespace))
    try:
        informer = cluster.informer(CONFIGMAPS, namespace)
        resynced: list[tuple[str, bool]] = []
        informer.add_handler(
            lambda event, obj, old, _initial: resynced.append(
                (obj["metadata"]["name"], event == MODIFIED and old is obj)
            ),
            resync_period=0.5,
        )
        healthy: list[float] = []
        loop = asyncio.get_running_loop()
        informer.add_healthy_handler(lambda: healthy.append(loop.time()))
        cluster.start()
        assert await informer.wait_synced(10)
        assert len(healthy) == 1, "told of the first sync"
        await asyncio.sleep(1.2)
        assert ("kept", True) in resynced, "handed again, unchanged"

        # Cut off: the open watch goes silent and new connections are refused.
        proxy.stall_existing()
        await proxy.stop()
        async with asyncio.timeout(20):
            while informer.healthy:
                await asyncio.sleep(0.1)
        resynced.clear()
        await asyncio.sleep(1.2)
        assert resynced == [], "no resync while it fails"
        assert len(healthy) == 1
        await proxy.start()
        async with asyncio.timeout(40):
            while len(healthy) < 2:
                await asyncio.sleep(0.1)
        assert informer.healthy
    finally:
        await cluster.stop()
        await proxy.stop()

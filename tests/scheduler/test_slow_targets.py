"""A target that never answers the creation of delegates holds a bounded share of the
scheduler's workers: at most ``MAX_CREATES_PER_OWNER`` of its namespace's pods wait on it, each
at most ``CREATE_TIMEOUT``; the others wait without holding a worker, each asked again as soon as
one of those creates ends, and other namespaces' pods are placed meanwhile."""

from __future__ import annotations

import asyncio
import json

from multicluster import Cluster, ClusterConfig, Request
from multicluster.resources import PODS
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import slim_proxy
from multicluster_scheduler.api.resources import CLUSTER_SUMMARIES
from multicluster_scheduler.scheduler import controller as scheduler_module
from multicluster_scheduler.scheduler.controller import Scheduler, proxy_informer
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import (
    DELEGATE_INDEX,
    TargetConnection,
    TargetRegistry,
    by_parent_uid,
)
from tests.sources.test_source_controller import make_cluster

SUMMARY = {
    "metadata": {"name": "singleton", "uid": "s", "resourceVersion": "1"},
    "capacity": {"cpu": "100", "memory": "100Gi", "pods": "1000"},
    "allocatable": {"cpu": "100", "memory": "100Gi", "pods": "1000"},
}


class Silent:
    """A target's API server that accepts connections and never answers a creation."""

    def __init__(self) -> None:
        self.waiting = 0

    async def create(self, *_args, **_kwargs):
        self.waiting += 1
        await asyncio.Event().wait()


class Quick:
    def __init__(self) -> None:
        self.created: list[str] = []

    async def create(self, _resource, body, namespace=None, **_kwargs):
        self.created.append(body["metadata"]["name"])
        return body


def connect(registry: TargetRegistry, name: str, namespace: str, client) -> TargetConnection:
    cluster = Cluster(name, ClusterConfig(f"https://{name}.invalid:6443", None))
    cluster.client = client
    summaries = cluster.informer(CLUSTER_SUMMARIES)
    summaries.store.put(keys.CLUSTER_SUMMARY_NAME, SUMMARY)
    delegates = cluster.informer(PODS, namespace)
    delegates.add_indexer(DELEGATE_INDEX, by_parent_uid)
    delegates._synced.set()
    connection = TargetConnection(
        "Target", name, namespace, cluster=cluster, summaries=summaries, delegates=delegates,
        ready=True, reason="Ready",
    )  # fmt: skip
    registry.connections[connection.node_name] = connection
    return connection


def proxy(name: str, namespace: str) -> dict:
    manifest = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c"}]}}
    return slim_proxy(
        {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{namespace}-{name}",
                "finalizers": [keys.FINALIZER],
                "annotations": {keys.SOURCEPOD_MANIFEST: json.dumps(manifest)},
            },
            "spec": {"schedulerName": keys.PROXY_SCHEDULER_NAME, "containers": []},
        }
    )


async def test_a_silent_target_holds_at_most_so_many_workers_of_its_namespace(monkeypatch):
    monkeypatch.setattr(scheduler_module, "CREATE_TIMEOUT", 30.0)
    local, _api = make_cluster()
    registry = TargetRegistry()
    lookup = DelegateLookup(registry, proxy_informer(local), "me")
    scheduler = Scheduler(local, lookup)
    scheduler.events = type("E", (), {"emit": lambda *_a, **_k: None})()  # type: ignore[assignment]
    for informer in (scheduler.proxies, scheduler.enabled, scheduler.nodes):
        informer._synced.set()
    silent, quick = Silent(), Quick()
    connect(registry, "evil", "mallory", silent)
    connect(registry, "c2", "good", quick)
    for namespace in ("mallory", "good"):
        scheduler.enabled.store.put(namespace, {"metadata": {"name": namespace}})
    pods = [("mallory", f"m{i}") for i in range(20)] + [("good", f"g{i}") for i in range(5)]
    for namespace, name in pods:
        scheduler.proxies.store.put(f"{namespace}/{name}", proxy(name, namespace))
    tasks = {
        name: asyncio.create_task(scheduler.reconcile(Request("local", namespace, name)))
        for namespace, name in pods
    }
    await asyncio.sleep(0.5)
    waiting = [n for n, t in tasks.items() if not t.done()]
    busy = [n for n, t in tasks.items() if t.done() and t.result().requeue_after == 30.0]
    assert silent.waiting == scheduler_module.MAX_CREATES_PER_OWNER == len(waiting)
    assert len(busy) == 20 - scheduler_module.MAX_CREATES_PER_OWNER, "no worker waits"
    assert [r.name for r in scheduler._waiting["namespace/mallory"]] == busy, "in their order"
    assert len(quick.created) == 5, "the other namespace's pods were placed meanwhile"
    assert len(scheduler.controller.queue) == 0
    tasks[waiting[0]].cancel()  # one create ends: the first pod waiting is asked again at once
    await asyncio.gather(tasks[waiting[0]], return_exceptions=True)
    assert len(scheduler.controller.queue) == 1
    assert [r.name for r in scheduler._waiting["namespace/mallory"]] == busy[1:]
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert scheduler._creating["namespace/mallory"] == 0, "given back when they end"
    assert len(scheduler.controller.queue) == 8, "each end asks one waiting pod again"


async def test_a_creation_that_takes_too_long_moves_the_pod_on(monkeypatch):
    monkeypatch.setattr(scheduler_module, "CREATE_TIMEOUT", 0.2)
    local, _api = make_cluster()
    registry = TargetRegistry()
    lookup = DelegateLookup(registry, proxy_informer(local), "me")
    scheduler = Scheduler(local, lookup)
    seen: list[str] = []
    scheduler.events = type("E", (), {"emit": lambda _s, _o, _t, r, m: seen.append(m)})()  # type: ignore[assignment]
    for informer in (scheduler.proxies, scheduler.enabled, scheduler.nodes):
        informer._synced.set()
    connect(registry, "evil", "mallory", Silent())
    scheduler.enabled.store.put("mallory", {"metadata": {"name": "mallory"}})
    scheduler.proxies.store.put("mallory/m0", proxy("m0", "mallory"))
    result = await asyncio.wait_for(scheduler.reconcile(Request("local", "mallory", "m0")), 2)
    assert result is not None
    assert result.requeue
    assert seen == ["evil: cannot create the delegate: no answer in 0s"]
    assert "admiralty-namespace-mallory-evil" in scheduler._excluded("uid-mallory-m0")

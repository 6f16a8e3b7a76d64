"""The follow controller's decisions against fake API clients: when a copy is written, kept or
deleted, whose delegates count, and that a target that hangs holds up no other. (The real
thing, with API servers, kubectl and a Job, is e2e/test_follow.py.)"""

from __future__ import annotations

import asyncio
import copy as _copy

import pytest

from multicluster import Cluster, ClusterConfig, NotFound
from multicluster.resources import PODS
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.follow import CONFIG_MAP, desired_copy, slim_followed
from multicluster_scheduler.api.proxy import (
    DELEGATE_LABEL_SELECTOR,
    delegate_pod,
    slim_delegate,
    slim_proxy,
)
from multicluster_scheduler.follow import controller as follow_module
from multicluster_scheduler.follow.controller import Follow
from multicluster_scheduler.scheduler.controller import proxy_informer
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import (
    DELEGATE_INDEX,
    REFERENCE_INDEX,
    TargetConnection,
    TargetRegistry,
    by_parent_uid,
    by_reference,
)

NS = "ns"
ME, OTHER = "cluster-a", "cluster-b"
OLD = "2020-01-01T00:00:00Z"


class FakeClient:
    def __init__(self, hang: bool = False) -> None:
        self.objects: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.hang = hang
        self.mirror = None  # a cache written through, as a watch would

    async def _maybe_hang(self) -> None:
        if self.hang:
            await asyncio.sleep(3600)

    async def get(self, resource, name, namespace=None, **_):
        self.calls.append(("get", name))
        if name not in self.objects:
            raise NotFound(name)
        return _copy.deepcopy(self.objects[name])

    async def patch(self, resource, name, patch, namespace=None, **_):
        self.calls.append(("patch", name))
        obj = self.objects[name]
        meta = patch.get("metadata", {})
        if "finalizers" in meta:
            obj["metadata"]["finalizers"] = meta["finalizers"]
        if self.mirror is not None:
            self.mirror(obj)
        return _copy.deepcopy(obj)

    async def create(self, resource, body, namespace=None, **_):
        await self._maybe_hang()
        self.calls.append(("create", body["metadata"]["name"]))
        self.objects[body["metadata"]["name"]] = _copy.deepcopy(body)
        return body

    async def update(self, resource, body, **_):
        await self._maybe_hang()
        self.calls.append(("update", body["metadata"]["name"]))
        return body

    async def delete(self, resource, name, namespace=None, **_):
        await self._maybe_hang()
        self.calls.append(("delete", name))
        self.objects.pop(name, None)


def fake_cluster(name: str, hang: bool = False) -> tuple[Cluster, FakeClient]:
    cluster = Cluster(name, ClusterConfig(f"https://{name}.invalid:6443", None))
    client = FakeClient(hang)
    cluster.client = client  # type: ignore[assignment]
    return cluster, client


def config_map(name: str = "settings") -> dict:
    return {
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "uid": "src-uid", "resourceVersion": "1"},
        "data": {"GREETING": "hello"},
    }


def pod_using(name: str, *uses: str) -> dict:
    """A pod (a proxy pod as its API server keeps it) whose containers use config maps."""
    return {
        "metadata": {"name": name, "namespace": NS, "uid": "p-" + name},
        "spec": {
            "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": u}} for u in uses]}]
        },
    }


def delegate(name: str, uses: str, parent_cluster: str = ME) -> dict:
    """The delegate a cluster makes of ``pod_using(name, uses)``."""
    proxy = pod_using(name, uses)
    made = delegate_pod(proxy, proxy, parent_cluster)
    made["metadata"]["uid"] = "d-" + name
    return made


class World:
    def __init__(self) -> None:
        self.local, self.api = fake_cluster("local")
        self.registry = TargetRegistry()
        self.proxies = proxy_informer(self.local)
        self.follow = Follow(self.local, DelegateLookup(self.registry, self.proxies, ME))
        self.maps = self.follow.followers[CONFIG_MAP]
        self.events: list[str] = []
        self.maps.events = type(
            "E", (), {"emit": lambda _s, _o, _t, r, _m: self.events.append(r)}
        )()
        self.maps.sources._synced.set()
        self.api.mirror = lambda obj: self.maps.sources.store.put(
            f"{NS}/{obj['metadata']['name']}", slim_followed(obj)
        )
        self.targets: dict[str, tuple[TargetConnection, FakeClient]] = {}

    def source(self, obj: dict) -> None:
        self.api.objects[obj["metadata"]["name"]] = _copy.deepcopy(obj)
        self.maps.sources.store.put(f"{NS}/{obj['metadata']['name']}", slim_followed(obj))

    def connect(self, name: str, *, hang: bool = False, synced: bool = True) -> TargetConnection:
        cluster, client = fake_cluster(name, hang)
        delegates = cluster.informer(
            PODS, NS, label_selector=DELEGATE_LABEL_SELECTOR, transform=slim_delegate
        )
        delegates.add_indexer(REFERENCE_INDEX, by_reference)
        delegates.add_indexer(DELEGATE_INDEX, by_parent_uid)
        if synced:
            delegates._synced.set()
        connection = TargetConnection(
            kind="Target", name=name, namespace=NS, cluster=cluster, delegates=delegates
        )
        self.registry.connections[connection.node_name] = connection
        self.follow._connected(connection)
        self.maps.copies[connection.node_name]._synced.set()
        self.targets[name] = (connection, client)
        return connection

    def proxy(self, pod: dict, target: str | None) -> None:
        """``pod`` as a proxy pod bound to ``target``'s virtual node (None: not bound)."""
        node = self.targets[target][0].node_name if target else None
        proxy = _copy.deepcopy(pod)
        proxy["spec"].update(schedulerName="admiralty-proxy", nodeName=node)
        proxy["metadata"]["finalizers"] = [keys.FINALIZER]  # as the webhook leaves it
        self.proxies.store.put(f"{NS}/{pod['metadata']['name']}", slim_proxy(proxy))

    def delegate(self, target: str, pod: dict, *, bound: str | None = "") -> None:
        """A delegate in ``target``, its proxy pod bound there (or to ``bound``; None: no proxy)."""
        connection, _ = self.targets[target]
        connection.delegates.store.put(f"{NS}/{pod['metadata']['name']}", slim_delegate(pod))
        if bound is not None:
            parent = pod["metadata"]["annotations"][keys.PARENT_NAME]
            uses = [
                e["configMapRef"]["name"]
                for c in pod["spec"]["containers"]
                for e in c.get("envFrom") or ()
            ]
            self.proxy(pod_using(parent, *uses), bound or target)

    def copy(self, target: str, source: dict, cluster_name: str = ME, created: str = OLD) -> None:
        connection, client = self.targets[target]
        body = desired_copy(source, cluster_name)
        body["metadata"].update(uid="copy-uid", resourceVersion="5", creationTimestamp=created)
        client.objects[source["metadata"]["name"]] = body
        copies = self.maps.copies[connection.node_name]
        copies.store.put(f"{NS}/{source['metadata']['name']}", slim_followed(body))

    async def reconcile(self, name: str = "settings"):
        return await self.maps.reconcile(self.maps._request(NS, name))


@pytest.fixture
async def world():
    world = World()
    # The follow controller's workers: they write the copies prepare asks for.
    workers = asyncio.create_task(world.maps.controller.run())
    yield world
    workers.cancel()
    await asyncio.gather(workers, return_exceptions=True)


async def test_a_used_config_map_is_copied_after_its_source_gets_the_finalizer(world):
    world.source(config_map())
    world.connect("c2")
    world.delegate("c2", delegate("d1", "settings"))
    await world.reconcile()
    _, target = world.targets["c2"]
    assert target.calls == [("create", "settings")]
    copy = target.objects["settings"]
    assert copy["metadata"]["annotations"][keys.PARENT_CLUSTER_NAME] == ME
    assert copy["data"] == {"GREETING": "hello"}
    assert keys.FINALIZER in world.api.objects["settings"]["metadata"]["finalizers"]


async def test_copies_are_kept_while_the_targets_delegates_are_not_all_cached(world):
    """A reconnect makes new caches: copies may be listed before the delegates that use them."""
    source = {
        **config_map(),
        "metadata": {**config_map()["metadata"], "finalizers": [keys.FINALIZER]},
    }
    world.source(source)
    world.connect("c2", synced=False)
    world.copy("c2", source)
    result = await world.reconcile()
    _, target = world.targets["c2"]
    assert ("delete", "settings") not in target.calls
    assert ("patch", "settings") not in world.api.calls  # the finalizer stays
    assert result is not None
    assert result.requeue_after == follow_module.NOT_CACHED_RETRY


async def test_an_unused_old_copy_is_deleted_and_the_finalizer_removed(world):
    source = {
        **config_map(),
        "metadata": {**config_map()["metadata"], "finalizers": [keys.FINALIZER]},
    }
    world.source(source)
    world.connect("c2")
    world.copy("c2", source)
    await world.reconcile()
    _, target = world.targets["c2"]
    assert target.calls == [("delete", "settings")]
    assert world.api.objects["settings"]["metadata"]["finalizers"] == []


async def test_a_young_unused_copy_is_kept_for_a_while(world):
    import datetime as dt

    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = {
        **config_map(),
        "metadata": {**config_map()["metadata"], "finalizers": [keys.FINALIZER]},
    }
    world.source(source)
    world.connect("c2")
    world.copy("c2", source, created=now)
    result = await world.reconcile()
    assert world.targets["c2"][1].calls == []
    assert 0 < result.requeue_after <= follow_module.GRACE


async def test_delegates_of_other_source_clusters_do_not_count(world):
    """A target serves several sources: another cluster's delegate using a namesake is not ours
    to feed."""
    world.source(config_map())
    world.connect("c2")
    world.delegate("c2", delegate("theirs", "settings", parent_cluster=OTHER))
    await world.reconcile()
    assert world.targets["c2"][1].calls == []
    assert "finalizers" not in world.api.objects["settings"]["metadata"]


async def test_someone_elses_namesake_is_left_alone_and_reported_once(world):
    world.source(config_map())
    world.connect("c2")
    world.delegate("c2", delegate("d1", "settings"))
    _, target = world.targets["c2"]
    target.objects["settings"] = {"metadata": {"name": "settings", "namespace": NS}, "data": {}}

    async def exists(resource, body, namespace=None, **_):
        from multicluster import AlreadyExists

        raise AlreadyExists("settings exists")

    target.create = exists  # type: ignore[method-assign]
    for _ in range(3):  # the first attempt, the finalizer's own event, and a later one
        await world.reconcile()
    assert target.objects["settings"]["data"] == {}
    assert world.events == ["CopyConflict"]
    # Nothing of ours holds the source: the finalizer went with the failed attempt.
    assert world.api.objects["settings"]["metadata"]["finalizers"] == []


async def test_a_hanging_target_holds_up_no_other(world, monkeypatch):
    monkeypatch.setattr(follow_module, "TARGET_TIMEOUT", 0.2)
    world.source(config_map())
    world.connect("slow", hang=True)
    world.connect("fast")
    for target in ("slow", "fast"):
        world.delegate(target, delegate("d-" + target, "settings"))
    with pytest.raises(RuntimeError, match="slow"):
        await asyncio.wait_for(world.reconcile(), 2)
    assert world.targets["fast"][1].calls == [("create", "settings")]


async def test_prepare_returns_in_time_whatever_the_target_does(world, monkeypatch):
    monkeypatch.setattr(follow_module, "PREPARE_TIMEOUT", 0.2)
    world.source(config_map())
    connection = world.connect("slow", hang=True)
    world.proxy(pod_using("d1", "settings"), None)  # being placed
    pod = delegate("d1", "settings")
    await asyncio.wait_for(world.follow.prepare(connection, pod), 2)
    fast = world.connect("fast")
    await world.follow.prepare(fast, pod)
    assert world.targets["fast"][1].calls == [("create", "settings")]


async def test_prepare_copies_only_what_the_proxy_pods_own_spec_uses(world):
    """A saved manifest that names a Secret the pod itself never used copies nothing of it."""
    world.source(config_map())
    world.source(config_map("db-password"))
    fast = world.connect("fast")
    world.proxy(pod_using("d1", "settings"), None)
    pod = delegate("d1", "settings")
    pod["spec"]["containers"][0].setdefault("envFrom", []).append(
        {"configMapRef": {"name": "db-password"}}
    )
    await world.follow.prepare(fast, pod)
    assert world.targets["fast"][1].calls == [("create", "settings")]
    world.proxies.store.delete(f"{NS}/d1")
    await world.follow.prepare(fast, delegate("d1", "settings"))
    assert world.targets["fast"][1].calls == [("create", "settings")], "no proxy pod: nothing"


# -- pods that only claim to be delegates ---------------------------------------------------------


def labelled_like(pod: dict, **changes) -> dict:
    """``pod`` as someone who may create pods in the target would copy it."""
    forged = _copy.deepcopy(pod)
    forged["metadata"].update(uid="forged", **changes)
    return forged


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda d: labelled_like(d, name="mine"), id="another name"),
        pytest.param(lambda d: labelled_like(d, namespace="other"), id="another namespace"),
    ],
)
async def test_a_pod_carrying_a_proxys_uid_gets_nothing(world, forged):
    """The proxy pod exists and is bound to c2; a pod there copies its labels and annotations
    and says it uses "settings": that is not its delegate."""
    world.source(config_map())
    world.connect("c2")
    real = delegate("d1", "settings")
    world.proxy(pod_using("d1", "settings"), "c2")
    world.delegate("c2", forged(real), bound=None)
    await world.reconcile()
    assert world.targets["c2"][1].calls == []
    assert "finalizers" not in world.api.objects["settings"]["metadata"]


async def test_a_delegate_counts_only_where_its_proxy_pod_is_placed(world):
    world.source(config_map())
    world.connect("c2")
    world.connect("c3")
    world.delegate("c2", delegate("d1", "settings"), bound="c3")
    await world.reconcile()
    assert world.targets["c2"][1].calls == []


async def test_only_what_the_proxy_pod_itself_uses_follows(world):
    """A pod in the target under the delegate's name (the delegate deleted, say) may claim any
    config map of the namespace: only those the proxy pod uses too are copied."""
    world.source(config_map())
    world.source(config_map("private"))
    world.connect("c2")
    world.proxy(pod_using("d1", "settings"), "c2")
    claims = delegate("d1", "private")
    world.delegate("c2", claims, bound=None)
    await world.reconcile("private")
    assert world.targets["c2"][1].calls == []
    assert "finalizers" not in world.api.objects["private"]["metadata"]


async def test_prepare_writes_nothing_itself_the_follow_controller_does(monkeypatch):
    """One writer of copies: prepare asks the follow controller and waits for it, a while."""
    monkeypatch.setattr(follow_module, "PREPARE_TIMEOUT", 0.2)
    world = World()  # no workers: nobody answers
    world.source(config_map())
    fast = world.connect("fast")
    world.proxy(pod_using("d1", "settings"), None)
    await asyncio.wait_for(world.follow.prepare(fast, delegate("d1", "settings")), 2)
    assert world.targets["fast"][1].calls == []
    workers = asyncio.create_task(world.maps.controller.run())
    try:
        await world.follow.prepare(fast, delegate("d1", "settings"))
    finally:
        workers.cancel()
        await asyncio.gather(workers, return_exceptions=True)
    assert world.targets["fast"][1].calls == [("create", "settings")]

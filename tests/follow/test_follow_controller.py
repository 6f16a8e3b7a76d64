"""The follow controller's decisions, on the in-memory API servers of :mod:`multicluster.testing`:
when a copy is written, kept or deleted, whose delegates count, and that a target that hangs
holds up no other. (The real thing, with API servers, kubectl and a Job, is e2e/test_follow.py.)

This cluster and its targets are fake API servers whose caches are the real informers; targets
are attached as the targets controller attaches them. Proxy pods, delegates, config maps and
copies are created on the servers; a test reconciles a config map (or runs the follow
controller's workers, which write what ``Follow.prepare`` asks for) and reads the servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from multicluster import Request, Result
from multicluster.client import Call
from multicluster.errors import ServerError
from multicluster.resources import CONFIGMAPS, PODS
from multicluster.testing import Action, FakeClient, FakeCluster, FakeServer
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.follow import CONFIG_MAP, desired_copy
from multicluster_scheduler.api.proxy import delegate_pod
from multicluster_scheduler.follow import controller as follow_module
from multicluster_scheduler.follow.controller import Follow
from multicluster_scheduler.scheduler.controller import proxy_informer
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry
from tests.worlds import HoldingCluster, attach, events, named, settle, until

NS = "ns"
ME, OTHER = "cluster-a", "cluster-b"
LOCAL = "local"


def config_map(name: str = "settings", ns: str = NS, *, held: bool = False) -> dict:
    """A config map of this cluster (``held``: with our finalizer, as while it has copies)."""
    meta: dict = {"name": name, "namespace": ns}
    if held:
        meta["finalizers"] = [keys.FINALIZER]
    return {"metadata": meta, "data": {"GREETING": "hello"}}


def pod_using(name: str, *uses: str) -> dict:
    """A pod whose container uses config maps."""
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "nginx",
                    "envFrom": [{"configMapRef": {"name": u}} for u in uses],
                }
            ]
        },
    }


class World:
    """This cluster (``local``) with the follow controller, and targets connected to it."""

    def __init__(self) -> None:
        self.local = FakeCluster(LOCAL)
        self.api = self.local.server
        self.registry = TargetRegistry()
        self.proxies = proxy_informer(self.local)
        self.follow = Follow(self.local, DelegateLookup(self.registry, self.proxies, ME))
        self.maps = self.follow.followers[CONFIG_MAP]
        self.targets: dict[str, FakeCluster] = {}
        self.connections: dict[str, TargetConnection] = {}
        self._workers: asyncio.Task | None = None

    async def start(self) -> None:
        self.local.start()
        assert await self.local.wait_synced(3)

    def run(self) -> None:
        """The follow controller's workers: they write the copies ``prepare`` asks for."""
        self._workers = asyncio.create_task(self.maps.controller.run())

    async def stop(self) -> None:
        if self._workers is not None:
            self._workers.cancel()
            await asyncio.gather(self._workers, return_exceptions=True)
        for follower in self.follow.followers.values():
            follower.controller.queue.shut_down()  # its timers too
        for target in self.targets.values():
            if isinstance(target, HoldingCluster):
                target.holding.release()
        await asyncio.gather(*(c.stop() for c in (self.local, *self.targets.values())))

    async def connect(
        self,
        name: str,
        cluster: FakeCluster | None = None,
        *,
        ns: str | None = NS,
        synced: bool = True,
    ) -> TargetConnection:
        """A Target ``name`` of ``ns`` (a ClusterTarget when None), attached as the targets
        controller attaches it."""
        target = cluster or FakeCluster(name, FakeServer(name=name))
        connection = TargetConnection("Target" if ns else "ClusterTarget", name, ns)
        self.targets[name], self.connections[name] = target, connection
        return await attach(self.registry, connection, target, synced=synced)

    def node(self, target: str) -> str:
        return self.connections[target].node_name

    # -- what the clusters hold --

    async def source(self, obj: dict) -> dict:
        """A config map created in this cluster, once the follow controller's cache has it."""
        (made,) = self.api.add(CONFIGMAPS, obj)
        meta = made["metadata"]
        await until(lambda: self.maps.sources.get(meta["name"], meta["namespace"]) is not None)
        return made

    def stored(self, name: str = "settings", ns: str = NS) -> dict:
        """A config map of this cluster, as its API server holds it."""
        found = named(self.api, CONFIGMAPS, name, ns)
        assert found is not None
        return found

    async def proxy(self, pod: dict, target: str | None) -> dict:
        """``pod`` as a proxy pod, as the webhook leaves it, bound to ``target``'s virtual node
        (None: being placed); once the proxy pods' cache has it."""
        proxy = {
            "metadata": {**pod["metadata"], "finalizers": [keys.FINALIZER]},
            "spec": {
                **pod["spec"],
                "schedulerName": keys.PROXY_SCHEDULER_NAME,
                "nodeName": self.node(target) if target else None,
            },
        }
        (made,) = self.api.add(PODS, proxy)
        await until(lambda: self.proxies.get(pod["metadata"]["name"], NS) is not None)
        return made

    async def gone_proxy(self, name: str) -> None:
        """A proxy pod not being placed any more: its finalizer off, deleted, out of the cache."""
        patch = {"metadata": {"finalizers": None}}
        await self.local.client.patch(PODS, name, patch, NS)
        await self.local.client.delete(PODS, name, NS)
        await until(lambda: self.proxies.get(name, NS) is None)

    def delegate_of(self, proxy: dict, *uses: str, cluster_name: str = ME, **meta: str) -> dict:
        """The delegate ``cluster_name`` makes of ``proxy`` (using ``uses``, by default what
        ``proxy`` uses), with ``meta`` changed."""
        manifest = pod_using(proxy["metadata"]["name"], *uses) if uses else proxy
        made = delegate_pod(proxy, manifest, cluster_name)
        made["metadata"].update(meta)
        return made

    async def delegate(self, target: str, pod: dict) -> dict:
        """``pod`` created in ``target``, once that target's cache of delegates has it."""
        (made,) = self.targets[target].server.add(PODS, pod)
        meta = made["metadata"]
        delegates = self.connections[target].delegates
        assert delegates is not None
        await until(lambda: delegates.get(meta["name"], meta["namespace"]) is not None)
        return made

    async def copy(self, target: str, source: dict) -> dict:
        """Our copy of ``source`` in ``target``, once the follow controller's cache has it."""
        (made,) = self.targets[target].server.add(CONFIGMAPS, desired_copy(source, ME))
        copies = self.maps.copies[self.node(target)]
        await until(lambda: copies.get(made["metadata"]["name"], NS) is not None)
        return made

    def made(self, target: str) -> list[str]:
        """The names of the copies in ``target``, each created, and none deleted. (A reconcile
        that planned a write before another made the copy may write it again: its create
        answers AlreadyExists, and an update follows.)"""
        writes = self.writes(target)
        copies = self.copies(target)
        for name in copies:
            assert next(verb for verb, n in writes if n == name) == "create"
            assert copies[name]["metadata"]["annotations"][keys.PARENT_CLUSTER_NAME] == ME
        assert "delete" not in {verb for verb, _ in writes}
        return sorted(copies)

    def copies(self, target: str, ns: str = NS) -> dict[str, dict]:
        """The config maps in ``target``'s API server, by name."""
        objects = self.targets[target].server.objects(CONFIGMAPS, ns)
        return {o["metadata"]["name"]: o for o in objects}

    def writes(self, target: str) -> list[tuple[str, str]]:
        """The writes of config maps ``target``'s API server was asked for, in order."""
        server = self.targets[target].server
        return [(a.verb, a.name or "") for a in server.writes if a.resource == CONFIGMAPS]

    async def reconcile(self, name: str = "settings", ns: str = NS) -> Result | None:
        return await self.maps.reconcile(Request(LOCAL, ns, name))

    def warnings(self) -> list[tuple[str, str, int]]:
        """The Events about config maps: (name, reason, count)."""
        return [(n, reason, count) for n, _, reason, count in events(self.api, NS)]


@pytest.fixture
async def world() -> AsyncGenerator[World, None]:
    made = World()
    await made.start()
    yield made
    await made.stop()


# -- copies written, kept and deleted -------------------------------------------------------------


async def test_a_used_config_map_is_copied_after_its_source_gets_the_finalizer(world: World):
    await world.source(config_map())
    await world.connect("c2")
    order: list[str] = []

    def record(action: Action) -> None:
        order.append(f"{action.client}: {action.verb} {action.resource.plural}")

    world.api.prepend_reactor("patch", CONFIGMAPS, record)
    world.targets["c2"].server.prepend_reactor("create", CONFIGMAPS, record)
    proxy = await world.proxy(pod_using("d1", "settings"), "c2")
    await world.delegate("c2", world.delegate_of(proxy))
    await world.reconcile()
    assert world.writes("c2") == [("create", "settings")]
    copy = world.copies("c2")["settings"]
    assert copy["metadata"]["annotations"][keys.PARENT_CLUSTER_NAME] == ME
    assert copy["metadata"]["labels"][keys.PARENT_UID] == world.stored()["metadata"]["uid"]
    assert copy["data"] == {"GREETING": "hello"}
    assert keys.FINALIZER in world.stored()["metadata"]["finalizers"]
    assert order == ["local: patch configmaps", "c2: create configmaps"], "the finalizer first"


async def test_copies_are_kept_while_the_targets_delegates_are_not_all_cached(world: World):
    """A reconnect makes new caches: copies may be listed before the delegates that use them."""
    source = await world.source(config_map(held=True))
    c2 = FakeCluster("c2", FakeServer(name="c2"))
    c2.server.fail_next("list", PODS, ServerError("pods not listed", status=500), times=None)
    await world.connect("c2", c2, synced=False)
    await world.copy("c2", source)
    assert not world.connections["c2"].delegates_synced
    local_writes = len(world.api.writes)
    result = await world.reconcile()
    assert world.writes("c2") == [], "the copy stays"
    assert len(world.api.writes) == local_writes, "the finalizer stays"
    assert world.stored()["metadata"]["finalizers"] == [keys.FINALIZER]
    assert result is not None
    assert result.requeue_after == follow_module.NOT_CACHED_RETRY


async def test_an_unused_old_copy_is_deleted_and_the_finalizer_removed(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    # Any copy is old: the fake server dates every object it creates now.
    monkeypatch.setattr(follow_module, "GRACE", 0.0)
    source = await world.source(config_map(held=True))
    await world.connect("c2")
    await world.copy("c2", source)
    await world.reconcile()
    assert world.writes("c2") == [("delete", "settings")]
    assert world.copies("c2") == {}
    assert not world.stored()["metadata"].get("finalizers")
    assert keys.HAS_FINALIZER not in (world.stored()["metadata"].get("labels") or {})


async def test_a_young_unused_copy_is_kept_for_a_while(world: World):
    source = await world.source(config_map(held=True))
    await world.connect("c2")
    await world.copy("c2", source)  # created now
    result = await world.reconcile()
    assert world.writes("c2") == []
    assert result is not None
    assert 0 < result.requeue_after <= follow_module.GRACE
    assert world.stored()["metadata"]["finalizers"] == [keys.FINALIZER], "a copy remains"


async def test_a_copy_made_for_a_delegate_that_never_came_goes_once_unused(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    """What prepare asked for is kept only while it is asked for: the delegate not created, the
    copy is unused, and deleted (after its grace, none here; a reconcile that ran while it was
    still asked for looks again after RESYNC_EVERY, short here)."""
    monkeypatch.setattr(follow_module, "GRACE", 0.0)
    monkeypatch.setattr(follow_module, "RESYNC_EVERY", 0.5)
    await world.source(config_map())
    fast = await world.connect("fast")
    proxy = await world.proxy(pod_using("d1", "settings"), None)
    world.run()
    await world.follow.prepare(fast, world.delegate_of(proxy))
    assert world.made("fast") == ["settings"]
    await until(lambda: world.copies("fast") == {}, timeout=5, what="the unused copy deleted")
    assert world.writes("fast")[-1] == ("delete", "settings")


async def test_a_copy_asked_for_by_a_prepare_that_timed_out_goes_once_unused(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    """A prepare that gave up takes back what it asked for: the copy written late, for a
    delegate that never came, is not wanted for good (it was, and never deleted)."""
    monkeypatch.setattr(follow_module, "GRACE", 0.0)
    monkeypatch.setattr(follow_module, "PREPARE_TIMEOUT", 0.2)
    await world.source(config_map())
    slow = HoldingCluster("slow", verb="create", resource=CONFIGMAPS)
    connection = await world.connect("slow", slow)
    proxy = await world.proxy(pod_using("d1", "settings"), None)
    world.run()
    await asyncio.wait_for(world.follow.prepare(connection, world.delegate_of(proxy)), 2)
    assert world.copies("slow") == {}, "not in time"
    slow.holding.release()  # the copy is written after all; its delegate never comes
    await until(lambda: ("delete", "settings") in world.writes("slow"), what="copy deleted")
    assert world.writes("slow")[0] == ("create", "settings")
    assert world.copies("slow") == {}


# -- whose delegates count ------------------------------------------------------------------------


async def test_delegates_of_other_source_clusters_do_not_count(world: World):
    """A target serves several sources: another cluster's delegate using a namesake is not ours
    to feed."""
    await world.source(config_map())
    await world.connect("c2")
    proxy = await world.proxy(pod_using("d1", "settings"), "c2")
    await world.delegate("c2", world.delegate_of(proxy, cluster_name=OTHER))
    await world.reconcile()
    assert world.writes("c2") == []
    assert "finalizers" not in world.stored()["metadata"]


async def test_someone_elses_namesake_is_left_alone_and_reported_once(world: World):
    await world.source(config_map())
    await world.connect("c2")
    theirs = {"metadata": {"name": "settings", "namespace": NS}, "data": {}}
    world.targets["c2"].server.add(CONFIGMAPS, theirs)
    proxy = await world.proxy(pod_using("d1", "settings"), "c2")
    await world.delegate("c2", world.delegate_of(proxy))

    def held() -> bool:
        cached = world.maps.sources.get("settings", NS)
        return cached is not None and keys.FINALIZER in cached["metadata"].get("finalizers", ())

    await world.reconcile()  # the first attempt: the finalizer on, then AlreadyExists
    await until(held)
    await world.reconcile()  # the finalizer's own event
    await until(lambda: not held())
    await world.reconcile()  # a later one
    assert world.copies("c2")["settings"]["data"] == {}
    assert [verb for verb, _ in world.writes("c2")] == ["create"], "tried once"
    await until(lambda: world.warnings())
    await settle()
    assert world.warnings() == [("settings", "CopyConflict", 1)]
    # Nothing of ours holds the source: the finalizer went with the failed attempt.
    assert not world.stored()["metadata"].get("finalizers")


# -- pods that only claim to be delegates ---------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"name": "mine"}, id="another name"),
        pytest.param({"namespace": "other"}, id="another namespace"),
    ],
)
async def test_a_pod_carrying_a_proxys_uid_gets_nothing(world: World, changes: dict):
    """The proxy pod exists and is bound to c2; a pod there copies its labels and annotations
    and says it uses "settings": that is not its delegate. (c2 is a ClusterTarget: pods of every
    namespace are seen there.)"""
    for ns in (NS, "other"):
        await world.source(config_map(ns=ns))
    await world.connect("c2", ns=None)
    proxy = await world.proxy(pod_using("d1", "settings"), "c2")
    await world.delegate("c2", world.delegate_of(proxy, **changes))
    for ns in (NS, "other"):
        await world.reconcile(ns=ns)
    assert world.writes("c2") == []
    for ns in (NS, "other"):
        assert "finalizers" not in world.stored(ns=ns)["metadata"]


async def test_a_delegate_counts_only_where_its_proxy_pod_is_placed(world: World):
    await world.source(config_map())
    await world.connect("c2")
    await world.connect("c3")
    proxy = await world.proxy(pod_using("d1", "settings"), "c3")
    await world.delegate("c2", world.delegate_of(proxy))
    await world.reconcile()
    assert world.writes("c2") == []
    assert world.writes("c3") == [], "no delegate there"
    assert "finalizers" not in world.stored()["metadata"]


async def test_only_what_the_proxy_pod_itself_uses_follows(world: World):
    """A pod in the target under the delegate's name (the delegate deleted, say) may claim any
    config map of the namespace: only those the proxy pod uses too are copied."""
    await world.source(config_map())
    await world.source(config_map("private"))
    await world.connect("c2")
    proxy = await world.proxy(pod_using("d1", "settings"), "c2")
    await world.delegate("c2", world.delegate_of(proxy, "private"))
    await world.reconcile("private")
    assert world.writes("c2") == []
    assert "finalizers" not in world.stored("private")["metadata"]


# -- targets that hang ----------------------------------------------------------------------------


async def test_a_hanging_target_holds_up_no_other(world: World, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(follow_module, "TARGET_TIMEOUT", 0.2)
    await world.source(config_map())
    await world.connect("slow", HoldingCluster("slow", verb="create", resource=CONFIGMAPS))
    await world.connect("fast")
    for target in ("slow", "fast"):
        proxy = await world.proxy(pod_using("d-" + target, "settings"), target)
        await world.delegate(target, world.delegate_of(proxy))
    with pytest.raises(RuntimeError, match="slow"):
        await asyncio.wait_for(world.reconcile(), 2)
    assert world.writes("fast") == [("create", "settings")]
    assert world.copies("slow") == {}


# -- copies deleted in a target by someone else ------------------------------------------------


async def delete_by_hand(world: World, target: str, name: str = "settings") -> str:
    """Someone in ``target`` deletes our copy of ``name`` there (once the follow controller's
    cache has it): its uid."""
    copies = world.maps.copies[world.node(target)]
    await until(lambda: copies.get(name, NS) is not None, what="the copy cached")
    uid = world.copies(target)[name]["metadata"]["uid"]
    await FakeClient(world.targets[target].server, name="admin").delete(CONFIGMAPS, name, NS)
    await until(
        lambda: (copies.get(name, NS) or {"metadata": {}})["metadata"].get("uid") != uid,
        what="its deletion seen",
    )
    return uid


async def made_again(world: World, target: str, uid: str, name: str = "settings") -> float:
    """Seconds until a new copy of ``name`` (another uid) is in ``target``."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    await until(
        lambda: (
            world.copies(target).get(name, {}).get("metadata", {}).get("uid") not in (None, uid)
        ),
        timeout=5,
        what="the copy made again",
    )
    return loop.time() - started


async def test_a_copy_deleted_in_its_target_is_made_again_at_once_then_later_and_later(
    world: World,
):
    """From the deletion's event, not a resync: at once the first time, after 1 s the second
    (a target deleting it again and again cannot keep us writing it)."""
    await world.source(config_map())
    await world.connect("c2")
    proxy = await world.proxy(pod_using("d1", "settings"), "c2")
    await world.delegate("c2", world.delegate_of(proxy))
    world.run()
    await until(lambda: "settings" in world.copies("c2"), what="the copy")
    assert await made_again(world, "c2", await delete_by_hand(world, "c2")) < 0.5
    again = await made_again(world, "c2", await delete_by_hand(world, "c2"))
    assert 0.9 < again < 1.5
    creates = [a for a in world.targets["c2"].server.writes if a.verb == "create"]
    assert len(creates) == 3


async def test_a_copy_deleted_by_the_controller_itself_is_not_held_back(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    """Unused, our copy is deleted; used again, it is made at once, however often that was."""
    monkeypatch.setattr(follow_module, "GRACE", 0.0)
    await world.source(config_map())
    await world.connect("c2")
    world.run()
    for i in range(3):
        proxy = await world.proxy(pod_using(f"d{i}", "settings"), "c2")
        delegate = await world.delegate("c2", world.delegate_of(proxy))
        await until(lambda: "settings" in world.copies("c2"), timeout=0.5, what="made at once")
        await world.targets["c2"].client.delete(PODS, delegate["metadata"]["name"], NS)
        await until(lambda: world.copies("c2") == {}, what="the unused copy deleted")


async def test_a_copy_no_longer_used_or_whose_source_is_gone_is_not_made_again(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(follow_module, "GRACE", 0.0)
    unused = await world.source(config_map(held=True))
    gone = await world.source(config_map("gone", held=True))
    await world.connect("c2")
    await world.copy("c2", unused)
    await world.copy("c2", gone)
    await world.local.client.delete(CONFIGMAPS, "gone", NS)  # held by our finalizer
    await delete_by_hand(world, "c2", "settings")
    await delete_by_hand(world, "c2", "gone")
    world.run()
    await until(lambda: named(world.api, CONFIGMAPS, "gone", NS) is None, what="source let go")
    await settle(0.2)
    assert world.copies("c2") == {}
    assert not [a for a in world.targets["c2"].server.writes if a.verb == "create"]


async def test_a_target_deleting_a_copy_again_and_again_holds_up_no_other(world: World):
    await world.source(config_map())
    for target in ("hostile", "c3"):
        await world.connect(target)
        proxy = await world.proxy(pod_using("d-" + target, "settings"), target)
        await world.delegate(target, world.delegate_of(proxy))
    world.run()
    await until(lambda: "settings" in world.copies("hostile"), what="the copy")
    for _ in range(3):  # made again at once, then after 1 s
        await made_again(world, "hostile", await delete_by_hand(world, "hostile"))
    uid = await delete_by_hand(world, "hostile")  # the fourth: 4 s
    assert await made_again(world, "c3", await delete_by_hand(world, "c3")) < 0.5
    await settle(0.5)
    assert world.copies("hostile").get("settings") is None, "still waiting"
    assert (await made_again(world, "hostile", uid)) > 2


async def change_by_hand(world: World, target: str, value: str, name: str = "settings") -> None:
    """Someone in ``target`` changes our copy of ``name`` there, once it is back as written
    and cached so."""
    copies = world.maps.copies[world.node(target)]
    source = named(world.api, CONFIGMAPS, name, NS)
    await until(
        lambda: (
            world.copies(target)[name]["data"] == source["data"]
            and (copies.get(name, NS) or {}).get("hash") == world.maps.sources.get(name, NS)["hash"]
        ),
        what="the copy as written",
    )
    admin = FakeClient(world.targets[target].server, name="admin")
    await admin.patch(CONFIGMAPS, name, {"data": {"GREETING": value}}, NS)


async def written_back(world: World, target: str, name: str = "settings") -> float:
    """Seconds until the copy of ``name`` in ``target`` says what its source says again."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    source = named(world.api, CONFIGMAPS, name, NS)
    await until(
        lambda: world.copies(target)[name]["data"] == source["data"],
        timeout=5,
        what="the copy written back",
    )
    return loop.time() - started


async def test_a_copy_changed_in_its_target_again_and_again_is_written_back_later_and_later(
    world: World,
):
    """Someone in a target (or its server) changes our copy as soon as it is written back: at
    once the first time, then after 1 s, 2 s... (before: one write per change, at the pace of
    whoever changes it); another target's copy changed meanwhile is written back at once, and so
    is a change of the source."""
    await world.source(config_map())
    for target in ("hostile", "c3"):
        await world.connect(target)
        proxy = await world.proxy(pod_using("d-" + target, "settings"), target)
        await world.delegate(target, world.delegate_of(proxy))
    world.run()
    await until(lambda: "settings" in world.copies("hostile"), what="the copy")
    await change_by_hand(world, "hostile", "owned-1")
    assert await written_back(world, "hostile") < 0.5
    await change_by_hand(world, "hostile", "owned-2")
    assert 0.9 < await written_back(world, "hostile") < 1.5
    await change_by_hand(world, "hostile", "owned-3")  # the third: 2 s
    await change_by_hand(world, "c3", "changed")
    assert await written_back(world, "c3") < 0.5
    await settle(0.5)
    assert world.copies("hostile")["settings"]["data"]["GREETING"] == "owned-3", "still waiting"
    await world.local.client.patch(CONFIGMAPS, "settings", {"data": {"GREETING": "bye"}}, NS)
    assert await written_back(world, "hostile") < 0.5


# -- before a delegate is created -----------------------------------------------------------------


async def test_prepare_returns_in_time_whatever_the_target_does(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(follow_module, "PREPARE_TIMEOUT", 0.2)
    await world.source(config_map())
    slow = await world.connect("slow", HoldingCluster("slow", verb="create", resource=CONFIGMAPS))
    proxy = await world.proxy(pod_using("d1", "settings"), None)  # being placed
    pod = world.delegate_of(proxy)
    world.run()
    await asyncio.wait_for(world.follow.prepare(slow, pod), 2)
    # Another owner's target (the slow one holds its namespace's share of the workers: the
    # request prepare made and the reconcile of the whole config map each wait on it).
    fast = await world.connect("fast", ns=None)
    await asyncio.wait_for(world.follow.prepare(fast, pod), 2)
    assert world.made("fast") == ["settings"]
    assert world.copies("slow") == {}, "still waiting"


class Slow(FakeClient):
    """A target whose API server takes ``delay`` seconds to create anything."""

    def __init__(self, server: FakeServer, *, name: str, delay: float) -> None:
        super().__init__(server, name=name)
        self.delay = delay

    async def call(self, call: Call, **options: Any) -> Any:
        if call.verb == "create":
            await asyncio.sleep(self.delay)
        return await super().call(call, **options)


async def test_prepare_waits_for_every_copy_even_when_the_targets_workers_are_all_taken(
    world: World,
):
    """A pod using two config maps: each copy's request holds one of the two workers its
    target's owner may hold, and the reconciles of the whole config maps find none free; they
    must not answer prepare before the copies are made."""
    await world.source(config_map("a"))
    await world.source(config_map("b"))
    slow = FakeCluster("slow", FakeServer(name="slow"))
    slow.client = Slow(slow.server, name="slow", delay=0.1)
    target = await world.connect("slow", slow)
    proxy = await world.proxy(pod_using("d1", "a", "b"), None)
    world.run()
    await asyncio.wait_for(world.follow.prepare(target, world.delegate_of(proxy, "a", "b")), 5)
    assert sorted(world.copies("slow")) == ["a", "b"], "both copies there when prepare returns"


async def test_prepare_copies_only_what_the_proxy_pods_own_spec_uses(world: World):
    """A saved manifest that names a config map the pod itself never used copies nothing of
    it."""
    await world.source(config_map())
    await world.source(config_map("db-password"))
    fast = await world.connect("fast")
    proxy = await world.proxy(pod_using("d1", "settings"), None)
    world.run()
    await world.follow.prepare(fast, world.delegate_of(proxy, "settings", "db-password"))
    assert world.made("fast") == ["settings"]
    await settle()
    writes = world.writes("fast")
    await world.gone_proxy("d1")
    await world.follow.prepare(fast, world.delegate_of(proxy))
    await settle()
    assert world.writes("fast") == writes, "no proxy pod: nothing"
    assert list(world.copies("fast")) == ["settings"]


async def test_prepare_writes_nothing_itself_the_follow_controller_does(
    world: World, monkeypatch: pytest.MonkeyPatch
):
    """One writer of copies: prepare asks the follow controller and waits for it, a while."""
    monkeypatch.setattr(follow_module, "PREPARE_TIMEOUT", 0.2)
    await world.source(config_map())
    fast = await world.connect("fast")
    proxy = await world.proxy(pod_using("d1", "settings"), None)
    # No workers: nobody answers.
    await asyncio.wait_for(world.follow.prepare(fast, world.delegate_of(proxy)), 2)
    assert world.writes("fast") == []
    world.run()
    await asyncio.wait_for(world.follow.prepare(fast, world.delegate_of(proxy)), 2)
    assert world.made("fast") == ["settings"]

"""The target's keeper on the in-memory API server of :mod:`multicluster.testing`: what counts as
a source's heartbeat, and what it recreates. Heartbeat Leases and delegates are created,
changed and deleted on this cluster's fake API server, whose caches are the real informers; the
keeper runs (it follows the Leases), and a test asks it to look (``look``, what it does every few
seconds) on a clock of its own, then reads the server: pods, their creations and Events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from multicluster.resources import LEASES, PODS
from multicluster.testing import FakeCluster
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.keepalive import AWAY, RECREATED, heartbeat_lease, heartbeat_name
from multicluster_scheduler.api.proxy import delegate_name
from multicluster_scheduler.targets import keeper as keeper_module
from multicluster_scheduler.targets.keeper import MAX_RECREATIONS, DelegateKeeper
from tests.targets.test_keepalive import SOURCE, delegate
from tests.worlds import broken, events, named, until

HERE = "cluster2-uid"
NS = "team"
RENEWED = "2026-01-01T00:00:00.000000Z"


class Clock:
    """The keeper's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def lease(source: str = SOURCE, renewed: str = RENEWED, **meta: object) -> dict:
    made = heartbeat_lease(source, NS, renewed)
    made["metadata"].update(meta)
    return made


def keepable(parent: str = "web-1", **changes: object) -> dict:
    """A delegate of SOURCE that restarts always (``parent``: its proxy pod's name)."""
    pod = delegate(**changes)
    pod["metadata"]["name"] = delegate_name(parent, "p-uid")
    pod["metadata"]["annotations"][keys.PARENT_NAME] = parent
    return pod


class World:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.local = FakeCluster("local")
        self.api = self.local.server
        self.client = self.local.client
        self.keeper = DelegateKeeper(self.local, HERE)
        self._running: asyncio.Task | None = None

    async def start(self) -> None:
        self.local.start()
        assert await self.local.wait_synced(3)
        self._running = asyncio.create_task(self.keeper.run())

    async def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)
        await self.local.stop()

    # -- heartbeats --

    async def beat(self, source: str = SOURCE, **meta: object) -> dict:
        """A heartbeat Lease created, once the keeper follows it."""
        made = await self.client.create(LEASES, lease(source, **meta), NS)
        await self.followed(made)
        if source != HERE:
            await until(lambda: NS in self.keeper.pods, what="pods watched")
            await until(lambda: self.keeper.pods[NS].has_synced, what="pods cached")
        return made

    async def change(self, source: str = SOURCE, patch: dict | None = None) -> dict:
        """A heartbeat Lease patched, once the keeper saw the change."""
        changed = await self.client.patch(LEASES, heartbeat_name(source), patch or {}, NS)
        await self.followed(changed)
        return changed

    async def followed(self, obj: dict) -> None:
        meta = obj["metadata"]

        def seen() -> bool:
            held = self.keeper.leases.get(meta["name"], NS)
            return (
                held is not None
                and held["metadata"]["resourceVersion"] == (meta["resourceVersion"])
            )

        await until(seen, what="the lease seen")

    # -- delegates --

    async def gone(self, *pods: dict) -> None:
        """Delegates that ran here, then were deleted (their containers ended at once), once
        the keeper saw them go."""
        cache = self.keeper.pods[NS]
        made = self.api.add(PODS, *pods)
        names = [p["metadata"]["name"] for p in made]
        await until(lambda: all(cache.get(n, NS) is not None for n in names), what="cached")
        for name in names:
            await self.client.delete(PODS, name, NS, grace_period_seconds=0)
        await until(lambda: all(cache.get(n, NS) is None for n in names), what="seen gone")

    def created(self) -> list[str]:
        """The pods created through the API (not by the test: it adds them), in order."""
        return [a.name or "" for a in self.api.writes if a.verb == "create" and a.resource == PODS]

    async def look(self) -> None:
        await self.keeper.look()


@pytest.fixture
async def world(monkeypatch: pytest.MonkeyPatch) -> AsyncGenerator[World, None]:
    clock = Clock()
    monkeypatch.setattr(keeper_module, "time", clock)  # the keeper's clock, only
    monkeypatch.setattr(keeper_module, "LOOK_EVERY", 3600.0)  # it looks when the test says
    made = World(clock)
    await made.start()
    yield made
    await made.stop()


async def test_a_delegate_gone_while_its_source_is_silent_is_recreated_once(world: World):
    await world.beat()
    pod = keepable()
    name = pod["metadata"]["name"]
    await world.gone(pod)
    await world.look()
    assert world.created() == []
    world.clock.now += AWAY
    await world.look()
    assert world.created() == [name]
    again = named(world.api, PODS, name, NS)
    assert again is not None
    assert RECREATED in again["metadata"]["annotations"]
    assert again["metadata"]["labels"] == pod["metadata"]["labels"]
    assert "nodeName" not in again["spec"], "placed again by the target's scheduler"
    await world.look()
    assert world.created() == [name]
    await until(lambda: events(world.api, NS))
    assert events(world.api, NS) == [(name, "Normal", "RecreatedWhileSourceAway", 1)]


async def test_nothing_is_decided_while_heartbeats_cannot_be_seen(world: World):
    await world.beat()
    await world.gone(keepable())
    world.clock.now += AWAY
    recover = await broken(world.keeper.leases, world.api)
    await world.look()
    assert world.created() == []
    recover()
    await until(lambda: world.keeper.leases.healthy, what="heartbeats seen again")
    await world.look()
    assert len(world.created()) == 1


async def test_an_ended_delegate_is_not_kept(world: World):
    """Evicted: its proxy pod failed and its owner replaced it; recreating it would run one
    replica too many, which nobody deletes."""
    await world.beat()
    evicted = keepable()
    evicted["status"] = {"phase": "Failed", "reason": "Evicted"}
    await world.gone(evicted)
    assert world.keeper.missing == {}
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []


async def test_a_renewal_after_the_delegate_went_means_the_source_decides(world: World):
    await world.beat()
    await world.gone(keepable())
    world.clock.now += 20
    await world.change(patch={"spec": {"renewTime": "2026-01-01T00:00:20.000000Z"}})
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    assert world.keeper.missing == {}


async def test_a_change_that_renews_nothing_is_no_heartbeat(world: World):
    """Whoever may write Leases there adds a finalizer, a label: the source is still away."""
    await world.beat()
    await world.gone(keepable())
    world.clock.now += 20
    await world.change(patch={"metadata": {"finalizers": ["example.com/keep"]}})
    await world.change(patch={"metadata": {"labels": {"example.com/team": "a"}}})
    world.clock.now += AWAY
    await world.look()
    assert len(world.created()) == 1


async def test_a_heartbeat_being_deleted_is_gone(world: World):
    """A finalizer on the Lease kept it after the source deleted it with its Target: the
    delegates deleted with the Target came back."""
    await world.beat(finalizers=["example.com/keep"])
    await world.gone(keepable())
    await world.client.delete(LEASES, heartbeat_name(SOURCE), NS)
    await until(lambda: world.keeper.heartbeats == {}, what="the heartbeat forgotten")
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    assert world.keeper.pods == {}, "nothing watched there any more"
    assert named(world.api, LEASES, heartbeat_name(SOURCE), NS) is not None, "still deleting"


async def test_a_heartbeat_that_stops_being_one_takes_its_entry_with_it(world: World):
    for _ in range(20):
        await world.beat()
        assert world.keeper.heartbeats != {}
        await world.change(patch={"metadata": {"annotations": None}})
        assert world.keeper.heartbeats == {}, "no longer a heartbeat"
        assert world.keeper.pods == {}
        await world.client.delete(LEASES, heartbeat_name(SOURCE), NS)
        await until(lambda: world.keeper.leases.get(heartbeat_name(SOURCE), NS) is None)
    assert world.keeper.heartbeats == {}
    assert world.keeper.pods == {}
    assert [i for i in world.local.informers if i.resource == PODS] == [], "no pods watched"


async def test_a_namespace_watched_again_gets_a_new_watch(world: World):
    await world.beat()
    first = world.keeper.pods[NS]
    await world.client.delete(LEASES, heartbeat_name(SOURCE), NS)
    await until(lambda: NS not in world.keeper.pods, what="pods no longer watched")
    await world.beat()
    assert world.keeper.pods[NS] is not first
    await until(lambda: not first.running, what="the first watch stopped")
    # The new watch works: what goes now is noted, and recreated.
    pod = keepable()
    await world.gone(pod)
    world.clock.now += AWAY
    await world.look()
    assert world.created() == [pod["metadata"]["name"]]


async def test_recreations_are_paced(world: World):
    await world.beat()
    await world.gone(*(keepable(f"web-{i}") for i in range(MAX_RECREATIONS + 10)))
    world.clock.now += AWAY
    await world.look()
    assert len(world.created()) == MAX_RECREATIONS
    await world.look()
    assert len(world.created()) == MAX_RECREATIONS + 10
    assert len(set(world.created())) == MAX_RECREATIONS + 10


async def test_this_clusters_own_heartbeat_and_delegates_are_never_kept(world: World):
    await world.beat(HERE)
    assert world.keeper.pods == {}
    assert world.keeper.heartbeats == {}
    await world.beat()  # another cluster's: this namespace's delegates are watched
    own = keepable(source=HERE)
    await world.gone(own)
    assert world.keeper.missing == {}
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []

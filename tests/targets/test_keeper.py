"""The target's keeper on the in-memory API server of :mod:`multicluster.testing`: what counts as
a source's heartbeat, whose word it takes, and what it recreates. SourceHeartbeats, Sources
and delegates are created, changed and deleted on this cluster's fake API server, whose caches
are the real informers; the keeper runs (it follows the heartbeats), and a test asks it to look
(``look``, what it does every few seconds) on a clock of its own, then reads the server: pods,
their creations and Events. Whether a writer may create pods (a SubjectAccessReview on a real
server, checked end to end in ``e2e/test_keepalive.py``) is the test's ``allowed``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from multicluster.resources import EVENTS, LEASES, PODS, SERVICEACCOUNTS
from multicluster.testing import FakeCluster
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.keepalive import (
    AWAY,
    LEGACY_HEARTBEAT_LABEL,
    RECREATED,
    heartbeat_name,
    heartbeat_object,
)
from multicluster_scheduler.api.proxy import delegate_name
from multicluster_scheduler.api.resources import CLUSTER_SOURCES, SOURCE_HEARTBEATS, SOURCES
from multicluster_scheduler.targets import keeper as keeper_module
from multicluster_scheduler.targets.keeper import MAX_RECREATIONS, DelegateKeeper
from tests.targets.test_keepalive import SOURCE, WRITER, delegate
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


def keepable(parent: str = "web-1", **changes: object) -> dict:
    """A delegate of SOURCE that restarts always (``parent``: its proxy pod's name)."""
    pod = delegate(**changes)
    pod["metadata"]["name"] = delegate_name(parent, "p-uid")
    pod["metadata"]["annotations"][keys.PARENT_NAME] = parent
    for field in ("uid", "generation"):
        pod["metadata"].pop(field)  # the server's
    return pod


def source(name: str = "c1", account: str = "c1", **meta: object) -> dict:
    return {
        "apiVersion": SOURCES.api_version,
        "kind": "Source",
        "metadata": {"name": name, "namespace": NS, **meta},
        "spec": {"serviceAccountName": account},
    }


def account(name: str = "c1") -> dict:
    """The Source's service account (its uid the server's)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": NS},
    }


class World:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.local = FakeCluster("local")
        self.api = self.local.server
        self.client = self.local.client
        self.allowed = True
        self.reviewed: list[tuple[str, list[str], str]] = []
        self.keeper = DelegateKeeper(self.local, HERE, access=self._access)
        self._running: asyncio.Task | None = None

    async def _access(self, user: str, groups: list[str], namespace: str) -> str | None:
        self.reviewed.append((user, groups, namespace))
        return None if self.allowed else f"{user} may not create pods in namespace {namespace}"

    async def start(self) -> None:
        self.api.add(SOURCES, source())
        (self.account,) = self.api.add(SERVICEACCOUNTS, account())
        self.local.start()
        assert await self.local.wait_synced(3)
        self._running = asyncio.create_task(self.keeper.run())

    async def stop(self) -> None:
        if self._running is not None:
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)
        await self.local.stop()

    # -- heartbeats --

    async def beat(
        self,
        source: str = SOURCE,
        listed: dict[str, str] | None = None,
        writer: str = WRITER,
        writer_uid: str | None = None,
        **meta: object,
    ) -> dict:
        """A heartbeat created, once the keeper follows it; written by ``writer`` of uid
        ``writer_uid`` (default: the account's, when the writer is the Source's account)."""
        if writer_uid is None:
            writer_uid = self.account["metadata"]["uid"] if writer == WRITER else ""
        made = heartbeat_object(source, NS, writer, RENEWED, listed or {}, writer_uid)
        made["metadata"].update(meta)
        made = await self.client.create(SOURCE_HEARTBEATS, made, NS)
        await self.followed(made)
        if source != HERE:
            await until(lambda: NS in self.keeper.pods, what="pods watched")
            await until(lambda: self.keeper.pods[NS].has_synced, what="pods cached")
        return made

    async def change(self, source: str = SOURCE, patch: dict | None = None) -> dict:
        """A heartbeat patched, once the keeper saw the change."""
        changed = await self.client.patch(
            SOURCE_HEARTBEATS, heartbeat_name(source), patch or {}, NS
        )
        await self.followed(changed)
        return changed

    async def list_(self, *pods: dict, renewed: str | None = None) -> None:
        """The source lists ``pods`` in its heartbeat (renewing it if ``renewed``)."""
        spec: dict = {"delegates": {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}}
        if renewed:
            spec["renewTime"] = renewed
        await self.change(patch={"spec": spec})

    async def followed(self, obj: dict) -> None:
        meta = obj["metadata"]

        def seen() -> bool:
            held = self.keeper.heartbeat_informer.get(meta["name"], NS)
            return (
                held is not None
                and held["metadata"]["resourceVersion"] == (meta["resourceVersion"])
            )

        await until(seen, what="the heartbeat seen")

    # -- delegates --

    async def run(self, *pods: dict) -> list[dict]:
        """Delegates that run here, once cached."""
        cache = self.keeper.pods[NS]
        made = self.api.add(PODS, *pods)
        names = [p["metadata"]["name"] for p in made]
        await until(lambda: all(cache.get(n, NS) is not None for n in names), what="cached")
        return made

    async def delete(self, *pods: dict) -> None:
        """Delete them (their containers end at once), once the keeper saw them go."""
        cache = self.keeper.pods[NS]
        names = [p["metadata"]["name"] for p in pods]
        for name in names:
            await self.client.delete(PODS, name, NS, grace_period_seconds=0)
        await until(lambda: all(cache.get(n, NS) is None for n in names), what="seen gone")

    async def gone(self, *pods: dict, listed: bool = True) -> list[dict]:
        """Delegates that ran here, listed by their source if ``listed``, then deleted."""
        made = await self.run(*pods)
        if listed:
            await self.list_(*made)
        await self.delete(*made)
        return made

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


async def running(world: World, name: str, message: str = "") -> None:
    """An event of the pod (its status changed)."""
    status = {"status": {"phase": "Running", "message": message}}
    await world.client.patch(PODS, name, status, NS, subresource="status")


def reasons(world: World) -> list[tuple[str, str, str, int]]:
    return events(world.api, NS)


def refusals(world: World) -> list[str]:
    """The messages of the NotRecreated events."""
    return [e["message"] for e in world.api.objects(EVENTS, NS) if e["reason"] == "NotRecreated"]


async def refused(world: World, count: int = 1) -> list[str]:
    await until(lambda: len(refusals(world)) >= count, what="the refusal said")
    return refusals(world)


async def test_a_listed_delegate_gone_while_its_source_is_silent_is_recreated_once(world: World):
    await world.beat()
    (pod,) = await world.gone(keepable())
    name = pod["metadata"]["name"]
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
    assert world.reviewed == [
        (
            WRITER,
            ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"],
            NS,
        )
    ]
    await world.look()
    assert world.created() == [name]
    await until(lambda: reasons(world))
    assert reasons(world) == [(name, "Normal", "RecreatedWhileSourceAway", 1)]
    # Deleted again while its source is still away: a new uid, which no heartbeat lists.
    await until(lambda: world.keeper.pods[NS].get(name, NS) is not None, what="cached")
    await world.delete(again)
    world.clock.now += AWAY
    await world.look()
    assert world.created() == [name], "once per pod the source created"
    await until(lambda: len(reasons(world)) == 2)
    assert (name, "Warning", "NotRecreated", 1) in reasons(world)


async def test_a_pod_shaped_like_a_delegate_that_its_source_does_not_list_is_not_recreated(
    world: World,
):
    """Someone with ``edit`` here makes a pod named and annotated as the source's delegate, in a
    namespace where that source's heartbeat is, and deletes it while the source is away."""
    await world.beat()
    (real,) = await world.run(keepable("web-1"))
    await world.list_(real)
    (impostor,) = await world.run(keepable("impostor"))
    cached = world.keeper.pods[NS]
    assert "spec" not in cached.get(impostor["metadata"]["name"], NS), "its spec: not held"
    await world.delete(impostor)
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    (message,) = await refused(world)
    assert "does not list it" in message
    assert world.keeper.missing == {}, "said once"
    await world.look()
    assert len(refusals(world)) == 1


async def test_a_lease_shaped_like_the_previous_releases_heartbeat_does_nothing(world: World):
    lease = {
        "metadata": {
            "name": heartbeat_name(SOURCE),
            "labels": {LEGACY_HEARTBEAT_LABEL: "true"},
            "annotations": {keys.PARENT_CLUSTER_NAME: SOURCE},
        },
        "spec": {"holderIdentity": SOURCE, "renewTime": RENEWED},
    }
    await world.client.create(LEASES, lease, NS)
    await asyncio.sleep(0.05)
    assert world.keeper.pods == {}, "no pods watched: nothing to keep"
    assert world.keeper.heartbeats == {}


async def test_a_heartbeat_written_by_no_source_keeps_nothing_alive(world: World):
    """A heartbeat a user wrote (the policy makes its writer theirs): no Source names them."""
    await world.beat(writer="alice")
    await world.gone(keepable())
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    (message,) = await refused(world)
    assert "last written by alice" in message
    assert world.reviewed == [], "not asked: refused before"


async def test_a_source_being_deleted_keeps_nothing_alive_a_cluster_source_does(world: World):
    await world.client.delete(SOURCES, "c1", NS)  # (no finalizer here: gone at once)
    world.api.add(SOURCES, source("c1", finalizers=["example.com/keep"]))
    await world.client.delete(SOURCES, "c1", NS)
    await until(lambda: world.keeper.sources.get("c1", NS)["metadata"].get("deletionTimestamp"))
    await world.beat()
    await world.gone(keepable("web-1"))
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    (message,) = await refused(world)
    assert "no Source of namespace team nor any ClusterSource" in message
    everywhere = {
        "metadata": {"name": "c1"},
        "spec": {"serviceAccount": {"name": "c1", "namespace": NS}},
    }
    world.api.add(CLUSTER_SOURCES, everywhere)
    await until(lambda: world.keeper.cluster_sources.get("c1") is not None)
    (second,) = await world.gone(keepable("web-2"))
    world.clock.now += AWAY
    await world.look()
    assert world.created() == [second["metadata"]["name"]]


async def test_a_writer_that_may_no_longer_create_pods_keeps_nothing_alive(world: World):
    await world.beat()
    await world.gone(keepable())
    world.allowed = False
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    (message,) = await refused(world)
    assert f"{WRITER} may not create pods in namespace {NS}" in message


async def test_a_heartbeat_written_as_the_sources_account_without_its_token_keeps_nothing_alive(
    world: World,
):
    """Kubernetes' ``edit`` role lets whoever has it in a namespace impersonate its service
    accounts, a namespaced Source's among them: the API server authenticates no uid then, and
    the chart's policy makes ``writerUID`` the writer's. Before, such a heartbeat kept alive the
    privileged pods its writer listed after their access was gone."""
    await world.beat(writer_uid="")
    await world.gone(keepable())
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    (message,) = await refused(world)
    assert f"written as service account {NS}/c1 without a token of that account" in message
    assert world.reviewed == [], "not asked: refused before"


async def test_a_heartbeat_written_with_a_token_of_an_account_made_again_keeps_nothing_alive(
    world: World,
):
    """Someone who could edit the namespace made a token of the Source's account, and wrote a
    heartbeat with it; the admin, taking their access away, deletes the account (its tokens die)
    and it is made again: what the old tokens wrote no longer counts either."""
    await world.beat()
    await world.gone(keepable("web-1"), keepable("web-2"))
    await world.client.delete(SERVICEACCOUNTS, "c1", NS)
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    gone, *_ = await refused(world, 2)
    assert f"service account {NS}/c1, which wrote the heartbeat, no longer exists" in gone
    await world.client.create(SERVICEACCOUNTS, account(), NS)
    await world.gone(keepable("web-3"))
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    messages = await refused(world, 3)
    assert any(f"an earlier service account {NS}/c1 (deleted and made again" in m for m in messages)


async def test_a_heartbeat_written_by_a_user_is_taken_without_a_uid(world: World):
    """A Source may name a user (a client certificate has no uid): ``edit`` grants no
    impersonation of users."""
    await world.client.patch(SOURCES, "c1", {"spec": {"userName": "cluster1"}}, NS)
    await until(lambda: world.keeper.sources.get("c1", NS)["spec"].get("userName"))
    await world.beat(writer="cluster1")
    (pod,) = await world.gone(keepable())
    world.clock.now += AWAY
    await world.look()
    assert world.created() == [pod["metadata"]["name"]]


async def test_a_delegate_whose_spec_was_changed_after_its_creation_is_not_recreated(
    world: World,
):
    """Someone with ``edit`` here changes a real delegate's image, then it is deleted while its
    source is away: not brought back as they left it."""
    await world.beat()
    (pod,) = await world.run(keepable())
    await world.list_(pod)
    name = pod["metadata"]["name"]
    patch = {"spec": {"containers": [{"name": "web", "image": "evil"}]}}
    await world.client.patch(PODS, name, patch, NS)
    await world.delete(pod)
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    (message,) = await refused(world)
    assert "spec was changed" in message


async def test_a_delegate_listed_after_its_last_event_is_held_from_its_deletion(world: World):
    """Its source lists it after the target answered its creation: the pod's last event may
    come before. What recreating it needs comes with its deletion; before, with its next
    event."""
    await world.beat()
    first, second = await world.run(keepable("web-1"), keepable("web-2"))
    cached = world.keeper.pods[NS]
    assert "spec" not in cached.get(first["metadata"]["name"], NS)
    await world.list_(first, second)
    assert "spec" not in cached.get(first["metadata"]["name"], NS), "until its next event"
    await running(world, first["metadata"]["name"])
    await until(lambda: "spec" in cached.get(first["metadata"]["name"], NS), what="held")
    await world.delete(second)
    world.clock.now += AWAY
    await world.look()
    assert world.created() == [second["metadata"]["name"]]
    assert not [a for a in world.api.actions if a.verb == "get" and a.resource == PODS]


async def test_a_delegate_no_longer_listed_is_not_held_after_its_next_event(world: World):
    await world.beat()
    (pod,) = await world.run(keepable())
    name = pod["metadata"]["name"]
    await world.list_(pod)
    await running(world, name, "a")
    cached = world.keeper.pods[NS]
    await until(lambda: "spec" in cached.get(name, NS), what="held")
    await world.change(patch={"spec": {"delegates": {name: None}}})
    await running(world, name, "b")
    await until(lambda: "spec" not in cached.get(name, NS), what="no longer held")


async def test_nothing_is_decided_while_heartbeats_cannot_be_seen(world: World):
    await world.beat()
    await world.gone(keepable())
    world.clock.now += AWAY
    recover = await broken(world.keeper.heartbeat_informer, world.api)
    await world.look()
    assert world.created() == []
    recover()
    await until(lambda: world.keeper.heartbeat_informer.healthy, what="heartbeats seen again")
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
    assert refusals(world) == []


async def test_a_change_that_renews_nothing_is_no_heartbeat(world: World):
    """Whoever may write heartbeats there adds a finalizer, a label: the source is still away."""
    await world.beat()
    await world.gone(keepable())
    world.clock.now += 20
    await world.change(patch={"metadata": {"finalizers": ["example.com/keep"]}})
    await world.change(patch={"metadata": {"labels": {"example.com/team": "a"}}})
    world.clock.now += AWAY
    await world.look()
    assert len(world.created()) == 1


async def test_a_heartbeat_being_deleted_is_gone(world: World):
    """A finalizer on the heartbeat kept it after the source deleted it with its Target: the
    delegates deleted with the Target came back."""
    await world.beat(finalizers=["example.com/keep"])
    await world.gone(keepable())
    await world.client.delete(SOURCE_HEARTBEATS, heartbeat_name(SOURCE), NS)
    await until(lambda: world.keeper.heartbeats == {}, what="the heartbeat forgotten")
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []
    assert world.keeper.pods == {}, "nothing watched there any more"
    assert named(world.api, SOURCE_HEARTBEATS, heartbeat_name(SOURCE), NS) is not None


async def test_a_heartbeat_that_stops_being_one_takes_its_entry_with_it(world: World):
    for _ in range(20):
        await world.beat()
        assert world.keeper.heartbeats != {}
        await world.change(patch={"spec": {"source": "cluster3-uid"}})
        assert world.keeper.heartbeats == {}, "no longer a heartbeat (not named after it)"
        assert world.keeper.pods == {}
        await world.client.delete(SOURCE_HEARTBEATS, heartbeat_name(SOURCE), NS)
        await until(lambda: world.keeper.heartbeat_informer.get(heartbeat_name(SOURCE), NS) is None)
    assert world.keeper.heartbeats == {}
    assert world.keeper.pods == {}
    assert [i for i in world.local.informers if i.resource == PODS] == [], "no pods watched"


async def test_a_namespace_watched_again_gets_a_new_watch(world: World):
    await world.beat()
    first = world.keeper.pods[NS]
    await world.client.delete(SOURCE_HEARTBEATS, heartbeat_name(SOURCE), NS)
    await until(lambda: NS not in world.keeper.pods, what="pods no longer watched")
    await world.beat()
    assert world.keeper.pods[NS] is not first
    await until(lambda: not first.running, what="the first watch stopped")
    # The new watch works: what goes now is noted, and recreated.
    (pod,) = await world.gone(keepable())
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
    await world.gone(keepable(source=HERE), listed=False)
    assert world.keeper.missing == {}
    world.clock.now += AWAY
    await world.look()
    assert world.created() == []

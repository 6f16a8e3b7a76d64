"""The target's keeper, from the events it is given: what counts as a source's heartbeat, and
what it recreates (the API server's side is the e2e test's)."""

from __future__ import annotations

import copy

import pytest

from multicluster import Cluster, ClusterConfig
from multicluster.informer import ADDED, DELETED, MODIFIED
from multicluster_scheduler.api.keepalive import AWAY, heartbeat_lease
from multicluster_scheduler.targets import keeper as keeper_module
from multicluster_scheduler.targets.keeper import MAX_RECREATIONS, DelegateKeeper
from tests.targets.test_keepalive import SOURCE, delegate

HERE = "cluster2-uid"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def world(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(keeper_module.time, "monotonic", clock.monotonic)
    local = Cluster("local", ClusterConfig("https://127.0.0.1:1", None))
    keeper = DelegateKeeper(local, HERE)
    keeper.leases._synced.set()  # its watch works (what the e2e test covers)
    created: list[dict] = []

    async def create(_resource, body, namespace=None):
        created.append(body)
        return body

    monkeypatch.setattr(local.client, "create", create)
    keeper.events.emit = lambda *args, **kwargs: None  # type: ignore[method-assign]
    return keeper, clock, created


def lease(renewed: str = "2026-01-01T00:00:00.000000Z", namespace: str = "team") -> dict:
    made = heartbeat_lease(SOURCE, namespace, renewed)
    return made


async def test_a_delegate_gone_while_its_source_is_silent_is_recreated_once(world):
    keeper, clock, created = world
    keeper._lease_event(ADDED, lease(), None, True)
    gone = keeper._kept(delegate())
    keeper._pod_event(DELETED, gone, None, False)
    await keeper.look()
    assert created == []
    clock.now += AWAY
    await keeper.look()
    assert [p["metadata"]["name"] for p in created] == [gone["metadata"]["name"]]
    await keeper.look()
    assert len(created) == 1


async def test_nothing_is_decided_while_heartbeats_cannot_be_seen(world):
    keeper, clock, created = world
    keeper._lease_event(ADDED, lease(), None, True)
    keeper._pod_event(DELETED, keeper._kept(delegate()), None, False)
    clock.now += AWAY
    keeper.leases.last_error = RuntimeError("watch failed")
    await keeper.look()
    assert created == []
    keeper.leases.last_error = None
    await keeper.look()
    assert len(created) == 1


async def test_an_ended_delegate_is_not_kept(world):
    """Evicted: its proxy pod failed and its owner replaced it; recreating it would run one
    replica too many, which nobody deletes."""
    keeper, _clock, _created = world
    evicted = delegate()
    evicted["status"] = {"phase": "Failed", "reason": "Evicted"}
    assert "source" not in keeper._kept(evicted)


async def test_a_renewal_after_the_delegate_went_means_the_source_decides(world):
    keeper, clock, created = world
    keeper._lease_event(ADDED, lease(), None, True)
    keeper._pod_event(DELETED, keeper._kept(delegate()), None, False)
    clock.now += 20
    keeper._lease_event(MODIFIED, lease("2026-01-01T00:00:20.000000Z"), lease(), False)
    clock.now += AWAY
    await keeper.look()
    assert created == []
    assert keeper.missing == {}


async def test_a_change_that_renews_nothing_is_no_heartbeat(world):
    """Whoever may write Leases there adds a finalizer, a label: the source is still away."""
    keeper, clock, created = world
    keeper._lease_event(ADDED, lease(), None, True)
    keeper._pod_event(DELETED, keeper._kept(delegate()), None, False)
    clock.now += 20
    touched = lease()
    touched["metadata"]["finalizers"] = ["example.com/keep"]
    keeper._lease_event(MODIFIED, touched, lease(), False)
    clock.now += AWAY
    await keeper.look()
    assert len(created) == 1


async def test_a_heartbeat_being_deleted_is_gone(world):
    """A finalizer on the Lease kept it after the source deleted it with its Target: the
    delegates deleted with the Target came back."""
    keeper, clock, created = world
    keeper._lease_event(ADDED, lease(), None, True)
    keeper._pod_event(DELETED, keeper._kept(delegate()), None, False)
    deleting = lease()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    keeper._lease_event(MODIFIED, deleting, lease(), False)
    clock.now += AWAY
    await keeper.look()
    assert created == []
    assert keeper.heartbeats == {}
    assert keeper.pods == {}, "nothing watched there any more"


async def test_a_heartbeat_that_stops_being_one_takes_its_entry_with_it(world):
    keeper, _clock, _created = world
    for _ in range(100):
        keeper._lease_event(ADDED, lease(), None, False)
        stripped = lease()
        stripped["metadata"]["annotations"] = {}
        keeper._lease_event(MODIFIED, stripped, lease(), False)
        keeper._lease_event(DELETED, stripped, None, False)
    assert keeper.heartbeats == {}
    assert keeper._lease_sources == {}
    assert keeper.pods == {}


async def test_a_namespace_watched_again_gets_a_new_watch(world):
    keeper, _clock, _created = world
    keeper._lease_event(ADDED, lease(), None, False)
    first = keeper.pods["team"]
    keeper._lease_event(DELETED, lease(), None, False)
    keeper._lease_event(ADDED, lease(), None, False)
    assert keeper.pods["team"] is not first


async def test_recreations_are_paced(world):
    keeper, clock, created = world
    keeper._lease_event(ADDED, lease(), None, True)
    for i in range(MAX_RECREATIONS + 10):
        pod = copy.deepcopy(keeper._kept(delegate()))
        pod["metadata"]["name"] += f"-{i}"
        keeper._pod_event(DELETED, pod, None, False)
    clock.now += AWAY
    await keeper.look()
    assert len(created) == MAX_RECREATIONS
    await keeper.look()
    assert len(created) == MAX_RECREATIONS + 10


async def test_this_clusters_own_heartbeat_and_delegates_are_never_kept(world):
    keeper, _clock, _created = world
    own = heartbeat_lease(HERE, "team", "2026-01-01T00:00:00.000000Z")
    keeper._lease_event(ADDED, own, None, True)
    assert keeper.pods == {}
    assert "source" not in keeper._kept(delegate(source=HERE))

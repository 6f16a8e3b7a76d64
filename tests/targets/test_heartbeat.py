"""A source's heartbeats: where they go, whatever a target sends, and what they list: the
delegates this cluster created, from the target's answers, written one request at a time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator

import pytest

from multicluster import Cluster, ClusterConfig
from multicluster.errors import Forbidden, NotFound
from multicluster.resources import LEASES, PODS
from multicluster.testing import FakeCluster
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.keepalive import (
    AWAY,
    HEARTBEAT_PERIOD,
    MAX_DELEGATES,
    heartbeat_name,
    heartbeat_object,
)
from multicluster_scheduler.api.resources import SOURCE_HEARTBEATS
from multicluster_scheduler.targets import heartbeat as heartbeat_module
from multicluster_scheduler.targets.heartbeat import LINGER, PRUNE_AFTER, SourceHeartbeat
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry
from tests.worlds import attach, named, until

HERE = "cluster1-uid"


class Cached:
    def __init__(self, objects: list) -> None:
        self.objects = objects
        self.has_synced = True
        self.last_error: Exception | None = None

    def list(self, namespace: str | None = None) -> list:
        return self.objects


def delegate(namespace: object, source: object = HERE) -> dict:
    return {
        "metadata": {
            "name": "d",
            "namespace": namespace,
            "annotations": {keys.PARENT_CLUSTER_NAME: source},
        }
    }


def test_a_namespaced_target_beats_in_its_namespace_a_cluster_target_where_it_has_delegates():
    local = Cluster("local", ClusterConfig("https://127.0.0.1:1", None))
    heartbeat = SourceHeartbeat(local, TargetRegistry(), HERE)
    namespaced = TargetConnection(kind="Target", name="c2", namespace="team")
    assert heartbeat.namespaces(namespaced) == {"team"}
    everywhere = TargetConnection(kind="ClusterTarget", name="c2", namespace=None)
    everywhere.delegates = Cached(  # type: ignore[assignment]
        [
            delegate("a"),
            delegate("b"),
            delegate("c", source="another-source"),
            # What a hostile target may send: no namespace, a namespace that is not a string,
            # annotations that are not a map. Before, the first one ended the agent.
            {"metadata": {"name": "x", "annotations": {keys.PARENT_CLUSTER_NAME: HERE}}},
            delegate(["a"]),
            {"metadata": {"name": "y", "namespace": "d", "annotations": ["z"]}},
        ]
    )
    assert heartbeat.namespaces(everywhere) == {"a", "b"}


def test_a_namespace_keeps_its_heartbeat_a_while_after_its_last_delegate_went():
    """A scale to zero through a ClusterTarget: the source deleted the delegates itself, and
    must be seen there after, or the target recreates them (they came back every 65 s)."""
    local = Cluster("local", ClusterConfig("https://127.0.0.1:1", None))
    heartbeat = SourceHeartbeat(local, TargetRegistry(), HERE)
    everywhere = TargetConnection(kind="ClusterTarget", name="c2", namespace=None)
    cached = Cached([delegate("a")])
    everywhere.delegates = cached  # type: ignore[assignment]
    assert heartbeat.plan(everywhere, 0.0) == ({"a"}, set())
    cached.objects = []  # scaled to zero
    assert heartbeat.plan(everywhere, LINGER) == ({"a"}, set())
    assert LINGER > AWAY + HEARTBEAT_PERIOD, "renewed at least once after the target's wait"
    cached.last_error = RuntimeError("the target's delegates cannot be read now")
    assert heartbeat.plan(everywhere, LINGER + 1) == ({"a"}, set()), "deletions may go on"
    cached.last_error = None
    assert heartbeat.plan(everywhere, LINGER + 1) == (set(), {"a"})
    namespaced = TargetConnection(kind="Target", name="c2", namespace="team")
    assert heartbeat.plan(namespaced, 10_000.0) == ({"team"}, set()), "always"


async def test_a_targets_connection_outlives_the_time_between_two_heartbeats() -> None:
    """Renewed every period over the connection the last renewal used: a new TLS connection for
    each (aiohttp closes idle ones after 15 s) cost 2 ms of CPU, per target, every period."""
    client = Cluster("t", ClusterConfig("https://t.invalid", None)).client
    try:
        assert client.session.connector._keepalive_timeout > HEARTBEAT_PERIOD  # type: ignore[attr-defined]
    finally:
        await client.close()


# -- on the in-memory API server: what the source writes in a target ---------------------------

NS = "team"
WRITER = "system:serviceaccount:team:c1"
NAME = heartbeat_name(HERE)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class Source:
    """This cluster (its agent's heartbeats) and a target, cluster2, on in-memory API servers;
    a namespaced Target c2 in ``team``, whose identity there is :data:`WRITER`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.local = FakeCluster("local")
        self.target = FakeCluster("cluster2")
        self.api = self.target.server
        self.registry = TargetRegistry()
        self.heartbeat = SourceHeartbeat(self.local, self.registry, HERE)
        self.connection = TargetConnection(kind="Target", name="c2", namespace=NS)
        self.connection.identity = WRITER

    async def start(self) -> None:
        self.local.start()
        await attach(self.registry, self.connection, self.target)

    async def stop(self) -> None:
        await self.target.stop()
        await self.local.stop()

    def stored(self) -> dict | None:
        return named(self.api, SOURCE_HEARTBEATS, NAME, NS)

    def listed(self) -> dict | None:
        found = self.stored()
        return None if found is None else found["spec"].get("delegates", {})

    def writes(self, verb: str = "patch") -> list:
        return [a for a in self.api.writes if a.resource == SOURCE_HEARTBEATS and a.verb == verb]

    async def made(self, name: str) -> dict:
        """A delegate (in the target's cache), as the target answered its creation."""
        pod = {"metadata": {"name": name, "labels": {keys.PARENT_UID: "p-" + name}}}
        return await self.target.client.create(PODS, pod, NS)

    async def create(self, name: str) -> dict:
        """A delegate created in the target: the scheduler's create, then its hook."""
        made = await self.made(name)
        await self.heartbeat.created(self.connection, made)
        return made

    def uids(self, *pods: dict) -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


@pytest.fixture
async def source(monkeypatch: pytest.MonkeyPatch) -> AsyncGenerator[Source, None]:
    clock = Clock()
    monkeypatch.setattr(heartbeat_module, "time", clock)
    made = Source(clock)
    await made.start()
    yield made
    await made.stop()


async def test_a_delegate_is_listed_from_the_targets_answer_before_its_placement_goes_on(
    source: Source,
):
    first = await source.create("web-1")
    assert source.listed() == source.uids(first), "the heartbeat made with the first"
    stored = source.stored()
    assert stored is not None
    assert (stored["spec"]["source"], stored["spec"]["writer"]) == (HERE, WRITER)
    second = await source.create("web-2")
    assert source.listed() == source.uids(first, second)
    assert len(source.writes("create")) == 1
    assert len(source.writes("patch")) == 2, "the first found nothing to patch"
    assert "writerUID" not in stored["spec"], "an identity without a uid writes none"


async def test_a_heartbeat_carries_the_uid_its_writer_has_in_the_target(source: Source):
    """The chart's policy makes ``writerUID`` the uid the target authenticated the writer with
    (a service account's own): the source writes it, on creation and on each patch, and takes it
    off when it has none (another identity, after its kubeconfig changed)."""
    source.connection.identity_uid = "sa-uid"
    await source.create("web-1")
    stored = source.stored()
    assert stored is not None
    assert stored["spec"]["writerUID"] == "sa-uid"
    source.connection.identity_uid = ""
    await source.create("web-2")
    stored = source.stored()
    assert stored is not None
    assert "writerUID" not in stored["spec"]


async def test_delegates_created_at_once_are_listed_in_few_writes_one_at_a_time(source: Source):
    pods = [await source.made(f"web-{i}") for i in range(50)]
    in_flight, most = 0, 0
    original = source.target.client.call

    async def counting(call, **options):
        nonlocal in_flight, most
        if call.resource == SOURCE_HEARTBEATS:
            in_flight += 1
            most = max(most, in_flight)
            await asyncio.sleep(0.005)
        try:
            return await original(call, **options)
        finally:
            if call.resource == SOURCE_HEARTBEATS:
                in_flight -= 1

    source.target.client.call = counting  # type: ignore[method-assign]
    await asyncio.gather(*(source.heartbeat.created(source.connection, p) for p in pods))
    assert source.listed() == source.uids(*pods)
    assert most == 1, "one request at a time"
    assert len(source.writes("patch")) + len(source.writes("create")) < 10, "merged"


async def test_a_target_without_heartbeats_lists_nothing_and_holds_no_placement(
    source: Source, caplog: pytest.LogCaptureFixture
):
    """A chart older than this one: no such resource (404), or a Source role without it
    (403). Its delegates are not kept alive; placing them waits for nothing; it is said once."""
    caplog.set_level(logging.INFO, logger=heartbeat_module.__name__)
    missing = NotFound("the server could not find the requested resource", status=404)
    source.api.fail_next("*", SOURCE_HEARTBEATS, missing, times=None)
    started = asyncio.get_running_loop().time()
    await source.create("web-1")
    await source.create("web-2")
    assert asyncio.get_running_loop().time() - started < 1.0
    assert len([a for a in source.api.actions if a.resource == SOURCE_HEARTBEATS]) <= 3
    await source.heartbeat.beat()
    await source.heartbeat.beat()
    said = [r for r in caplog.records if "no heartbeat in" in r.getMessage()]
    assert len(said) == 1
    source.api._reactors.clear()
    refused = source.api.fail_next("*", SOURCE_HEARTBEATS, Forbidden("no", status=403), times=None)
    source.clock.now += HEARTBEAT_PERIOD
    third = await source.create("web-3")
    assert source.listed() is None
    # The target takes them again (its chart upgraded, a policy changed): the next renewal
    # lists what was created meanwhile.
    source.api.remove_reactor(refused)
    await source.heartbeat.beat()
    assert source.listed() is not None
    assert third["metadata"]["name"] in source.listed()


async def test_after_a_restart_what_this_cluster_listed_is_read_back_and_pruned(
    source: Source,
):
    kept = await source.made("web-1")
    listed = source.uids(kept) | {"web-gone": "uid-gone"}
    source.api.add(SOURCE_HEARTBEATS, heartbeat_object(HERE, NS, WRITER, "x", listed))
    await until(lambda: source.connection.delegates.get("web-1", NS) is not None)
    added = await source.create("web-2")
    assert source.listed() == listed | source.uids(added), "read back, then added to"
    await source.heartbeat.beat()
    assert source.listed() == listed | source.uids(added), "not yet: pods may not be seen yet"
    source.clock.now += PRUNE_AFTER
    await source.heartbeat.beat()
    await until(lambda: source.connection.delegates.get("web-2", NS) is not None)
    await source.heartbeat.beat()
    assert source.listed() == source.uids(kept, added), "the pod gone goes from the list"


async def test_a_heartbeat_someone_else_wrote_last_is_not_trusted(source: Source):
    """Whoever else may write it (an admin, another source of this namespace) wrote entries
    and their name: every entry goes, only what this cluster creates is listed."""
    forged = {"web-1": "uid-of-someone-elses-pod"}
    source.api.add(SOURCE_HEARTBEATS, heartbeat_object(HERE, NS, "alice", "x", forged))
    made = await source.create("web-2")
    assert source.listed() == source.uids(made)
    assert source.stored()["spec"]["writer"] == WRITER


async def test_a_pod_of_the_same_name_recreated_is_not_listed_again(source: Source):
    """A delegate recreated by the target's keeper has a new uid: the entry of the one this
    cluster created goes, and the new one is never listed (it is kept alive once only)."""
    made = await source.create("web-1")
    await source.target.client.delete(PODS, "web-1", NS)
    again = await source.made("web-1")

    def seen() -> bool:
        cached = source.connection.delegates.get("web-1", NS)
        return cached is not None and cached["metadata"]["uid"] == again["metadata"]["uid"]

    await until(seen, what="the new pod cached")
    assert source.listed() == source.uids(made)
    source.clock.now += PRUNE_AFTER
    await source.heartbeat.beat()
    assert source.listed() == {}


async def test_a_full_heartbeat_lists_no_more_and_waits_for_nothing(
    source: Source, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(heartbeat_module, "MAX_DELEGATES", 3)
    pods = [await source.create(f"web-{i}") for i in range(5)]
    assert source.listed() == source.uids(*pods[:3])
    assert MAX_DELEGATES == 1000


async def test_the_previous_releases_lease_goes_and_a_self_target_gets_nothing(source: Source):
    lease = {"metadata": {"name": NAME}, "spec": {"holderIdentity": HERE}}
    source.api.add(LEASES, {**lease, "metadata": {**lease["metadata"], "namespace": NS}})
    await source.heartbeat.beat()
    assert named(source.api, LEASES, NAME, NS) is None
    assert source.stored() is not None, "renewed in a namespaced Target's namespace at once"
    local = TargetConnection(kind="Target", name="c1", namespace=NS)
    local.cluster = source.local
    await source.heartbeat.created(local, {"metadata": {"name": "x", "namespace": NS, "uid": "u"}})
    assert not [a for a in source.local.server.writes if a.resource == SOURCE_HEARTBEATS]


async def test_a_deleted_target_loses_its_heartbeats_first(source: Source):
    await source.create("web-1")
    await source.registry.remove(source.connection.node_name)
    assert source.stored() is None

"""A source's heartbeats: where they go, whatever a target sends."""

from __future__ import annotations

from multicluster import Cluster, ClusterConfig
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.keepalive import AWAY, HEARTBEAT_PERIOD
from multicluster_scheduler.targets.heartbeat import LINGER, SourceHeartbeat
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry

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

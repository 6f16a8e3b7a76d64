"""A source's heartbeats: where they go, whatever a target sends."""

from __future__ import annotations

from multicluster import Cluster, ClusterConfig
from multicluster_scheduler.api import keys
from multicluster_scheduler.targets.heartbeat import SourceHeartbeat
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry

HERE = "cluster1-uid"


class Cached:
    def __init__(self, objects: list) -> None:
        self.objects = objects

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

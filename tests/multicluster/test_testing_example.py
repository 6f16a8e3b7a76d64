"""The example of docs/multicluster.md ("Testing reconcilers"), as it is written there."""

import asyncio

from multicluster import Request
from multicluster.resources import CONFIGMAPS
from multicluster.testing import FakeCluster


class Labeller:
    """Labels every config map it is asked about."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.maps = cluster.informer(CONFIGMAPS)

    async def reconcile(self, request):
        obj = self.maps.get(request.name, request.namespace)
        if obj is not None and "seen" not in (obj["metadata"].get("labels") or {}):
            patch = {"metadata": {"labels": {"seen": "yes"}}}
            await self.cluster.client.patch(CONFIGMAPS, request.name, patch, request.namespace)


async def test_a_config_map_is_labelled():
    cluster = FakeCluster("cluster1")
    labeller = Labeller(cluster)
    cluster.start()
    await cluster.client.create(CONFIGMAPS, {"metadata": {"name": "settings"}}, "default")
    await cluster.wait_synced(5)
    while labeller.maps.get("settings", "default") is None:  # the watch event on its way
        await asyncio.sleep(0.01)
    await labeller.reconcile(Request("cluster1", "default", "settings"))
    (written,) = cluster.server.objects(CONFIGMAPS)
    assert written["metadata"]["labels"] == {"seen": "yes"}
    assert [action.verb for action in cluster.server.writes] == ["create", "patch"]
    await cluster.stop()


def test_the_docs_show_this_very_example():
    from pathlib import Path

    here = Path(__file__).read_text()
    example = here[
        here.index("from multicluster import Request") : here.index("\n\n\ndef test_the_docs")
    ]
    docs = (Path(__file__).parents[2] / "docs" / "multicluster.md").read_text()
    assert example + "\n```" in docs

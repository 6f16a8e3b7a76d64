"""Targets for the benchmarks, and benchmark 5: time from a Target's creation to its virtual
node Ready in the source cluster."""

from __future__ import annotations

import asyncio
import contextlib
import time

from multicluster import Informer, NotFound, Resource
from multicluster.resources import NODES
from multicluster_scheduler.api.naming import virtual_node_name

from .bed import SOURCE, BenchBed
from .webhook import percentile

TARGETS = Resource("multicluster.admiralty.io", "v1alpha1", "targets", "Target")
CLUSTER_TARGETS = Resource(
    "multicluster.admiralty.io", "v1alpha1", "clustertargets", "ClusterTarget", namespaced=False
)
VIRTUAL_NODE_SELECTOR = "virtual-kubelet.io/provider=admiralty"


def ready(node: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or ()
    )


async def virtual_nodes(bed: BenchBed) -> list[dict]:
    items, _ = await bed.clusters[SOURCE].client.list(NODES, label_selector=VIRTUAL_NODE_SELECTOR)
    return items


async def wait_nodes(bed: BenchBed, predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate(await virtual_nodes(bed)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def connect_cluster_targets(bed: BenchBed) -> None:
    """The guide's two targets for every namespace: cluster1 itself (c1) and cluster2 (c2)."""
    for target, name in (("cluster1", "c1"), ("cluster2", "c2")):
        await asyncio.to_thread(
            bed.join, SOURCE, target, namespace=None, name="c1", target_name=name
        )


async def disconnect_cluster_targets(bed: BenchBed) -> None:
    client = bed.clusters[SOURCE].client
    items, _ = await client.list(CLUSTER_TARGETS)
    for item in items:
        await client.delete(CLUSTER_TARGETS, item["metadata"]["name"], missing_ok=True)
    await wait_nodes(bed, lambda nodes: not nodes, 60, "cluster targets' virtual nodes gone")


async def time_to_ready(bed: BenchBed, repeats: int) -> dict:
    """Create a Target (its Secret already there), time until its virtual node is Ready, delete
    it, ``repeats`` times."""
    namespace = "bench-targets"
    client = bed.clusters[SOURCE].client
    await bed.create_namespace(namespace, enabled=True)
    await asyncio.to_thread(
        bed.join, SOURCE, "cluster2", namespace=namespace, name="c1", target_name="c2"
    )
    made = await client.get(TARGETS, "c2", namespace)
    manifest = {
        "apiVersion": made["apiVersion"],
        "kind": made["kind"],
        "metadata": {"name": "c2"},
        "spec": made["spec"],
    }
    node_name = virtual_node_name("c2", namespace)
    seen: dict[str, float] = {}
    changed = asyncio.Event()

    def on_node(event: str, node: dict, _old, _initial) -> None:
        if node["metadata"]["name"] != node_name:
            return
        if event == "DELETED":
            seen.pop("ready", None)
            seen["deleted"] = time.monotonic()
        elif ready(node):
            seen.setdefault("ready", time.monotonic())
        changed.set()

    async def until(key: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while key not in seen:
            changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"virtual node {node_name} not {key} after {timeout:.0f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
        return seen[key]

    informer = Informer(client, NODES, label_selector=VIRTUAL_NODE_SELECTOR)
    informer.add_handler(on_node)
    informer.start()
    await informer.wait_synced(30)
    timings = []
    try:
        for _ in range(repeats):
            await client.delete(TARGETS, "c2", namespace, missing_ok=True)
            seen.pop("deleted", None)
            if informer.get(node_name) is not None:
                await until("deleted", 60)
            seen.clear()
            await asyncio.sleep(0.5)
            started = time.monotonic()
            await client.create(TARGETS, manifest, namespace)
            timings.append(await until("ready", 60) - started)
    finally:
        await informer.stop()
        with contextlib.suppress(NotFound):
            await client.delete(TARGETS, "c2", namespace)
        await bed.delete_namespace(namespace)
    return {
        "repeats": repeats,
        "seconds": [round(t, 3) for t in timings],
        "p50_s": round(percentile(timings, 50), 3),
        "max_s": round(max(timings), 3),
    }

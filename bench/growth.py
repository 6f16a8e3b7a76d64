"""Benchmarks 8 and 9: how the agent's cost grows with the number of targets and of pods, and
100 Targets.

Targets are namespaced and spread over the three clusters as the scale benchmark spreads ten:
target *i* lives in namespace ``growth-NN`` (NN = *i* // 3) and reaches cluster *i* mod 3 + 1
(named ``c1``, ``c2``, ``c3``; ``c1`` is the source itself, a self Target). 100 targets make 34
namespaces. One run grows step by step, sampling at each size rather than starting over:

1. Targets, 1 → 10 → 50 → 100 (``target_steps``). Each step creates its new Targets at once
   and times each from its creation to its virtual node Ready (a watch on nodes); then, at
   rest, the source agent's CPU (all its processes); then a fixed burst of elected pods spread
   over the targets (pod *j* in the namespace of target *j* mod N): proxies bound per second
   (sustained, as in placement), CPU per pod, the agent's RSS; the burst is deleted (and
   waited for) before the next step.
2. Pods, with every target connected, 1k → 5k → 10k → 20k (``pod_steps``), created in
   increments and kept: at each size the increment's placement rate and CPU per pod, the
   agent's RSS and CPU at rest, and Target → Ready of one more Target (in ``growth-probe``,
   reaching cluster2), created and deleted three times.

Join takes a subprocess and a wait for Ready per Target: for 100 that is minutes spent outside
what is measured. So the Secrets are made beforehand as join makes them, in this process and
several at once (a Source in the target cluster, its service account exported as a kubeconfig
Secret in the source: ``connect.manifests`` and ``connect.export``, join's own steps), and the
Targets are created directly, as ``join`` would create them last.

This is the last benchmark of a run: its pods are left to the test bed's teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable

from multicluster import Informer, NotFound
from multicluster.resources import NODES, PODS, SECRETS, SERVICEACCOUNTS
from multicluster_scheduler.api.naming import virtual_node_name
from multicluster_scheduler.api.resources import SOURCES
from multicluster_scheduler.connect import manifests
from multicluster_scheduler.connect.export import export
from multicluster_scheduler.connect.remote import Context, open_context, poll

from .bed import (
    CLUSTERS,
    PARENT_UID,
    SOURCE,
    BenchBed,
    PodTimes,
    agent_stats,
    cpu_snapshot,
    cpu_used,
    pod,
    sustained_rate,
)
from .rollout import CONCURRENCY
from .targets import TARGETS, VIRTUAL_NODE_SELECTOR, ready
from .webhook import percentile

APP = "growth"
SOURCE_NAME = "c1"  # the Source in each target cluster, named after the source cluster
TARGET_NAMES = {"cluster1": "c1", "cluster2": "c2", "cluster3": "c3"}
PROBE_NAMESPACE = "growth-probe"
PROBE_CLUSTER = "cluster2"
PROBE_REPEATS = 3
PREPARE_CONCURRENCY = 8
SETTLE_S = 5.0  # after a change, before the agent is "at rest"
READY_TIMEOUT_S = 120.0
MB = 2**20


def placement(index: int) -> tuple[str, str]:
    """(namespace, cluster) of target ``index``."""
    return f"growth-{index // 3:02d}", CLUSTERS[index % 3]


def node_of(index: int) -> str:
    namespace, cluster = placement(index)
    return virtual_node_name(TARGET_NAMES[cluster], namespace)


def target_manifest(namespace: str, cluster: str) -> dict:
    name = TARGET_NAMES[cluster]
    return manifests.target(name, namespace, secret=None if cluster == SOURCE else name)


async def prepare_secret(source: Context, target: Context, namespace: str) -> None:
    """What join does before it creates the Target: a Source in the target, its service account
    exported as a kubeconfig Secret into the source."""
    await target.apply(SOURCES, manifests.source(SOURCE_NAME, namespace, SOURCE_NAME))

    async def account() -> dict | None:
        return await target.get(SERVICEACCOUNTS, SOURCE_NAME, namespace)

    if await poll(account, 60) is None:
        raise TimeoutError(f"service account {namespace}/{SOURCE_NAME} not in {target.name}")
    secret = await export(
        target,
        namespace=namespace,
        service_account=SOURCE_NAME,
        secret_name=TARGET_NAMES[target.name],
    )
    secret["metadata"]["namespace"] = namespace
    await source.apply(SECRETS, secret)


async def prepare(bed: BenchBed, pairs: Iterable[tuple[str, str]]) -> float:
    """Namespaces and Secrets for every (namespace, cluster); the seconds it took."""
    started = time.monotonic()
    pairs = list(pairs)
    for namespace in sorted({ns for ns, _ in pairs}):
        await bed.create_namespace(namespace, enabled=True)
    limit = asyncio.Semaphore(PREPARE_CONCURRENCY)
    async with contextlib.AsyncExitStack() as stack:
        contexts = {
            name: await stack.enter_async_context(open_context(str(bed.kubeconfig), name))
            for name in CLUSTERS
        }

        async def one(namespace: str, cluster: str) -> None:
            async with limit:
                await prepare_secret(contexts[SOURCE], contexts[cluster], namespace)

        await asyncio.gather(*(one(ns, c) for ns, c in pairs if c != SOURCE))
    return time.monotonic() - started


class NodeTimes:
    """When each virtual node was first seen Ready (monotonic seconds), by a watch; forgotten
    when the node is deleted."""

    def __init__(self, bed: BenchBed) -> None:
        self.informer = Informer(
            bed.clusters[SOURCE].client, NODES, label_selector=VIRTUAL_NODE_SELECTOR
        )
        self.informer.add_handler(self._on_event)
        self.ready: dict[str, float] = {}
        self._changed = asyncio.Event()

    def _on_event(self, event: str, node: dict, _old, _initial) -> None:
        name = node["metadata"]["name"]
        if event == "DELETED":
            self.ready.pop(name, None)
        elif ready(node):
            self.ready.setdefault(name, time.monotonic())
        self._changed.set()

    async def until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))


async def create_targets(bed: BenchBed, nodes: NodeTimes, indices: range) -> list[float]:
    """Create the Targets ``indices`` at once; seconds from each creation to its node Ready."""
    client = bed.clusters[SOURCE].client
    created: dict[str, float] = {}

    async def one(index: int) -> None:
        namespace, cluster = placement(index)
        created[node_of(index)] = time.monotonic()
        await client.create(TARGETS, target_manifest(namespace, cluster), namespace)

    await asyncio.gather(*(one(i) for i in indices))
    await nodes.until(
        lambda: all(name in nodes.ready for name in created),
        READY_TIMEOUT_S,
        f"{len(created)} virtual nodes Ready ({len(set(created) & set(nodes.ready))} are)",
    )
    return [nodes.ready[name] - at for name, at in created.items()]


async def probe_ready(bed: BenchBed, nodes: NodeTimes) -> list[float]:
    """Target → Ready of the probe Target, created and deleted ``PROBE_REPEATS`` times."""
    client = bed.clusters[SOURCE].client
    name = TARGET_NAMES[PROBE_CLUSTER]
    node = virtual_node_name(name, PROBE_NAMESPACE)
    timings = []
    for _ in range(PROBE_REPEATS):
        started = time.monotonic()
        await client.create(
            TARGETS, target_manifest(PROBE_NAMESPACE, PROBE_CLUSTER), PROBE_NAMESPACE
        )
        await nodes.until(lambda: node in nodes.ready, READY_TIMEOUT_S, f"{node} Ready")
        timings.append(nodes.ready[node] - started)
        await client.delete(TARGETS, name, PROBE_NAMESPACE)
        await nodes.until(lambda: nodes.informer.get(node) is None, READY_TIMEOUT_S, f"{node} gone")
    return timings


def source_agent(bed: BenchBed) -> dict:
    """The source agent's RSS (MB: its own process, its webhook's) and CPU seconds (both)."""
    stats = agent_stats(bed.installation.agents[SOURCE][0].pid)
    return {
        "rss_mb": round(stats["rss"] / MB, 1),
        "webhook_rss_mb": round(stats["children_rss"] / MB, 1),
        "cpu_s": stats["cpu_s"],
    }


async def at_rest(bed: BenchBed, seconds: float) -> dict:
    """CPU of the source agent and of all agents (% of one core) over ``seconds`` at rest."""
    await asyncio.sleep(SETTLE_S)
    before, all_before = source_agent(bed), cpu_snapshot(bed)
    await asyncio.sleep(seconds)
    after, all_after = source_agent(bed), cpu_snapshot(bed)
    return {
        "seconds": seconds,
        "source_agent": round(100 * (after["cpu_s"] - before["cpu_s"]) / seconds, 2),
        "agents": round(100 * (all_after["agent"] - all_before["agent"]) / seconds, 2),
    }


async def create_pods(bed: BenchBed, names: list[tuple[str, str]]) -> int:
    """Create the elected pods ``(namespace, name)``, CONCURRENCY in flight; the number
    refused."""
    client = bed.clusters[SOURCE].client
    queue = list(reversed(names))
    refused = 0

    async def worker() -> None:
        nonlocal refused
        while queue:
            namespace, name = queue.pop()
            try:
                await client.create(PODS, pod(name, elect=True, app=APP), namespace)
            except Exception:
                refused += 1

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return refused


async def place(bed: BenchBed, times: PodTimes, names: list[tuple[str, str]]) -> dict:
    """Create ``names`` and wait for their proxies Running: placement rate, CPU per pod."""
    count = len(names)
    expected = len(times.proxies & set(times.running)) + count
    cpu_before, agent_before = cpu_snapshot(bed), source_agent(bed)
    started = time.monotonic()
    refused = await create_pods(bed, names)
    if refused:
        raise RuntimeError(f"{refused} of {count} pods refused")
    done = await times.wait(
        lambda: len(times.proxies & set(times.running)) >= expected,
        max(120, count / 5),
        f"{expected} proxies Running",
    )
    cpu = cpu_used(cpu_before, cpu_snapshot(bed), count)
    agent_after = source_agent(bed)
    bound = [at for uid, at in times.bound.items() if uid in times.proxies and at >= started]
    return {
        "pods": count,
        "all_running_s": round(done - started, 1),
        "bound_per_s": round(sustained_rate(bound), 1),
        "cpu_ms_per_pod": {
            "source_agent": round(1000 * (agent_after["cpu_s"] - agent_before["cpu_s"]) / count, 2),
            "agents": cpu["agent"],
            "machine": cpu["machine"],
        },
        "rss_mb": agent_after["rss_mb"],
        "webhook_rss_mb": agent_after["webhook_rss_mb"],
    }


async def _any_left(bed: BenchBed) -> str | None:
    """A cluster still holding pods of this benchmark (proxies or delegates), or None."""
    for name, cluster in bed.clusters.items():
        for selector in (f"app={APP}", PARENT_UID) if name == SOURCE else (PARENT_UID,):
            async for page in cluster.client.list_pages(PODS, label_selector=selector, limit=1):
                if page.get("items"):
                    return name
                break
    return None


async def delete_pods(bed: BenchBed, names: list[tuple[str, str]], timeout: float = 300) -> None:
    """Delete the proxies ``names`` as a ReplicaSet scaling down does; wait for every proxy and
    delegate gone."""
    client = bed.clusters[SOURCE].client
    queue = list(names)

    async def worker() -> None:
        while queue:
            namespace, name = queue.pop()
            with contextlib.suppress(NotFound):
                await client.delete(PODS, name, namespace)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    deadline = time.monotonic() + timeout
    while (left := await _any_left(bed)) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of the burst still in {left}")
        await asyncio.sleep(0.5)


def spread(count: int, targets: int, prefix: str, start: int = 0) -> list[tuple[str, str]]:
    """``count`` pod names, pod *j* in the namespace of target *j* mod ``targets``."""
    return [(placement(j % targets)[0], f"{prefix}-{start + j:05d}") for j in range(count)]


def _seconds(values: list[float]) -> dict:
    return {
        "p50_s": round(percentile(values, 50), 3),
        "max_s": round(max(values), 3),
    }


async def run(
    bed: BenchBed,
    result: dict,
    target_steps: tuple[int, ...],
    pod_steps: tuple[int, ...],
    burst: int,
    idle_s: float,
) -> None:
    """Fill ``result`` step by step (a run that fails keeps the steps it made)."""
    result.update(burst=burst, target_steps=[], pod_steps=[])
    most = max(target_steps)
    pairs = [placement(i) for i in range(most)] + [(PROBE_NAMESPACE, PROBE_CLUSTER)]
    prepared_s = await prepare(bed, pairs)
    print(f"  growth: {len(pairs)} Secrets and namespaces in {prepared_s:.0f}s", flush=True)
    result["prepare_s"] = round(prepared_s, 1)
    nodes = NodeTimes(bed)
    nodes.informer.start()
    await nodes.informer.wait_synced(30)
    try:
        connected = 0
        every_ready: list[float] = []
        for step in sorted(target_steps):
            timings = await create_targets(bed, nodes, range(connected, step))
            every_ready += timings
            connected = step
            row: dict = {
                "targets": step,
                "new": len(timings),
                "ready": _seconds(timings),
                "idle_cpu_percent": await at_rest(bed, idle_s),
            }
            names = spread(burst, step, f"t{step}")
            async with PodTimes(bed.clusters[SOURCE], None, label_selector=f"app={APP}") as times:
                row["burst"] = await place(bed, times, names)
            await delete_pods(bed, names)
            result["target_steps"].append(row)
            result["ready_all_targets"] = {"targets": connected, **_seconds(every_ready)}
            print(f"  growth, {step} targets: {row}", flush=True)
        async with PodTimes(bed.clusters[SOURCE], None, label_selector=f"app={APP}") as times:
            placed = 0
            for size in sorted(pod_steps):
                names = spread(size - placed, connected, "p", placed)
                row = {"pods": size, "targets": connected, "added": await place(bed, times, names)}
                placed = size
                agent = source_agent(bed)
                row["rss_mb"], row["webhook_rss_mb"] = agent["rss_mb"], agent["webhook_rss_mb"]
                row["idle_cpu_percent"] = await at_rest(bed, idle_s / 2)
                row["probe_ready"] = _seconds(await probe_ready(bed, nodes))
                result["pod_steps"].append(row)
                print(f"  growth, {size} pods: {row}", flush=True)
    finally:
        await nodes.informer.stop()

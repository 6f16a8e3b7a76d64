"""Benchmarks 6 and 4: 10 targets and 10,000 elected pods, then the source agent's memory and CPU
with all of them cached, and the time from its restart to every cache synced.

Ten namespaced Targets over three clusters: namespaces ``scale-a`` and ``scale-b`` target
cluster1 itself, cluster2 and cluster3; ``scale-c`` and ``scale-d`` target cluster2 and
cluster3. Each namespace gets a Deployment with a quarter of the pods.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

from multicluster.resources import DEPLOYMENTS

from .bed import (
    SOURCE,
    BenchBed,
    PodTimes,
    agent_processes,
    agent_stats,
    deployment,
    process_stats,
    sustained_rate,
)
from .webhook import percentile

LAYOUT = {
    "scale-a": ("cluster1", "cluster2", "cluster3"),
    "scale-b": ("cluster1", "cluster2", "cluster3"),
    "scale-c": ("cluster2", "cluster3"),
    "scale-d": ("cluster2", "cluster3"),
}
TARGET_NAMES = {"cluster1": "c1", "cluster2": "c2", "cluster3": "c3"}
IDLE_SECONDS = 20


def metrics(port: int) -> dict[str, float]:
    """The agent's /metrics samples, keyed by their full name with labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def synced(samples: dict[str, float], clusters: int, expected: dict[str, float]) -> bool:
    """Leader, ``clusters`` clusters synced, and every pod cache as full as ``expected``."""
    if not any(
        k.startswith("leader_election_master_status") and v == 1 for k, v in samples.items()
    ):
        return False
    flags = [v for k, v in samples.items() if k.startswith("multicluster_cluster_synced{")]
    if len(flags) < clusters or not all(flags):
        return False
    cached = cached_pods(samples)
    return all(cached.get(key, 0) >= count for key, count in expected.items())


def cached_pods(samples: dict[str, float]) -> dict[str, float]:
    return {
        k.removeprefix("informer_cached_objects"): v
        for k, v in samples.items()
        if k.startswith("informer_cached_objects{") and 'resource="pods"' in k
    }


async def wait_restart(
    bed: BenchBed, clusters: int, expected: dict[str, float], timeout: float = 120
) -> dict:
    """Stop the source agent (SIGTERM, as a rolling update does); its keeper starts a new one;
    time from the new process's start to leader with every cache synced."""
    agent = bed.installation.agents[SOURCE][0]
    port = bed.installation.health_ports[SOURCE][0]
    old = agent.pid
    await asyncio.to_thread(agent.stop)
    deadline = time.monotonic() + timeout
    while agent.pid == old or not agent.running:
        if time.monotonic() > deadline:
            raise TimeoutError("the agent was not restarted")
        await asyncio.sleep(0.01)
    started = agent.started_at
    assert started is not None
    while True:
        try:
            samples = await asyncio.to_thread(metrics, port)
        except OSError:
            samples = {}
        if samples and synced(samples, clusters, expected):
            return {
                "seconds": round(time.monotonic() - started, 2),
                "cached_pods": cached_pods(samples),
                **{k: v for k, v in process_stats(agent_processes(agent.pid)[0]).items()},
            }
        if time.monotonic() > deadline:
            raise TimeoutError(f"agent not synced after restart: {cached_pods(samples)}")
        await asyncio.sleep(0.05)


async def run(bed: BenchBed, pods: int) -> dict:
    client = bed.clusters[SOURCE].client
    for namespace, clusters in LAYOUT.items():
        await bed.create_namespace(namespace, enabled=True)
        for cluster in clusters:
            await asyncio.to_thread(
                bed.join,
                SOURCE,
                cluster,
                namespace=namespace,
                name="c1",
                target_name=TARGET_NAMES[cluster],
            )
    targets = sum(len(c) for c in LAYOUT.values())
    agent = bed.installation.agents[SOURCE][0]
    before = agent_stats(agent.pid)
    shares = [pods // len(LAYOUT)] * len(LAYOUT)
    shares[0] += pods - sum(shares)
    watchers = [PodTimes(bed.clusters[SOURCE], ns) for ns in LAYOUT]
    try:
        for watcher in watchers:
            await watcher.__aenter__()
        started = time.monotonic()
        for namespace, replicas in zip(LAYOUT, shares, strict=False):
            await client.create(DEPLOYMENTS, deployment("scale", replicas, elect=True), namespace)

        def running(watcher: PodTimes) -> set[str]:
            return watcher.proxies & set(watcher.running)

        done = started
        for watcher, replicas in zip(watchers, shares, strict=False):
            done = max(
                done,
                await watcher.wait(
                    lambda w=watcher, n=replicas: len(running(w)) >= n,
                    max(60, pods / 10),
                    f"{replicas} proxies Running",
                ),
            )
        bound = [w.bound[u] for w in watchers for u in running(w)]
        per_pod = [w.running[u] - w.created[u] for w in watchers for u in running(w)]
    finally:
        for watcher in watchers:
            await watcher.__aexit__(None, None, None)
    after = agent_stats(agent.pid)
    delegates = {c: 0 for c in TARGET_NAMES}
    for namespace in LAYOUT:
        for cluster, count in (await bed.count_delegates(namespace)).items():
            delegates[cluster] += count
    await asyncio.sleep(IDLE_SECONDS)
    idle = agent_stats(agent.pid)
    samples = await asyncio.to_thread(metrics, bed.installation.health_ports[SOURCE][0])
    webhook_rss, webhook_peak = idle["children_rss"], idle["children_peak_rss"]
    result = {
        "targets": targets,
        "pods": pods,
        "all_running_s": round(done - started, 1),
        "bound_per_s": round(sustained_rate(bound), 1),
        "pod_p50_s": round(percentile(per_pod, 50), 2),
        "pod_p99_s": round(percentile(per_pod, 99), 2),
        "delegates": delegates,
        "agent": {
            "rss_mb": round(idle["rss"] / 2**20, 1),
            "peak_rss_mb": round(idle["peak_rss"] / 2**20, 1),
            "webhook_process_rss_mb": round(webhook_rss / 2**20, 1),
            "webhook_process_peak_rss_mb": round(webhook_peak / 2**20, 1),
            "cpu_s_during_rollout": round(after["cpu_s"] - before["cpu_s"], 1),
            "cpu_percent_idle": round(100 * (idle["cpu_s"] - after["cpu_s"]) / IDLE_SECONDS, 1),
            "cached_pods": cached_pods(samples),
        },
    }
    print(f"  scale: {result}", flush=True)
    remote = sum(1 for c in LAYOUT.values() for name in c if name != SOURCE)
    restart = await wait_restart(bed, 1 + remote, cached_pods(samples))
    restart["rss_mb"] = round(restart.pop("rss") / 2**20, 1)
    restart["peak_rss_mb"] = round(restart.pop("peak_rss") / 2**20, 1)
    restart.pop("cpu_s", None)
    result["restart"] = restart
    print(f"  restart: {restart}", flush=True)
    for namespace in LAYOUT:
        await bed.delete_namespace(namespace, timeout=max(300, pods / 10))
    return result

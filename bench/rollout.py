"""Benchmarks 1 and 2: an elected rollout against the same rollout native, and placement
throughput against the API server's practical ceiling.

1. A Deployment of N replicas, elected over K targets, and the same Deployment unelected in the
   source cluster alone, run alternately: seconds from creating the Deployment to every pod
   (every proxy pod, when elected) Running and Ready, as a watch sees it, and their ratio.
2. Bare pods created by one client, 32 requests in flight: unschedulable pods (nobody binds
   them), whose creation rate is the API server's practical ceiling for one client; elected pods,
   whose proxies are bound by our scheduler (placement throughput, measured between 10 % and
   90 % of them so start-up and tail are left out); and plain pods bound by kube-scheduler, for
   reference.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from multicluster.resources import DEPLOYMENTS, PODS

from .bed import (
    SOURCE,
    BenchBed,
    PodTimes,
    cpu_snapshot,
    cpu_used,
    deployment,
    pod,
    sustained_rate,
)
from .webhook import percentile

CONCURRENCY = 32


def _latencies(times: PodTimes, uids: set[str]) -> dict:
    per_pod = [times.running[u] - times.created[u] for u in uids if u in times.created]
    return {
        "pod_p50_s": round(percentile(per_pod, 50), 3),
        "pod_p99_s": round(percentile(per_pod, 99), 3),
    }


async def rollout(bed: BenchBed, namespace: str, replicas: int, *, elect: bool) -> dict:
    """One Deployment from creation to all replicas Running; the namespace is removed after."""
    source = bed.clusters[SOURCE]
    await bed.create_namespace(namespace, enabled=elect)
    try:
        async with PodTimes(source, namespace) as times:

            def ours() -> set[str]:
                return (times.proxies if elect else set(times.created)) & set(times.running)

            started = time.monotonic()
            await source.client.create(
                DEPLOYMENTS, deployment("rollout", replicas, elect=elect), namespace
            )
            done = await times.wait(
                lambda: len(ours()) >= replicas, 900, f"{replicas} replicas Running"
            )
            running = ours()
            bound = [times.bound[u] for u in running if u in times.bound]
            result = {
                "replicas": replicas,
                "seconds": round(done - started, 2),
                "bound_per_s": round(sustained_rate(bound), 1),
                **_latencies(times, running),
            }
        if elect:
            result["delegates"] = await bed.count_delegates(namespace)
        return result
    finally:
        await bed.delete_namespace(namespace)


async def compare(bed: BenchBed, replicas: int, rounds: int) -> dict:
    """Native and elected rollouts, alternately, ``rounds`` times each."""
    runs: dict[str, list[dict]] = {"native": [], "elected": []}
    for i in range(rounds):
        for kind in ("native", "elected"):
            result = await rollout(bed, f"rollout-{kind}-{i}", replicas, elect=kind == "elected")
            runs[kind].append(result)
            print(f"  rollout {kind} #{i + 1}: {result}", flush=True)
    ratios = [
        e["seconds"] / n["seconds"] for n, e in zip(runs["native"], runs["elected"], strict=False)
    ]
    return {
        "replicas": replicas,
        "rounds": rounds,
        "native_s": [r["seconds"] for r in runs["native"]],
        "elected_s": [r["seconds"] for r in runs["elected"]],
        "ratios": [round(r, 3) for r in ratios],
        "ratio": round(statistics.median(ratios), 3),
        "runs": runs,
    }


async def create_pods(client, namespace: str, manifests: list[dict]) -> tuple[float, int]:
    """Create every pod, CONCURRENCY in flight; seconds taken and the number refused."""
    queue = list(reversed(manifests))
    refused = 0

    async def worker() -> None:
        nonlocal refused
        while queue:
            body = queue.pop()
            try:
                await client.create(PODS, body, namespace)
            except Exception:
                refused += 1

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.monotonic() - started, refused


async def burst(bed: BenchBed, namespace: str, count: int, kind: str) -> dict:
    """``count`` bare pods of one kind (ceiling, elected or native) created at once."""
    source = bed.clusters[SOURCE]
    elect = kind == "elected"
    await bed.create_namespace(namespace, enabled=elect)
    extra = {"schedulerName": "nobody"} if kind == "ceiling" else {}
    manifests = [pod(f"p-{i:05d}", elect=elect, **extra) for i in range(count)]
    try:
        async with PodTimes(source, namespace) as times:
            snapshot = cpu_snapshot(bed)
            started = time.monotonic()
            seconds, refused = await create_pods(source.client, namespace, manifests)
            result = {
                "pods": count,
                "refused": refused,
                "create_s": round(seconds, 2),
                "created_per_s": round((count - refused) / seconds, 1),
            }
            done = time.monotonic()
            if kind != "ceiling":

                def ours() -> set[str]:
                    return (times.proxies if elect else set(times.created)) & set(times.bound)

                done = await times.wait(lambda: len(ours()) >= count, 600, f"{count} pods bound")
                bound = [times.bound[u] for u in ours()]
                result["all_bound_s"] = round(done - started, 2)
                result["bound_per_s"] = round(sustained_rate(bound), 1)
            used = cpu_used(snapshot, cpu_snapshot(bed), count)
            result["cpu_ms_per_pod"] = used
            result["machine_cpu_percent"] = round(used["machine"] * count / 10 / (done - started))
        return result
    finally:
        await bed.delete_namespace(namespace)


async def placement(bed: BenchBed, count: int) -> dict:
    results = {}
    for kind in ("ceiling", "elected", "native"):
        results[kind] = await burst(bed, f"burst-{kind}", count, kind)
        print(f"  burst {kind}: {results[kind]}", flush=True)
    ceiling = results["ceiling"]["created_per_s"]
    placed = results["elected"]["bound_per_s"]
    return {
        "pods": count,
        "concurrency": CONCURRENCY,
        "api_ceiling_per_s": ceiling,
        "placement_per_s": placed,
        "fraction_of_ceiling": round(placed / ceiling, 3) if ceiling else None,
        "native_bound_per_s": results["native"]["bound_per_s"],
        "runs": results,
    }

"""Benchmark 8: one tenant's burst and another tenant's first pods.

Two namespaces share the guide's two ClusterTargets (cluster1 itself and cluster2). Each round
times a handful of elected pods of tenant B from their creation to all of them Running and
Ready, first alone, then while tenant A's burst (a Deployment of elected pods) is being placed:
B's pods are created once a quarter of A's exist. A is followed through its Deployment's
status, so that this process handles the events of B's pods only. The figure is the ratio of
the medians over the rounds, both measured in the same run: absolute times on a shared machine
are noise, their ratio is not. Fair placement keeps it low; a first-come-first-served pipeline
makes B wait for most of A's burst.

Where B's pods wait is timed stage by stage (medians over B's pods of every round): admission
and our scheduler up to the delegate's creation in its target, the target's own scheduler,
its (fake) kubelet, and back in the source: the proxy pod bound, then its status mirrored.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time

from multicluster import Cluster, Informer
from multicluster.resources import DEPLOYMENTS, PODS
from multicluster_scheduler.api.keys import PROXY_SCHEDULER_NAME

from .bed import (
    PARENT_UID,
    SOURCE,
    BenchBed,
    PodTimes,
    deployment,
    pod,
    running_and_ready,
    slim,
)

TARGET_CLUSTERS = ("cluster1", "cluster2")  # the ClusterTargets c1 and c2
STAGES = (
    ("admission", "sent", "created"),
    ("to_delegate_created", "created", "delegate_created"),
    ("target_scheduler", "delegate_created", "delegate_bound"),
    ("target_kubelet", "delegate_bound", "delegate_running"),
    ("proxy_bound", "delegate_bound", "bound"),
    ("status_mirrored", "delegate_running", "running"),
)


class Delegates:
    """When each delegate of a namespace (keyed by its proxy pod's uid) was first seen, bound,
    and Running and Ready in any target."""

    def __init__(self, clusters: list[Cluster], namespace: str) -> None:
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.informers = []
        for cluster in clusters:
            informer = Informer(
                cluster.client, PODS, namespace, label_selector=PARENT_UID, transform=slim
            )
            informer.add_handler(self._on_event)
            self.informers.append(informer)

    def _on_event(self, event: str, obj: dict, _old: dict | None, _initial: bool) -> None:
        if event == "DELETED" or obj["spec"].get("schedulerName") == PROXY_SCHEDULER_NAME:
            return
        now = time.monotonic()
        parent = (obj["metadata"].get("labels") or {}).get(PARENT_UID)
        if not parent:
            return
        self.created.setdefault(parent, now)
        if obj["spec"].get("nodeName"):
            self.bound.setdefault(parent, now)
        if running_and_ready(obj):
            self.running.setdefault(parent, now)

    async def __aenter__(self) -> Delegates:
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            await informer.wait_synced(60)
        return self

    async def __aexit__(self, *_exc) -> None:
        for informer in self.informers:
            await informer.stop()


async def replicas(source: Cluster, namespace: str, field: str, count: int, timeout: float):
    """Wait until tenant A's Deployment counts ``count`` pods in ``field`` of its status. Its
    status is polled, not its pods watched: this process's watch of A's thousands of pod events
    would delay what it sees of B's pods, and B's times with it."""
    deadline = time.monotonic() + timeout
    while True:
        status = (await source.client.get(DEPLOYMENTS, "tenant-a", namespace)).get("status") or {}
        if status.get(field, 0) >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"tenant A: {field} {status.get(field, 0)} of {count}")
        await asyncio.sleep(0.2)


async def agent_samples(bed: BenchBed) -> dict[str, float]:
    """The source agents' /metrics samples, summed over its replicas."""
    from .scale import metrics

    total: dict[str, float] = {}
    for port in bed.installation.health_ports[SOURCE]:
        with contextlib.suppress(OSError):
            for key, value in (await asyncio.to_thread(metrics, port)).items():
                total[key] = total.get(key, 0.0) + value
    return total


def agent_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Between two samples: the event loop's mean lag and its share of lags over 100 ms, and
    the mean latency of the agent's requests to each cluster (connection wait included)."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    out = {}
    count = delta("event_loop_lag_seconds_count")
    if count:
        out["loop_lag_mean_s"] = round(delta("event_loop_lag_seconds_sum") / count, 3)
        out["loop_lag_over_100ms"] = round(
            1 - delta('event_loop_lag_seconds_bucket{le="0.1"}') / count, 3
        )
    for key in after:
        if key.startswith("rest_client_request_duration_seconds_count{"):
            labels = key.removeprefix("rest_client_request_duration_seconds_count")
            count = delta(key)
            if count:
                mean = delta(f"rest_client_request_duration_seconds_sum{labels}") / count
                out[f"api{labels}_mean_s"] = round(mean, 3)
                out[f"api{labels}_count"] = count
    return out


def stages(times: PodTimes, delegates: Delegates, uids: set[str], started: float) -> list[dict]:
    """Each pod's moments (seconds after the first create request) on its way to Running."""
    found = []
    for uid in uids:
        moments = {
            "sent": started,
            "created": times.created.get(uid),
            "delegate_created": delegates.created.get(uid),
            "delegate_bound": delegates.bound.get(uid),
            "delegate_running": delegates.running.get(uid),
            "bound": times.bound.get(uid),
            "running": times.running.get(uid),
        }
        found.append({k: None if v is None else v - started for k, v in moments.items()})
    return found


async def tenant_b(
    bed: BenchBed, namespace: str, count: int, times: PodTimes, delegates: Delegates
) -> tuple[float, list[dict]]:
    """Create ``count`` elected pods at once; seconds until all are Running, and their stages."""
    source = bed.clusters[SOURCE]
    manifests = [pod(f"b-{i:03d}", elect=True, app="tenant-b") for i in range(count)]
    started = time.monotonic()
    await asyncio.gather(*(source.client.create(PODS, m, namespace) for m in manifests))

    def ours() -> set[str]:
        return times.proxies & set(times.running)

    done = await times.wait(lambda: len(ours()) >= count, 300, f"{count} pods of {namespace}")
    return done - started, stages(times, delegates, ours(), started)


PHASES = ("alone", "during_native_burst", "during_burst")


async def one_round(bed: BenchBed, index: int, burst: int, count: int) -> dict:
    """Tenant B alone, during tenant A's native burst (the same pods, not elected: the clusters
    as loaded, our agent idle), then during A's elected burst; namespaces removed after each."""
    source = bed.clusters[SOURCE]
    targets = [bed.clusters[name] for name in TARGET_CLUSTERS]
    result: dict = {}
    for phase in PHASES:
        a, b = f"fair-a-{index}-{phase[-5:]}", f"fair-b-{index}-{phase[-5:]}"
        await bed.create_namespace(b, enabled=True)
        if phase != "alone":
            await bed.create_namespace(a, enabled=phase == "during_burst")
        try:
            before = await agent_samples(bed)
            async with PodTimes(source, b) as times, Delegates(targets, b) as delegates:
                if phase == "alone":
                    seconds, moments = await tenant_b(bed, b, count, times, delegates)
                else:
                    elect = phase == "during_burst"
                    await source.client.create(
                        DEPLOYMENTS, deployment("tenant-a", burst, elect=elect), a
                    )
                    await replicas(source, a, "replicas", burst // 4, 120)
                    seconds, moments = await tenant_b(bed, b, count, times, delegates)
                    # How far A's burst had gone when B's last pod ran.
                    status = (await source.client.get(DEPLOYMENTS, "tenant-a", a))["status"]
                    result[f"{phase}_a_ready"] = status.get("readyReplicas", 0)
                    await replicas(source, a, "readyReplicas", burst, 600)
            result[f"{phase}_agent"] = agent_figures(before, await agent_samples(bed))
            result[f"{phase}_s"] = round(seconds, 3)
            result[f"{phase}_stages"] = moments
        finally:
            for namespace in (a, b):
                with contextlib.suppress(Exception):
                    await bed.delete_namespace(namespace)
    return result


def _median_stage(rounds: list[dict], phase: str) -> dict[str, float]:
    out = {}
    for name, start, end in STAGES:
        spans = [
            m[end] - m[start]
            for r in rounds
            for m in r[f"{phase}_stages"]
            if m.get(start) is not None and m.get(end) is not None
        ]
        if spans:
            out[name] = round(statistics.median(spans), 3)
    return out


async def run(bed: BenchBed, burst: int, count: int, rounds: int) -> dict:
    """``rounds`` rounds of tenant B alone, during A's native burst and during A's elected
    burst of ``burst`` pods."""
    results = []
    for i in range(rounds):
        result = await one_round(bed, i, burst, count)
        results.append(result)
        print(
            f"  fairness #{i + 1}: B alone {result['alone_s']}s, during A's native burst "
            f"{result['during_native_burst_s']}s, during A's elected burst "
            f"{result['during_burst_s']}s",
            flush=True,
        )
    medians = {p: statistics.median(r[f"{p}_s"] for r in results) for p in PHASES}
    return {
        "burst": burst,
        "pods": count,
        "rounds": rounds,
        **{f"{p}_s": [r[f"{p}_s"] for r in results] for p in PHASES},
        # B during A's elected burst, against B alone and against B during the same burst
        # native (the clusters as loaded, without our part).
        "ratio": round(medians["during_burst"] / medians["alone"], 3),
        "ratio_to_native_burst": round(medians["during_burst"] / medians["during_native_burst"], 3),
        **{f"stages_{p}": _median_stage(results, p) for p in PHASES},
        "agent_during_burst": [r["during_burst_agent"] for r in results],
        **{
            f"{p}_a_ready": [r[f"{p}_a_ready"] for r in results]
            for p in ("during_native_burst", "during_burst")
        },
    }

"""Benchmark 7: what one pod costs the API servers, counted by the API servers themselves.

The same number of bare pods, first native in the source cluster, then elected with one
namespaced Target (the source → cluster2, so that the source's and the target's requests are
told apart), each from creation to Running and Ready and then deleted by a client as a
ReplicaSet scaling down does. Every cluster's ``apiserver_request_total`` is read before, once
all are Running, and once all are gone; the difference, per pod, by verb and resource, with
events and everything else (leases, nodes, summaries) reported apart from pods.

The CPU every component spends per pod over its whole life is taken in the same phases, less
what it spends at rest (its rate over ``IDLE_S`` seconds just before, times each phase's
length): three control planes idle cost a sizable share of a CPU, which would otherwise count
against whichever workload takes longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter

from multicluster import Cluster, NotFound
from multicluster.resources import PODS

from .bed import SOURCE, BenchBed, PodTimes, cpu_snapshot, cpu_used, pod
from .rollout import CONCURRENCY, create_pods

TARGET = "cluster2"
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}
SETTLE_S = 3.0
IDLE_S = 5.0
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse_requests(text: str) -> Counter[tuple[str, str]]:
    """``apiserver_request_total`` summed by (verb, resource[/subresource]); dry runs left out."""
    found: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("dry_run"):
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        found[(labels.get("verb", ""), resource)] += int(float(match["value"]))
    return found


async def requests(cluster: Cluster) -> Counter[tuple[str, str]]:
    return parse_requests((await cluster.client.request("GET", "/metrics", raw=True)).decode())


async def snapshot(bed: BenchBed) -> dict[str, Counter[tuple[str, str]]]:
    return {name: await requests(cluster) for name, cluster in bed.clusters.items()}


def writes_per_pod(
    before: Counter[tuple[str, str]], after: Counter[tuple[str, str]], pods: int
) -> dict:
    """Writes per pod between two counts: pods (by verb and resource), events, the rest."""
    diff = after.copy()
    diff.subtract(before)
    by_kind: dict[str, dict[str, float]] = {"pods": {}, "events": {}, "other": {}}
    for (verb, resource), count in sorted(diff.items()):
        if verb not in WRITE_VERBS or count <= 0:
            continue
        base = resource.split("/")[0]
        kind = "pods" if base == "pods" else "events" if base == "events" else "other"
        by_kind[kind][f"{verb} {resource}"] = round(count / pods, 2)
    return {
        "pod_writes": round(sum(by_kind["pods"].values()), 2),
        "event_writes": round(sum(by_kind["events"].values()), 2),
        "other_writes": round(sum(by_kind["other"].values()), 2),
        **by_kind,
    }


async def _delete_all(cluster: Cluster, namespace: str, names: list[str]) -> None:
    queue = list(names)

    async def worker() -> None:
        while queue:
            name = queue.pop()
            with contextlib.suppress(NotFound):
                await cluster.client.delete(PODS, name, namespace)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


async def _gone(bed: BenchBed, namespace: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for cluster in bed.clusters.values():
        while True:
            items, _ = await cluster.client.list(PODS, namespace, limit=1)
            if not items:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods of {namespace} still in {cluster.name}")
            await asyncio.sleep(0.5)


def over_idle(
    before: dict[str, float],
    after: dict[str, float],
    seconds: float,
    idle: dict[str, float],
    pods: int,
) -> dict[str, float]:
    """Milliseconds of CPU per pod by component between two snapshots ``seconds`` apart, less
    each component's ``idle`` rate (CPU seconds per second) over that time; never below 0."""
    return {
        kind: round(
            max(0.0, 1000 * (after[kind] - before.get(kind, 0.0) - idle.get(kind, 0.0) * seconds))
            / pods,
            2,
        )
        for kind in sorted(after)
    }


async def idle_rates(bed: BenchBed, seconds: float = IDLE_S) -> dict[str, float]:
    """CPU seconds per second each component spends now, at rest."""
    before = cpu_snapshot(bed)
    await asyncio.sleep(seconds)
    after = cpu_snapshot(bed)
    return {kind: (after[kind] - before.get(kind, 0.0)) / seconds for kind in after}


async def lifecycle(bed: BenchBed, namespace: str, count: int, *, elect: bool) -> dict:
    """``count`` pods created, Running, deleted and gone; requests per pod in each phase."""
    source = bed.clusters[SOURCE]
    await bed.create_namespace(namespace, enabled=elect)
    if elect:
        await asyncio.to_thread(
            bed.join, SOURCE, TARGET, namespace=namespace, name="c1", target_name="c2"
        )
    names = [f"w-{i:05d}" for i in range(count)]
    try:
        async with PodTimes(source, namespace) as times:

            def ours() -> set[str]:
                return (times.proxies if elect else set(times.created)) & set(times.running)

            await asyncio.sleep(SETTLE_S)
            idle = await idle_rates(bed)
            start, cpu_start = await snapshot(bed), cpu_snapshot(bed)
            started = time.monotonic()
            await create_pods(source.client, namespace, [pod(n, elect=elect) for n in names])
            await times.wait(lambda: len(ours()) >= count, 600, f"{count} pods Running")
            running_s = time.monotonic() - started
            await asyncio.sleep(SETTLE_S)
            running, cpu_running = await snapshot(bed), cpu_snapshot(bed)
            running_at = time.monotonic()
            delegates = await bed.count_delegates(namespace) if elect else {}
            await _delete_all(source, namespace, names)
            await _gone(bed, namespace, 600)
            await asyncio.sleep(SETTLE_S)
            end, cpu_end = await snapshot(bed), cpu_snapshot(bed)
            ended_at = time.monotonic()
        life = over_idle(cpu_start, cpu_end, ended_at - started, idle, count)
        result: dict = {
            "pods": count,
            "running_s": round(running_s, 2),
            "delegates": delegates,
            "idle_cpu_percent": {kind: round(100 * rate, 1) for kind, rate in idle.items()},
            "cpu_ms_per_pod": {
                "to_running": cpu_used(cpu_start, cpu_running, count),
                "deletion": cpu_used(cpu_running, cpu_end, count),
            },
            "cpu_ms_per_pod_over_idle": {
                "to_running": over_idle(cpu_start, cpu_running, running_at - started, idle, count),
                "deletion": over_idle(cpu_running, cpu_end, ended_at - running_at, idle, count),
                "life": life,
            },
        }
        clusters = (SOURCE, TARGET) if elect else (SOURCE,)
        for name in clusters:
            result[name] = {
                "to_running": writes_per_pod(start[name], running[name], count),
                "deletion": writes_per_pod(running[name], end[name], count),
            }
        return result
    finally:
        await bed.delete_namespace(namespace)


def total(result: dict, cluster: str, kind: str = "pod_writes") -> float:
    """Writes per pod over the whole life (creation to gone) in one cluster."""
    phases = result.get(cluster) or {}
    return round(sum(phase[kind] for phase in phases.values()), 2)


async def run(bed: BenchBed, count: int) -> dict:
    native = await lifecycle(bed, "writes-native", count, elect=False)
    print(f"  writes native: {native}", flush=True)
    elected = await lifecycle(bed, "writes-elected", count, elect=True)
    print(f"  writes elected: {elected}", flush=True)
    native_life = native["cpu_ms_per_pod_over_idle"]["life"]
    elected_life = elected["cpu_ms_per_pod_over_idle"]["life"]
    return {
        "pods": count,
        "machine_cpu_ms_per_pod": {
            "native": native_life["machine"],
            "elected": elected_life["machine"],
            "ratio": round(elected_life["machine"] / max(native_life["machine"], 1e-9), 2),
        },
        "agent_cpu_ms_per_pod": elected_life.get("agent", 0.0),
        "native": native,
        "elected": elected,
        "source_pod_writes": {"native": total(native, SOURCE), "elected": total(elected, SOURCE)},
        "target_pod_writes": total(elected, TARGET),
        "event_writes": {
            "native": total(native, SOURCE, "event_writes"),
            "source": total(elected, SOURCE, "event_writes"),
            "target": total(elected, TARGET, "event_writes"),
        },
    }

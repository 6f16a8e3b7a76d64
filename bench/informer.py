"""Benchmark: an informer over 10,000 pods of one real cluster.

    python -m bench.informer [--pods 10000] [--out results.json]

Starts a one-cluster test bed (or uses ``--kubeconfig``/``--context``), creates the pods (bound
to kwok nodes, which mark them Running), then, for full objects and for a slim projection,
measures in a fresh process: the initial sync time, the RSS added per cached pod, and how many
watch events per second the informer applies when 10,000 changes are replayed to it at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from multicluster import AlreadyExists, Cluster, Informer, gctune
from multicluster.informer import strip_managed_fields
from multicluster.resources import NAMESPACES, NODES, PODS

NAMESPACE = "bench-informer"
ROOT = Path(__file__).resolve().parents[1]


def slim_pod(pod: dict) -> dict:
    """What a scheduler-like controller keeps of a pod."""
    meta = pod["metadata"]
    spec = pod["spec"]
    status = pod.get("status") or {}
    return {
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "labels": meta.get("labels"),
            "ownerReferences": meta.get("ownerReferences"),
        },
        "spec": {"nodeName": spec.get("nodeName"), "schedulerName": spec.get("schedulerName")},
        "status": {"phase": status.get("phase")},
    }


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def pod_manifest(i: int, nodes: list[str]) -> dict:
    app = f"app-{i % 50}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"pod-{i:05d}",
            "namespace": NAMESPACE,
            "labels": {"app": app, "pod-template-hash": "5d8f7c9b6", "tier": "backend"},
            "annotations": {"example.com/owner": "team-a", "example.com/revision": "42"},
        },
        "spec": {
            "nodeName": nodes[i % len(nodes)],
            "containers": [
                {
                    "name": "main",
                    "image": f"registry.example.com/{app}:1.2.3",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "env": [{"name": "MODE", "value": "production"}],
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "16Mi"},
                        "limits": {"memory": "64Mi"},
                    },
                }
            ],
        },
    }


async def create_pods(cluster: Cluster, count: int) -> float:
    client = cluster.client
    with contextlib.suppress(AlreadyExists):
        await client.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
    nodes, _ = await client.list(NODES)
    names = [n["metadata"]["name"] for n in nodes]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)

    async def worker():
        while not queue.empty():
            i = queue.get_nowait()
            await client.create(PODS, pod_manifest(i, names))

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(32)))
    return count / (time.monotonic() - started)


async def patch_pods(cluster: Cluster, count: int, round_: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    patch = {"metadata": {"labels": {"round": str(round_)}}}

    async def worker():
        while not queue.empty():
            i = queue.get_nowait()
            await cluster.client.patch(PODS, f"pod-{i:05d}", patch, NAMESPACE)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(32)))
    return count / (time.monotonic() - started)


MODES = {
    "full dict": None,
    "full dict without managedFields": strip_managed_fields,
    "slim projection": slim_pod,
}


async def measure(kubeconfig: str, context: str, count: int, mode: str) -> dict:
    """Runs in a fresh process: sync, memory, then replayed events."""
    cluster = Cluster.from_kubeconfig(context, kubeconfig, qps=5000, burst=5000)
    informer = Informer(cluster.client, PODS, NAMESPACE, transform=MODES[mode], cluster=context)
    await cluster.client.get(NAMESPACES, NAMESPACE)  # imports, TLS and pools warm
    gctune.tune_for_caches()  # as the Manager does
    gc.collect()
    before = rss_bytes()
    started = time.monotonic()
    informer.start()
    await informer.wait_synced()
    sync_seconds = time.monotonic() - started
    gc.collect()
    cached = len(informer.store)
    per_pod = (rss_bytes() - before) / cached
    await informer.stop()
    gctune.freeze_cached()

    modified = 0
    done = asyncio.Event()

    def count_modified(event: str, obj: dict, old: dict | None, initial: bool) -> None:
        nonlocal modified
        if event == "MODIFIED":
            modified += 1
            if modified >= count:
                done.set()

    informer.add_handler(count_modified)
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # the pods are being patched meanwhile
    started, cpu_started = time.monotonic(), time.process_time()
    informer.start()
    await asyncio.wait_for(done.wait(), 300)
    replay_seconds = time.monotonic() - started
    replay_cpu = time.process_time() - cpu_started
    await informer.stop()
    await cluster.stop()
    return {
        "objects": mode,
        "cached_pods": cached,
        "initial_sync_s": round(sync_seconds, 2),
        "rss_per_pod_kib": round(per_pod / 1024, 2),
        "events_per_s": round(count / replay_seconds),
        "events_per_cpu_s": round(count / replay_cpu),
    }


async def orchestrate(args: argparse.Namespace, kubeconfig: str, context: str) -> list[dict]:
    cluster = Cluster.from_kubeconfig(context, kubeconfig, qps=5000, burst=5000)
    try:
        existing, _ = await cluster.client.list(PODS, NAMESPACE, limit=1)
        create_rate = None
        if not existing:
            create_rate = await create_pods(cluster, args.pods)
            print(f"created {args.pods} pods at {create_rate:.0f}/s", file=sys.stderr)
        results = []
        for round_, mode in enumerate(MODES):
            proc = subprocess.Popen(  # noqa: ASYNC220 - a measuring child, started once
                [
                    sys.executable,
                    "-m",
                    "bench.informer",
                    "--measure",
                    "--kubeconfig",
                    kubeconfig,
                    "--context",
                    context,
                    "--pods",
                    str(args.pods),
                    "--mode",
                    mode,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            assert proc.stdin is not None
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            patch_rate = await patch_pods(cluster, args.pods, round_ + int(time.time()))
            proc.stdin.write("go\n")
            proc.stdin.flush()
            result = json.loads(proc.stdout.readline())
            proc.wait(60)
            result["api_patch_rate_per_s"] = round(patch_rate)
            if create_rate:
                result["api_create_rate_per_s"] = round(create_rate)
            results.append(result)
        return results
    finally:
        if not args.keep:
            await cluster.client.delete(NAMESPACES, NAMESPACE, missing_ok=True)
        await cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context", default="bench")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the pods (and reuse them on the next run)"
    )
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        result = asyncio.run(measure(args.kubeconfig, args.context, args.pods, args.mode))
        print(json.dumps(result), flush=True)
        return 0

    bed = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        from testbed import ClusterSpec, TestBed
        from testbed.testbin import build

        directory = Path(tempfile.mkdtemp(prefix="bench-informer-"))
        bed = TestBed([ClusterSpec(args.context, nodes=4)], directory, build())
        bed.up()
        kubeconfig = str(bed.kubeconfig)
    try:
        results = asyncio.run(orchestrate(args, kubeconfig, args.context))
    finally:
        if bed is not None:
            bed.down()
    report = {
        "benchmark": "informer over pods of one cluster",
        "pods": args.pods,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "results": results,
    }
    print(json.dumps(report, indent=2))
    print()
    print(
        "| objects | initial sync (s) | RSS per pod (KiB) | events/s applied "
        "| events per CPU-second |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['objects']} | {r['initial_sync_s']} | {r['rss_per_pod_kib']} "
            f"| {r['events_per_s']} | {r['events_per_cpu_s']} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

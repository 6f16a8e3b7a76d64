"""Benchmark: what the agent's pod caches cost, without a cluster.

    python -m bench.memory [--pods 10000] [--targets 10] [--local 1667] [--json]

Builds pods as the scale benchmark leaves them (docs/performance.md, "6. Scale"): proxy pods
as the webhook mutated them, bound to a virtual node and showing their delegate's status;
delegates as kwok makes them Running in a target; the delegates that run in this cluster once
more, as the summary's pods. Each is encoded to JSON and decoded on its own (as a list page
or a watch event gives it: no string shared between pods), then goes through the agent's
transform into an informer store with the indexes the agent adds. Prints, per cache, the
bytes each object holds (tracemalloc, store and indexes included), then the RSS of a fresh
process that imports the agent and loads every cache.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Callable, Iterator

import orjson

from multicluster.gctune import freeze_cached, tune_for_caches
from multicluster.informer import Store, object_key
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import (
    PROXY_UID_INDEX,
    delegate_name,
    proxy_uid_index,
    slim_delegate,
    slim_proxy,
)
from multicluster_scheduler.summary.compute import RequestedLedger, slim_pod
from multicluster_scheduler.targets.registry import (
    DELEGATE_INDEX,
    REFERENCE_INDEX,
    by_parent_uid,
    by_reference,
)

NAMESPACES = ("scale-a", "scale-b", "scale-c", "scale-d")
CLUSTER_NAME = "5f1a3c4e-9b7d-4e2a-8c61-0d2f4b6a8e10"
NODES_PER_TARGET = 5
PODS_PER_SECOND = 48  # as the scale benchmark places them


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _uid(*parts: object) -> str:
    return str(uuid.UUID(bytes=hashlib.md5(repr(parts).encode()).digest()))


def _time(second: int) -> str:
    return f"2026-11-22T{5 + second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"


def _template(namespace: str) -> tuple[dict, str]:
    """The scale benchmark's pod template, and its ReplicaSet's hash."""
    spec = {
        "containers": [
            {
                "name": "nginx",
                "image": "nginx",
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "ports": [{"containerPort": 80, "protocol": "TCP"}],
            }
        ]
    }
    return spec, hashlib.sha256(namespace.encode()).hexdigest()[:10]


def _defaulted(spec: dict, volume: str) -> dict:
    """``spec`` as an API server stores it: defaults, and the service account token mounted."""
    containers = [
        {
            **c,
            "imagePullPolicy": "Always",
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "volumeMounts": [
                {
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "name": volume,
                    "readOnly": True,
                }
            ],
        }
        for c in spec["containers"]
    ]
    return {
        **spec,
        "containers": containers,
        "dnsPolicy": "ClusterFirst",
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "serviceAccount": "default",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
        "volumes": [
            {
                "name": volume,
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                "name": "kube-root-ca.crt",
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "fieldRef": {
                                            "apiVersion": "v1",
                                            "fieldPath": "metadata.namespace",
                                        },
                                        "path": "namespace",
                                    }
                                ]
                            }
                        },
                    ],
                },
            }
        ],
    }


def _managed(manager: str, operation: str, time: str, fields: dict, sub: str = "") -> dict:
    entry = {
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
        "manager": manager,
        "operation": operation,
        "time": time,
    }
    if sub:
        entry["subresource"] = sub
    return entry


def running_status(i: int, node: str, host_ip: str, started: str, scheduled: str) -> dict:
    """A pod's status once kube-scheduler bound it and kwok made it Running (kwok's
    ``pod-ready`` stage), with the API server's qosClass."""
    pod_ip = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"

    def condition(kind: str, at: str) -> dict:
        return {"lastProbeTime": None, "lastTransitionTime": at, "status": "True", "type": kind}

    return {
        "conditions": [
            condition("Initialized", started),
            condition("Ready", started),
            condition("ContainersReady", started),
            condition("PodScheduled", scheduled),
        ],
        "containerStatuses": [
            {
                "image": "nginx",
                "imageID": "",
                "lastState": {},
                "name": "nginx",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": started}},
            }
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "phase": "Running",
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "qosClass": "Burstable",
        "startTime": started,
    }


def pod_pair(i: int, targets: int) -> tuple[dict, dict, int]:
    """The ``i``-th proxy pod, its delegate, and the index of the target it runs in."""
    namespace = NAMESPACES[i % len(NAMESPACES)]
    target = i % targets
    spec, template_hash = _template(namespace)
    name = f"scale-{template_hash}-{_uid(i)[:5]}"
    uid, delegate_uid = _uid("proxy", i), _uid("delegate", i)
    replica_set = f"scale-{template_hash}"
    second = i // PODS_PER_SECOND
    created, scheduled, started = _time(second), _time(second + 1), _time(second + 2 + i % 3)
    labels = {"app": "scale", "pod-template-hash": template_hash}
    owner = {
        "apiVersion": "apps/v1",
        "blockOwnerDeletion": True,
        "controller": True,
        "kind": "ReplicaSet",
        "name": replica_set,
        "uid": _uid("rs", namespace),
    }
    received = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": f"{replica_set}-",
            "namespace": namespace,
            "labels": labels,
            "annotations": {keys.ELECT: ""},
            "ownerReferences": [owner],
        },
        "spec": _defaulted(spec, f"kube-api-access-{_uid('v', i)[:5]}"),
        "status": {},
    }
    node = f"admiralty-namespace-{namespace}-c{target % 3 + 1}"
    real_node = f"kwok-node-{target % 3}-{i % NODES_PER_TARGET}"
    host_ip = f"10.0.{target % 3}.{i % NODES_PER_TARGET + 1}"
    status = running_status(i, real_node, host_ip, started, scheduled)
    proxy_spec = {
        **received["spec"],
        "nodeName": node,
        "nodeSelector": {keys.PROVIDER_KEY: keys.PROVIDER},
        "schedulerName": keys.PROXY_SCHEDULER_NAME,
        "terminationGracePeriodSeconds": 0,
        "tolerations": [
            {"key": keys.PROVIDER_KEY, "operator": "Equal", "value": keys.PROVIDER},
            {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists"},
            {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists"},
            {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists"},
        ],
    }
    proxy = {
        "metadata": {
            "name": name,
            "generateName": f"{replica_set}-",
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": str(100_000 + 7 * i),
            "generation": 1,
            "creationTimestamp": created,
            "labels": {**labels, keys.HAS_FINALIZER: "true"},
            "annotations": {
                keys.ELECT: "",
                keys.SOURCEPOD_MANIFEST: json.dumps(received, separators=(",", ":")),
            },
            "ownerReferences": [owner],
            "finalizers": [keys.FINALIZER],
            "managedFields": [
                _managed(
                    "kube-controller-manager",
                    "Update",
                    created,
                    {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}}}},
                ),
                _managed("multicluster-scheduler", "Update", started, {"f:status": {}}, "status"),
            ],
        },
        "spec": proxy_spec,
        "status": status,
    }
    delegate_labels = {f"{keys.PREFIX}{k}": v for k, v in labels.items()}
    delegate = {
        "metadata": {
            "name": delegate_name(name, uid),
            "namespace": namespace,
            "uid": delegate_uid,
            "resourceVersion": str(200_000 + 5 * i),
            "generation": 1,
            "creationTimestamp": created,
            "labels": {**delegate_labels, keys.PARENT_UID: uid},
            "annotations": {
                keys.PARENT_NAME: name,
                keys.PARENT_NAMESPACE: namespace,
                keys.PARENT_CLUSTER_NAME: CLUSTER_NAME,
            },
            "managedFields": [
                _managed("multicluster-scheduler", "Update", created, {"f:metadata": {}}),
                _managed("kwok", "Update", started, {"f:status": {}}, "status"),
            ],
        },
        "spec": {
            **_defaulted(spec, f"kube-api-access-{_uid('w', i)[:5]}"),
            "nodeName": real_node,
            "tolerations": [
                {
                    "effect": "NoExecute",
                    "key": f"node.kubernetes.io/{taint}",
                    "operator": "Exists",
                    "tolerationSeconds": 300,
                }
                for taint in ("not-ready", "unreachable")
            ],
        },
        "status": status,
    }
    return proxy, delegate, target


def encoded(pods: int, targets: int) -> Iterator[tuple[bytes, bytes, int]]:
    for i in range(pods):
        proxy, delegate, target = pod_pair(i, targets)
        yield orjson.dumps(proxy), orjson.dumps(delegate), target


def _node_of(pod: dict) -> list[str]:
    """The virtual kubelet's index of proxy pods by node."""
    node = pod["spec"].get("nodeName")
    return [node] if node else []


class Caches:
    """The agent's pod caches, with the indexes it adds to them."""

    def __init__(self, targets: int) -> None:
        self.proxies = Store()
        self.proxies.add_indexer(PROXY_UID_INDEX, proxy_uid_index)
        self.proxies.add_indexer("node", _node_of)
        self.delegates = [Store() for _ in range(targets)]
        for store in self.delegates:
            store.add_indexer(DELEGATE_INDEX, by_parent_uid)
            store.add_indexer(REFERENCE_INDEX, by_reference)
        self.summary = Store()
        self.requested = RequestedLedger()

    def add_proxy(self, raw: bytes) -> None:
        put(self.proxies, slim_proxy, raw)

    def add_delegate(self, raw: bytes, target: int) -> None:
        put(self.delegates[target], slim_delegate, raw)

    def add_local(self, raw: bytes) -> None:
        key, pod = put(self.summary, slim_pod, raw)
        self.requested.update(key, pod)


def put(store: Store, transform: Callable[[dict], dict], raw: bytes) -> tuple[str, dict]:
    obj = transform(orjson.loads(raw))
    key = object_key(obj)
    store.put(key, obj)
    return key, obj


def per_object(args: argparse.Namespace) -> dict[str, float]:
    """Bytes each cached object holds, by cache (tracemalloc: Python's own allocations)."""
    pairs = list(encoded(args.pods, args.targets))
    caches = Caches(args.targets)
    results: dict[str, float] = {}
    loads: list[tuple[str, int, Callable[[], None]]] = [
        ("proxy", args.pods, lambda: [caches.add_proxy(p) for p, _, _ in pairs]),
        ("delegate", args.pods, lambda: [caches.add_delegate(d, t) for _, d, t in pairs]),
        (
            "summary pod",
            args.local,
            lambda: [caches.add_local(d) for _, d, _ in pairs[: args.local]],
        ),
    ]
    tracemalloc.start()
    for name, count, load in loads:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        load()
        gc.collect()
        results[name] = (tracemalloc.get_traced_memory()[0] - before) / max(count, 1)
    tracemalloc.stop()
    raw = pairs[0]
    results["proxy JSON"] = len(raw[0])
    results["delegate JSON"] = len(raw[1])
    return results


def whole(args: argparse.Namespace) -> dict[str, float]:
    """RSS of this process (the agent's modules imported) before and after every cache is
    loaded, as the agent's manager leaves it (its collector tuning, caches frozen)."""
    import multicluster_scheduler.agent  # noqa: F401  (what the agent's process imports)

    tune_for_caches()
    gc.collect()
    imported = rss_mb()
    caches = Caches(args.targets)
    for i, (proxy, delegate, target) in enumerate(encoded(args.pods, args.targets)):
        caches.add_proxy(proxy)
        caches.add_delegate(delegate, target)
        if i < args.local:
            caches.add_local(delegate)
    freeze_cached()
    return {"imported_mb": round(imported, 1), "loaded_mb": round(rss_mb(), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--pods", type=int, default=10_000, help="proxy pods (and delegates)")
    parser.add_argument("--targets", type=int, default=10, help="targets they are spread over")
    parser.add_argument(
        "--local", type=int, help="delegates in this cluster (default: a sixth, as at scale)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON line instead of a table")
    parser.add_argument("--rss-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.local is None:
        args.local = args.pods // 6
    if args.rss_only:
        print(json.dumps(whole(args)))
        return 0
    sizes = per_object(args)
    command = [sys.executable, "-m", "bench.memory", "--rss-only"]
    command += [
        "--pods",
        str(args.pods),
        "--targets",
        str(args.targets),
        "--local",
        str(args.local),
    ]
    rss = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    if args.json:
        print(json.dumps({**vars(args), **sizes, **rss}))
        return 0
    print(f"{args.pods} proxies and delegates over {args.targets} targets, {args.local} local")
    for name, size in sizes.items():
        print(f"  {name:<12} {size:8.0f} B")
    print(f"  RSS: {rss['imported_mb']} MB imported, {rss['loaded_mb']} MB with the caches")
    return 0


if __name__ == "__main__":
    sys.exit(main())

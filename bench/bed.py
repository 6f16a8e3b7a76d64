"""The benchmarks' test bed: three real clusters sized for 10,000s of pods, the chart installed
in each, and the helpers every benchmark shares (an async view of pods, namespaces, joins).

Clusters run with their controller manager's and scheduler's client QPS raised (1,000, burst
2,000), so the native baseline is bounded by the machine, not by client-side throttling. Fake
nodes take 2,000 pods each (the growth benchmark places 20,000 pods over three clusters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from multicluster import AlreadyExists, Cluster, Informer, NotFound
from multicluster.resources import NAMESPACES, PODS
from multicluster_scheduler.api.keys import ELECT, PARENT_UID, PROXY_SCHEDULER_NAME
from testbed import ClusterSpec, TestBed
from testbed.guide import nginx_object, running_and_ready
from testbed.install import Installation

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ("cluster1", "cluster2", "cluster3")
SOURCE = CLUSTERS[0]
CLIENT_QPS = 1000


def specs(nodes: int = 5, pods_per_node: int = 2000) -> list[ClusterSpec]:
    return [
        ClusterSpec(
            name=name,
            nodes=nodes,
            allocatable={"cpu": "256", "memory": "1Ti", "pods": str(pods_per_node)},
            client_qps=CLIENT_QPS,
            memory_limits={
                "etcd": "1GiB",
                "kube-apiserver": "2GiB",
                "kube-controller-manager": "768MiB",
                "kube-scheduler": "768MiB",
                "kwok": "768MiB",
            },
        )
        for name in CLUSTERS
    ]


def machine() -> dict:
    """What the figures were measured on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(memory / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def versions(bin_dir: Path) -> dict:
    from testbed.testbin import load_pins

    found = {tool.name: tool.version for tool in load_pins()}
    try:
        import importlib.metadata

        found["multicluster-scheduler"] = importlib.metadata.version("multicluster-scheduler")
    except Exception:
        pass
    return found


def pod(name: str | None = None, *, elect: bool, app: str = "bench", **spec_extra) -> dict:
    """A small nginx pod, as in the guide (10m CPU so thousands fit); its Deployment is
    :func:`deployment`."""
    metadata: dict = {"labels": {"app": app}}
    if name:
        metadata["name"] = name
    else:
        metadata["generateName"] = f"{app}-"
    if elect:
        metadata["annotations"] = {ELECT: ""}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "nginx",
                    "image": "nginx",
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                    "ports": [{"containerPort": 80}],
                }
            ],
            **spec_extra,
        },
    }


def deployment(name: str, replicas: int, *, elect: bool) -> dict:
    """The guide's nginx Deployment, with 10m CPU per replica so that thousands fit."""
    return nginx_object(replicas, name, elect, cpu="10m")


def slim(obj: dict) -> dict:
    meta = obj["metadata"]
    return {
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "resourceVersion": meta.get("resourceVersion"),
            "labels": meta.get("labels"),
            "deletionTimestamp": meta.get("deletionTimestamp"),
        },
        "spec": {
            "nodeName": obj["spec"].get("nodeName"),
            "schedulerName": obj["spec"].get("schedulerName"),
        },
        "status": {
            "phase": (obj.get("status") or {}).get("phase"),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in (obj.get("status") or {}).get("conditions") or ()
            ],
        },
    }


class PodTimes:
    """When each pod of a namespace (None: of every namespace, those ``label_selector`` selects)
    was first seen, bound to a node, and Running and Ready, as seen by a watch (monotonic
    seconds); wait for counts of each."""

    def __init__(
        self, cluster: Cluster, namespace: str | None, *, label_selector: str | None = None
    ) -> None:
        self.informer = Informer(
            cluster.client,
            PODS,
            namespace,
            label_selector=label_selector,
            transform=slim,
            page_size=5000,
        )
        self.informer.add_handler(self._on_event)
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.proxies: set[str] = set()
        self._changed = asyncio.Event()

    def _on_event(self, event: str, obj: dict, _old: dict | None, _initial: bool) -> None:
        now = time.monotonic()
        uid = obj["metadata"]["uid"]
        if event == "DELETED":
            self._changed.set()
            return
        self.created.setdefault(uid, now)
        if obj["spec"].get("schedulerName") == PROXY_SCHEDULER_NAME:
            self.proxies.add(uid)
        if obj["spec"].get("nodeName"):
            self.bound.setdefault(uid, now)
        if running_and_ready(obj):
            self.running.setdefault(uid, now)
        self._changed.set()

    async def __aenter__(self) -> PodTimes:
        self.informer.start()
        await self.informer.wait_synced(60)
        return self

    async def __aexit__(self, *_exc) -> None:
        await self.informer.stop()

    def live(self) -> int:
        return len(self.informer.list())

    async def wait(self, predicate, timeout: float, what: str) -> float:
        """Wait until ``predicate()``; the monotonic time it first held."""
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"timed out after {timeout:.0f}s waiting for {what} (created "
                    f"{len(self.created)}, bound {len(self.bound)}, running {len(self.running)})"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
        return time.monotonic()


def process_stats(pid: int) -> dict:
    """RSS, peak RSS (bytes) and CPU seconds (user + system) of a process."""
    stats = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                stats[line.split(":")[0]] = int(line.split()[1]) * 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "rss": stats["VmRSS"],
        "peak_rss": stats["VmHWM"],
        "cpu_s": (int(fields[11]) + int(fields[12])) / ticks,
    }


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _is_py_spy(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip() == "py-spy"
    return False


def agent_processes(pid: int) -> tuple[int, list[int]]:
    """An agent's own process and its children (the webhook's process), given the pid the test
    bed started: under ``--profile`` that is py-spy's, and the agent is py-spy's child."""
    if _is_py_spy(pid):
        found = children(pid)
        if found:
            pid = found[0]
    return pid, children(pid)


def agent_stats(pid: int) -> dict:
    """``process_stats`` of an agent with every process it runs (the webhook's): RSS of each
    part, CPU seconds of all (py-spy's own left out when profiling)."""
    own, kids = agent_processes(pid)
    main = process_stats(own)
    rest = []
    for kid in kids:
        with contextlib.suppress(OSError, KeyError):
            rest.append(process_stats(kid))
    return {
        "rss": main["rss"],
        "peak_rss": main["peak_rss"],
        "children_rss": sum(s["rss"] for s in rest),
        "children_peak_rss": sum(s["peak_rss"] for s in rest),
        "cpu_s": main["cpu_s"] + sum(s["cpu_s"] for s in rest),
    }


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_snapshot(bed: BenchBed) -> dict[str, float]:
    """CPU seconds so far of every test-bed component (summed over clusters) and the machine.
    An agent counts with its webhook's process."""
    found: dict[str, float] = {"machine": machine_busy_s()}
    for cluster in bed.testbed.clusters.values():
        for name, process in cluster.processes.items():
            if process.pid is None or not process.running:
                continue
            agent = name.startswith("agent")
            stats = agent_stats if agent else process_stats
            kind = "agent" if agent else name
            with contextlib.suppress(OSError, KeyError):
                found[kind] = found.get(kind, 0.0) + stats(process.pid)["cpu_s"]
    return found


def cpu_used(before: dict[str, float], after: dict[str, float], per: int) -> dict[str, float]:
    """Milliseconds of CPU per item (``per`` items), by component, between two snapshots."""
    return {
        kind: round(1000 * (after[kind] - before.get(kind, 0.0)) / per, 2) for kind in sorted(after)
    }


def sustained_rate(times: list[float], low: float = 0.1, high: float = 0.9) -> float:
    """Events per second between the ``low`` and ``high`` fractions of them (start-up and tail
    excluded)."""
    ordered = sorted(times)
    if len(ordered) < 10:
        return len(ordered) / max(ordered[-1] - ordered[0], 1e-9) if len(ordered) > 1 else 0.0
    first = ordered[int(len(ordered) * low)]
    last = ordered[int(len(ordered) * high) - 1]
    count = int(len(ordered) * high) - int(len(ordered) * low)
    return count / max(last - first, 1e-9)


class BenchBed:
    """Three clusters with the chart installed and agents running; clients for each."""

    def __init__(
        self,
        directory: Path,
        *,
        nodes: int = 5,
        agent_args: tuple[str, ...] = (),
        profile: Path | None = None,
    ):
        from testbed.testbin import build

        self.dir = directory
        self.profile = profile
        self.bin_dir = build()
        self.testbed = TestBed(specs(nodes), directory / "testbed", self.bin_dir)
        self.installation = Installation(self.testbed, agent_args=agent_args)
        self.clusters: dict[str, Cluster] = {}

    @property
    def kubeconfig(self) -> Path:
        return self.testbed.kubeconfig

    def up(self) -> None:
        started = time.monotonic()
        self.testbed.up(timeout=300)
        self.installation.install()
        if self.profile is not None:
            # The source agent sampled by py-spy (attaching to a running process needs ptrace
            # rights this machine may not grant; a child is always allowed).
            agent = self.installation.agents[SOURCE][0]
            py_spy = Path(sys.executable).with_name("py-spy")
            agent.argv = [
                str(py_spy),
                "record",
                # Sampled without pausing it: py-spy's default stops the process at each of
                # the 100 samples a second, which cut its placement rate by two thirds.
                "--nonblocking",
                "-f",
                "raw",
                "-r",
                "100",
                "-o",
                str(self.profile),
                "--",
                *agent.argv,
            ]
        self.installation.start_agents(timeout=120)
        print(f"test bed up with agents in {time.monotonic() - started:.0f}s", file=sys.stderr)

    def stop_profile(self) -> None:
        """py-spy writes its samples on SIGINT; the agent it runs is stopped after."""
        agent = self.installation.agents[SOURCE][0]
        if self.profile is None or agent.pid is None or not agent.running:
            return
        children = []
        for task in Path(f"/proc/{agent.pid}/task").iterdir():
            children += (task / "children").read_text().split()
        with self.installation._lock:  # the keeper must not restart it
            self.installation.agents[SOURCE] = self.installation.agents[SOURCE][1:]
        os.kill(agent.pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while agent.running and time.monotonic() < deadline:
            time.sleep(0.1)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGTERM)

    def down(self) -> None:
        self.stop_profile()
        self.installation.stop_agents()
        self.testbed.down()

    def connect(self) -> None:
        """Async clients (call inside the event loop), unthrottled: the bench is the load."""
        for name in CLUSTERS:
            self.clusters[name] = Cluster.from_kubeconfig(
                name, str(self.kubeconfig), name, qps=100_000, burst=100_000
            )

    async def close(self) -> None:
        for cluster in self.clusters.values():
            await cluster.client.close()
        self.clusters.clear()

    def env(self) -> dict[str, str]:
        return self.testbed.kubectl_env() | {"PYTHONPATH": str(ROOT)}

    def kubectl(self, context: str, *args: str, stdin: str | None = None) -> str:
        argv = [str(self.bin_dir / "kubectl"), "--context", context, *args]
        proc = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, env=self.env(), timeout=300
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout

    def join(self, source: str, target: str, *, namespace: str | None, name: str, target_name: str):
        """Our ``join`` command: Source in the target, Secret and Target in the source."""
        argv = [sys.executable, "-m", "multicluster_scheduler.cli", "join"]
        argv += ["--kubeconfig", str(self.kubeconfig)]
        argv += ["--source-context", source, "--target-context", target]
        argv += ["-n", namespace] if namespace else ["--cluster-scoped"]
        argv += ["--name", name, "--target-name", target_name, "--timeout", "60"]
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env(), timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"join {source} → {target} failed: {proc.stderr.strip()}")

    async def create_namespace(self, name: str, *, enabled: bool, clusters=CLUSTERS) -> None:
        labels = {"multicluster-scheduler": "enabled"} if enabled else {}
        for cluster in clusters:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            if labels and cluster == SOURCE:
                body["metadata"]["labels"] = labels
            with contextlib.suppress(AlreadyExists):
                await self.clusters[cluster].client.create(NAMESPACES, body)

    async def delete_namespace(self, name: str, *, timeout: float = 300) -> None:
        """Delete a namespace everywhere and wait until it is gone (its pods with it)."""
        for cluster in self.clusters.values():
            with contextlib.suppress(NotFound):
                await cluster.client.delete(NAMESPACES, name)
        deadline = time.monotonic() + timeout
        for cluster in self.clusters.values():
            while True:
                try:
                    await cluster.client.get(NAMESPACES, name)
                except NotFound:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"namespace {name} still in {cluster.name}")
                await asyncio.sleep(0.5)

    async def count_delegates(self, namespace: str) -> dict[str, int]:
        found = {}
        for name, cluster in self.clusters.items():
            items, _ = await cluster.client.list(
                PODS, namespace, label_selector=PARENT_UID, limit=5000
            )
            found[name] = len([p for p in items if not p["metadata"].get("deletionTimestamp")])
        return found

    def agent_log(self, cluster: str = SOURCE) -> Path:
        return self.installation.agents[cluster][0].log_path


def dump(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")

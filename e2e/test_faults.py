"""Faults injected during rollouts of a few hundred elected pods, with two agent replicas per
cluster (as the chart runs them, behind one webhook address): a target API server stopped for a
minute, the source API server restarted, agents SIGKILLed again and again, the leader lost, the
webhook unavailable, a Target deleted while it hosts proxy pods, and a target that stays away
past its failover setting.

After each fault the same invariants are checked: every replica Running; at most one delegate
per proxy pod; no orphaned delegate, config-map copy or service copy; and once the workload is
deleted, nothing is left behind in any cluster and no finalizer is stuck.

``MCS_FAULT_REPLICAS`` (default 200), ``MCS_FAULT_KILLS`` (20) and ``MCS_FAULT_OUTAGE`` (60
seconds) size the runs; docs/reliability.md gives the long variant's command.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter

import pytest

from e2e.scenarios import (
    SOURCE,
    TARGET,
    condition,
    connect,
    disconnect,
    live,
    pods,
    proxies,
    restart_api_server,
    running_and_ready,
)
from multicluster import Cluster
from multicluster_scheduler.agent import cluster_identity
from multicluster_scheduler.api.keys import PREFIX
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import CommandError, Kubectl

PARENT_UID = PREFIX + "parent-uid"
WEBHOOK = "proxy-pods.multicluster.admiralty.io"
REPLICAS = int(os.environ.get("MCS_FAULT_REPLICAS", "200"))
KILLS = int(os.environ.get("MCS_FAULT_KILLS", "20"))
OUTAGE = float(os.environ.get("MCS_FAULT_OUTAGE", "60"))
LEASE_DURATION = 15.0
SETTLE = 300.0
NAME = "web"
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def installation(testbed: TestBed):
    """Two agents per cluster, each restarted when it dies (unless a test holds it down)."""
    install = Installation(testbed, agents_per_cluster=2)
    install.install()
    install.start_agents()
    yield install
    if install.installed:
        install.uninstall()


def workload(namespace: str, replicas: int) -> str:
    """A Deployment whose pods read a config map (followed to targets), behind a Service
    (rerouted to delegates and made global, so copied to targets)."""
    return f"""apiVersion: v1
kind: ConfigMap
metadata:
  name: {NAME}-config
  namespace: {namespace}
data:
  GREETING: hello
---
apiVersion: v1
kind: Service
metadata:
  name: {NAME}
  namespace: {namespace}
spec:
  selector:
    app: {NAME}
  ports:
  - port: 80
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {NAME}
  namespace: {namespace}
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: {NAME}
  template:
    metadata:
      labels:
        app: {NAME}
      annotations:
        multicluster.admiralty.io/elect: ""
    spec:
      containers:
      - name: nginx
        image: nginx
        envFrom:
        - configMapRef:
            name: {NAME}-config
        resources:
          requests:
            cpu: 50m
            memory: 32Mi
"""


class Rollout:
    """One namespace connected to targets c1 (self) and c2, enabled, with the workload."""

    def __init__(self, kubectl: Kubectl, testbed: TestBed, namespace: str, nodes: list[str]):
        self.kubectl = kubectl
        self.testbed = testbed
        self.namespace = namespace
        self.self_node, self.remote_node = nodes

    def start(self, replicas: int = REPLICAS) -> None:
        self.kubectl.apply(SOURCE, workload(self.namespace, replicas))

    def scale(self, replicas: int) -> None:
        self.kubectl(
            SOURCE, "scale", "deployment", NAME, "-n", self.namespace, f"--replicas={replicas}"
        )

    def proxies(self) -> list[dict]:
        return live(proxies(self.kubectl, self.namespace))

    def on(self, node: str) -> list[dict]:
        return [p for p in self.proxies() if p["spec"].get("nodeName") == node]

    def running_on(self, node: str) -> int:
        return sum(1 for p in self.on(node) if running_and_ready(p))

    def delegates(self, context: str) -> list[dict]:
        found = pods(self.kubectl, context, self.namespace, "-l", PARENT_UID)
        return [d for d in found if not d["metadata"].get("deletionTimestamp")]

    def all_running(self, replicas: int) -> bool:
        found = self.proxies()
        return len(found) == replicas and all(
            p.get("status", {}).get("phase") == "Running" for p in found
        )

    def mirror_errors(self) -> list[str]:
        """Proxy pods whose readiness is not their delegate's (a fake kubelet that missed a
        status update while its API server was down leaves a delegate Running but not Ready:
        the proxy pod must say the same)."""
        ready = {
            d["metadata"]["labels"][PARENT_UID]: condition(d, "Ready").get("status")
            for context in (SOURCE, TARGET)
            for d in self.delegates(context)
        }
        return [
            p["metadata"]["name"]
            for p in self.proxies()
            if condition(p, "Ready").get("status") != ready.get(p["metadata"]["uid"])
        ]

    def violations(self) -> list[str]:
        """Invariant violations now: duplicate delegates, orphaned delegates or copies."""
        uids = {p["metadata"]["uid"] for p in self.proxies()}
        problems = []
        delegates = {c: self.delegates(c) for c in (SOURCE, TARGET)}
        parents = Counter(
            d["metadata"]["labels"][PARENT_UID] for found in delegates.values() for d in found
        )
        duplicates = [u for u, n in parents.items() if n > 1]
        if duplicates:
            problems.append(f"{len(duplicates)} proxy pods with more than one delegate")
        orphans = set(parents) - uids
        if orphans:
            problems.append(f"{len(orphans)} orphaned delegates")
        copy = self._get(TARGET, "configmap", f"{NAME}-config")
        if delegates[TARGET] and copy is None:
            problems.append("the config map was not copied to cluster2")
        if not delegates[TARGET] and copy is not None:
            problems.append("an orphaned config-map copy in cluster2")
        return problems

    def _get(self, context: str, kind: str, name: str) -> dict | None:
        out = self.kubectl(
            context, "get", kind, name, "-n", self.namespace, "--ignore-not-found", "-o", "json"
        )
        return json.loads(out) if out.strip() else None

    def settle(
        self, replicas: int = REPLICAS, timeout: float = SETTLE, remote: bool = True
    ) -> dict:
        """Wait until every replica runs and the invariants hold; return where they run.
        ``remote``: cluster2 is still a target (so it holds a copy of the global service)."""
        started = time.monotonic()
        try:
            wait_for(
                lambda: self.all_running(replicas), timeout, what=f"{replicas} replicas Running"
            )
        except Exception:
            print("replicas:", self.describe())
            raise
        # Orphans left by a fault are deleted as soon as their target is reachable.
        try:
            wait_for(lambda: not self.violations(), 60, what="no duplicate or orphan")
        except Exception:
            print("violations:", self.violations(), "replicas:", self.describe())
            raise
        assert not self.violations()
        wait_for(lambda: not self.mirror_errors(), 60, what="readiness mirrored")
        try:
            wait_for(
                lambda: (self._get(TARGET, "service", NAME) is not None) == remote,
                30,
                what=f"the global service's copy in cluster2 {'made' if remote else 'deleted'}",
            )
        except Exception:
            original = self._get(SOURCE, "service", NAME) or {}
            print("original service:", original.get("metadata"), original.get("spec"))
            raise
        found = self.proxies()
        return {
            "settled_s": round(time.monotonic() - started, 1),
            "placed": dict(Counter(p["spec"]["nodeName"] for p in found)),
            "ready": sum(1 for p in found if running_and_ready(p)),
        }

    def describe(self) -> dict[str, int]:
        """How many proxy pods are in each state: node, phase, and why if not scheduled."""
        states: Counter[str] = Counter()
        for p in proxies(self.kubectl, self.namespace):
            scheduled = condition(p, "PodScheduled")
            states[
                f"{p['spec'].get('nodeName') or 'unbound'} {p['status'].get('phase')}"
                f" ready={condition(p, 'Ready').get('status')}"
                f"{' deleting' if p['metadata'].get('deletionTimestamp') else ''}"
                f" {scheduled.get('reason') or ''} {(scheduled.get('message') or '')[:80]}"
            ] += 1
        return dict(states)

    def left_behind(self) -> list[str]:
        """After the workload is deleted: what is still there, and stuck finalizers."""
        found = []
        for context in (SOURCE, TARGET):
            for kind in ("pods", "configmaps", "services"):
                items = self.kubectl.json(context, "get", kind, "-n", self.namespace)["items"]
                for item in items:
                    meta = item["metadata"]
                    ours = [f for f in meta.get("finalizers") or () if f.startswith(PREFIX)]
                    if kind == "pods" or ours:
                        found.append(f"{context} {kind}/{meta['name']} finalizers={ours}")
                    elif context == TARGET and meta["name"] != "kube-root-ca.crt":
                        found.append(f"{context} {kind}/{meta['name']}")  # a copy
        return found

    def delete(self) -> None:
        for kind in ("deployment", "service", "configmap"):
            self.kubectl(
                SOURCE, "delete", kind, NAME if kind != "configmap" else f"{NAME}-config",
                "-n", self.namespace, "--ignore-not-found", "--wait=false",
            )  # fmt: skip


@pytest.fixture
def rollout(installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str):
    nodes = connect(kubectl, testbed, namespace)
    # A controller manager whose API server restarted may take minutes to make the namespace's
    # default service account, which delegates need; the faults here are not about it.
    for context in testbed.clusters:
        kubectl.run(context, "create", "serviceaccount", "default", "-n", namespace, check=False)
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    subject = Rollout(kubectl, testbed, namespace, nodes)
    yield subject
    for agents in installation.agents.values():
        for agent in agents:
            installation.release(agent)
    for cluster in testbed.clusters.values():
        if not cluster.processes["kube-apiserver"].running:
            restart_api_server(cluster, stopped=True)
    subject.delete()
    try:
        wait_for(lambda: not subject.left_behind(), 120, what="nothing left behind")
    finally:
        print("left behind:", subject.left_behind()[:10])
        disconnect(kubectl, namespace)


def wait_bound(rollout: Rollout, node: str, count: int, timeout: float = 120) -> None:
    wait_for(
        lambda: rollout.running_on(node) >= count, timeout, what=f"{count} proxy pods on {node}"
    )


def test_the_source_api_server_restarted(rollout: Rollout, testbed: TestBed):
    rollout.start()
    wait_bound(rollout, rollout.self_node, REPLICAS // 4)
    restart_api_server(testbed[SOURCE])
    print("source API server restarted:", rollout.settle())


def test_agents_sigkilled_at_random_moments(rollout: Rollout, installation: Installation):
    rng = random.Random(10)
    agents = installation.agents[SOURCE]
    kills: list[str] = []
    rollout.start()

    def kill_some(count: int) -> None:
        while len(kills) < count:
            time.sleep(rng.uniform(0.5, 3.0))
            agent = installation.leader(SOURCE) if rng.random() < 0.7 else rng.choice(agents)
            if agent is not None and agent.running:
                agent.kill()
                kills.append(agent.name)

    kill_some(KILLS // 2)
    rollout.scale(REPLICAS // 2)  # deletions under fire too: finalizers, delegates, copies
    kill_some(3 * KILLS // 4)
    rollout.scale(REPLICAS)
    kill_some(KILLS)
    print(f"{len(kills)} SIGKILLs ({Counter(kills)}):", rollout.settle())


def test_leader_lost_and_the_other_replica_takes_over(rollout: Rollout, installation: Installation):
    rollout.start()
    wait_bound(rollout, rollout.self_node, 20)
    leader = installation.leader(SOURCE)
    assert leader is not None
    installation.hold(leader)
    lost = time.monotonic()
    wait_for(
        lambda: (now := installation.leader(SOURCE)) is not None and now is not leader,
        LEASE_DURATION + 15,
        what="the other replica leads",
    )
    took_over = time.monotonic() - lost
    result = rollout.settle()
    print(f"leader {leader.name} lost; the other led after {took_over:.1f} s:", result)
    assert took_over <= LEASE_DURATION + 10


def test_webhook_unavailable_refuses_elected_pods_only(
    rollout: Rollout, installation: Installation, kubectl: Kubectl, testbed: TestBed
):
    for agent in installation.agents[SOURCE]:
        installation.hold(agent)
    namespace = rollout.namespace
    elected = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "elected", "annotations": {PREFIX + "elect": ""}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    with pytest.raises(CommandError) as refused:
        kubectl.apply(SOURCE, elected, "-n", namespace)
    message = str(refused.value)
    assert f'failed calling webhook "{WEBHOOK}"' in message, message
    # Elsewhere, pods are created as if we were not there: not enabled, or never matched.
    kubectl(SOURCE, "create", "namespace", f"{namespace}-off")
    try:
        for where in (f"{namespace}-off", "admiralty", "kube-system"):
            body = {**elected, "metadata": {**elected["metadata"], "name": f"fine-{namespace}"}}
            kubectl.apply(SOURCE, body, "-n", where)
            pod = kubectl.json(SOURCE, "get", "pod", f"fine-{namespace}", "-n", where)
            assert pod["spec"]["schedulerName"] == "default-scheduler", where
            kubectl(SOURCE, "delete", "pod", f"fine-{namespace}", "-n", where, "--wait=false")
    finally:
        kubectl(SOURCE, "delete", "namespace", f"{namespace}-off", "--wait=false")

    # A rollout meanwhile creates nothing, and says why where users look.
    rollout.start()

    def failed_create() -> str:
        events = kubectl.json(
            SOURCE, "get", "events", "-n", namespace, "--field-selector", "reason=FailedCreate"
        )["items"]
        return next((e["message"] for e in events), "")

    wait_for(lambda: WEBHOOK in failed_create(), 60, what="FailedCreate naming the webhook")
    assert not pods(kubectl, SOURCE, namespace), "no pod escaped the webhook"
    print("while the webhook was down:", failed_create())
    for agent in installation.agents[SOURCE]:
        installation.release(agent)
    print("webhook back:", rollout.settle())


def test_a_target_deleted_while_it_hosts_proxy_pods(rollout: Rollout, kubectl: Kubectl):
    rollout.start()
    wait_bound(rollout, rollout.remote_node, 20)
    released = len(rollout.on(rollout.remote_node))
    kubectl(SOURCE, "delete", "target", "c2", "-n", rollout.namespace, "--wait=false")
    wait_for(
        lambda: not kubectl(SOURCE, "get", "node", rollout.remote_node, "--ignore-not-found"),
        60,
        what="cluster2's virtual node deleted",
    )
    result = rollout.settle(remote=False)
    assert set(result["placed"]) == {rollout.self_node}
    assert not rollout.delegates(TARGET), "its delegates were deleted with it"
    print(f"target deleted while hosting {released} proxy pods:", result)


def test_a_target_deleted_while_no_agent_leads(
    rollout: Rollout, installation: Installation, kubectl: Kubectl
):
    """Nobody sees the Target go: the next leader removes its virtual node and lets go of its
    proxy pods. Its delegates stay in that cluster (nothing says where it was any more): they
    are deleted by hand, as docs/operations.md says."""
    replicas = REPLICAS // 4
    rollout.start(replicas)
    wait_bound(rollout, rollout.remote_node, 5)
    wait_for(lambda: rollout.all_running(replicas), SETTLE, what="all Running")
    for agent in installation.agents[SOURCE]:
        installation.hold(agent)
    kubectl(SOURCE, "delete", "target", "c2", "-n", rollout.namespace, "--wait=false")
    for agent in installation.agents[SOURCE]:
        installation.release(agent)
    wait_for(
        lambda: not kubectl(SOURCE, "get", "node", rollout.remote_node, "--ignore-not-found"),
        60,
        what="the virtual node of the deleted Target removed",
    )
    wait_for(lambda: rollout.all_running(replicas), SETTLE, what="replaced in cluster1")
    assert set(Counter(p["spec"]["nodeName"] for p in rollout.proxies())) == {rollout.self_node}
    left = rollout.delegates(TARGET)
    assert left, "the deleted target's delegates are still there"
    kubectl(
        TARGET, "delete", "pods,configmaps,secrets,services", "-n", rollout.namespace,
        "-l", PARENT_UID, "--wait=false",
    )  # fmt: skip
    result = rollout.settle(replicas, remote=False)
    print(f"{len(left)} delegates left in cluster2, deleted by hand:", result)


def test_a_target_api_server_stopped_for_a_minute(rollout: Rollout, testbed: TestBed):
    rollout.start()
    wait_bound(rollout, rollout.remote_node, 20)
    target = testbed[TARGET]
    target.stop("kube-apiserver")
    stopped = time.monotonic()
    kept = {p["metadata"]["uid"] for p in rollout.on(rollout.remote_node)}
    try:
        wait_for(
            lambda: (
                rollout.kubectl(
                    SOURCE,
                    "get",
                    "node",
                    rollout.remote_node,
                    "-o",
                    'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
                )
                == "False"
            ),
            OUTAGE,
            what="cluster2's virtual node NotReady",
        )
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - stopped)))
        # Without a failover setting, proxy pods wait for their target: none is evicted.
        still = {p["metadata"]["uid"] for p in rollout.on(rollout.remote_node)}
        assert kept <= still, f"{len(kept - still)} proxy pods evicted from an away target"
    finally:
        restart_api_server(target, stopped=True)
    print("target API server stopped", OUTAGE, "s:", rollout.settle())


def test_a_target_away_past_its_failover_setting(
    rollout: Rollout, kubectl: Kubectl, testbed: TestBed
):
    failover = 20
    kubectl(
        SOURCE,
        "patch",
        "target",
        "c2",
        "-n",
        rollout.namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"failoverAfterSeconds": failover}}),
    )
    rollout.start()
    wait_bound(rollout, rollout.remote_node, 20)
    target = testbed[TARGET]
    target.stop("kube-apiserver")
    stopped = time.monotonic()
    try:
        wait_for(
            lambda: not rollout.on(rollout.remote_node),
            failover + 60,
            what="proxy pods released from the away target",
        )
        released_after = time.monotonic() - stopped
        assert released_after >= failover, "not before the failover setting"
        # Replaced on the target that is Ready, while the other is still away.
        wait_for(lambda: rollout.all_running(REPLICAS), SETTLE, what="replaced in cluster1")
        assert not rollout.on(rollout.remote_node)
        events = kubectl.json(
            SOURCE,
            "get",
            "events",
            "-n",
            rollout.namespace,
            "--field-selector",
            "reason=TargetFailover",
        )["items"]
        assert events, "each released pod says why"
        assert "failoverAfterSeconds" in events[0]["message"], events[0]["message"]
    finally:
        restart_api_server(target, stopped=True)
    # Back: the delegates of released proxy pods are orphans, deleted now.
    result = rollout.settle()
    assert set(result["placed"]) == {rollout.self_node}
    print(f"failover after {released_after:.1f} s:", result)


async def test_an_agent_started_with_its_api_server_keeps_its_cluster_name(
    installation: Installation, testbed: TestBed, kubectl: Kubectl
):
    """Delegates carry their source cluster's name (the uid of kube-system): an agent started
    while its API server is down or still warming up (RBAC refusing everyone for a moment) must
    wait for it rather than name the cluster otherwise."""
    expected = kubectl.json(TARGET, "get", "namespace", "kube-system")["metadata"]["uid"]
    target = testbed[TARGET]
    cluster = Cluster.from_kubeconfig(
        "identity", str(target.dir / "agent.kubeconfig"), TARGET, qps=50, burst=100
    )
    try:
        target.stop("kube-apiserver")
        name = asyncio.create_task(cluster_identity(cluster.client, retry=0.2))
        await asyncio.sleep(2)
        assert not name.done(), "it waits for its API server"
        target.start("kube-apiserver")  # from this thread: components die with their starter's
        await asyncio.to_thread(target.wait_settled)
        assert await asyncio.wait_for(name, 60) == expected
    finally:
        restart_api_server(target, stopped=not target.processes["kube-apiserver"].running)
        await cluster.stop()
